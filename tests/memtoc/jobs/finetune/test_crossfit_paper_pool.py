"""Table 1's cross-fitting as the paper ran it (App. B): folds cut on the 575-question construction pool, two
pairs per question on the Reference formulation, evaluation restricted to the 542-question analysis set.

Read on the real release mapping (../shared/memtoc): the paper's per-fold numbers are 287 questions from 154
chains (574 pairs) and 288 from 155 (576 pairs), and the two held-out sets together cover all 575 questions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import MemtocError
from memtoc.jobs.finetune.crossfit import CrossfitConfig, fold_pool_splits
from memtoc.jobs.finetune.data import build_pairs
from memtoc.bench.episodes import parse_formulations

RELEASE = Path(__file__).resolve().parents[3].parent / "shared" / "memtoc"
needs_release = pytest.mark.skipif(not (RELEASE / "mapping_575.jsonl").is_file(), reason="release data absent")


@needs_release
def test_pair_counts_per_fold_are_the_papers_574_and_576():
    bench = load_benchmark(str(RELEASE))
    cfg = CrossfitConfig()                       # the defaults are the paper's construction
    assert (cfg.fold_pool, cfg.train_formulations) == ("all", "reference")
    questions, splits = fold_pool_splits(bench, cfg.fold_pool, "analysis")
    got = {}
    for s in splits:
        pairs = build_pairs(s.train, lambda p: p, formulations=parse_formulations(cfg.train_formulations),
                            frame=bench.default_frame)
        got[s.train_fold] = (len(s.train), len({q.instance_id for q in s.train}), len(pairs))
        assert {p.condition for p in pairs} == {"tool_wrong", "tool_right"}
        # every held-out question is in the analysis set, and none of its chains was trained on
        assert {q.id for q in s.eval} <= {q.id for q in bench.select("analysis")}
        assert not {q.instance_id for q in s.eval} & {q.instance_id for q in s.train}
    assert got == {"A": (287, 154, 574), "B": (288, 155, 576)}
    assert len(questions) == 542
    # the 33 excluded questions are trained on (present in the pool) but never evaluated
    excluded = {q.id for q in bench.select("all")} - {q.id for q in bench.select("analysis")}
    assert len(excluded) == 33
    assert excluded <= {q.id for s in splits for q in s.train}
    assert not excluded & {q.id for s in splits for q in s.eval}


@needs_release
def test_the_older_analysis_only_pool_gives_fewer_pairs():
    bench = load_benchmark(str(RELEASE))
    _, splits = fold_pool_splits(bench, "analysis", "analysis")
    n = {s.train_fold: len(build_pairs(s.train, lambda p: p, frame=bench.default_frame)) for s in splits}
    assert n == {"A": 536, "B": 548}


def test_a_bad_pool_or_set_is_one_line():
    bench = load_benchmark("demo")
    with pytest.raises(MemtocError, match="--fold-pool must be all or analysis"):
        fold_pool_splits(bench, "fold-A", "all")
    with pytest.raises(MemtocError, match="outside the folds"):
        fold_pool_splits(bench, "analysis", "all")
