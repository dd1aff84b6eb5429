"""Cross-fitting by chain: the demo folds split cleanly; an overlapping assignment is refused with the ids."""

from __future__ import annotations

import pytest

from memtoc.bench.benchmark import Benchmark, load_benchmark
from memtoc.core.errors import MemtocError
from memtoc.jobs.finetune.folds import assert_disjoint, crossfit_splits
from memtoc.bench.questions import Question


def _q(instance: int, hop: int) -> Question:
    return Question(id=f"{instance}.{hop}", instance_id=instance, hop_idx=hop, qkey=f"q {instance} {hop}",
                    question=f"Question {instance} {hop}?", gold_answer=f"gold {instance}", near=f"near {instance}")


def test_demo_folds_give_two_held_out_directions_with_zero_overlap():
    bench = load_benchmark("demo")
    qs = bench.select("all", 12)
    splits = crossfit_splits(bench, qs)
    assert [s.name for s in splits] == ["trainA-evalB", "trainB-evalA"]
    a, b = splits
    assert set(a.train_ids) == set(b.eval_ids) and set(a.eval_ids) == set(b.train_ids)
    assert set(a.train_ids) | set(a.eval_ids) == {q.id for q in qs}
    for s in splits:
        assert not set(s.train_ids) & set(s.eval_ids)
        assert not {q.instance_id for q in s.train} & {q.instance_id for q in s.eval}
        assert all(bench.folds[q.id] == s.train_fold for q in s.train)
        assert all(bench.folds[q.id] == s.eval_fold for q in s.eval)
    # the whole demo set is covered exactly once by the evaluation sides
    full = crossfit_splits(bench, bench.questions)
    assert sorted(full[0].eval_ids + full[1].eval_ids) == sorted(q.id for q in bench.questions)


def test_a_chain_split_across_folds_is_refused_naming_the_chain():
    qs = [_q(1, 0), _q(1, 1), _q(2, 0), _q(3, 0)]
    bench = Benchmark(name="toy", questions=qs, folds={"1.0": "A", "1.1": "B", "2.0": "A", "3.0": "B"})
    with pytest.raises(MemtocError, match=r"chain\(s\) \(instance_id\).*: 1$"):
        crossfit_splits(bench, qs)
    ok = Benchmark(name="toy", questions=qs, folds={"1.0": "A", "1.1": "A", "2.0": "B", "3.0": "B"})
    splits = crossfit_splits(ok, qs)
    assert splits[0].train_ids == ["1.0", "1.1"]


def test_question_overlap_missing_folds_and_empty_folds_are_refused():
    with pytest.raises(MemtocError, match=r"question\(s\) both trained on and evaluated: 2.0"):
        assert_disjoint([_q(1, 0), _q(2, 0)], [_q(2, 0), _q(3, 0)])
    qs = [_q(1, 0), _q(2, 0)]
    with pytest.raises(MemtocError, match="no fold: 2.0"):
        crossfit_splits(Benchmark(name="toy", questions=qs, folds={"1.0": "A", "9.0": "B"}), qs)
    with pytest.raises(MemtocError, match="fold.*B have no questions"):
        crossfit_splits(Benchmark(name="toy", questions=qs, folds={"1.0": "A", "2.0": "A", "9.0": "B"}), qs)
    with pytest.raises(MemtocError, match="no cross-fitting folds"):
        crossfit_splits(Benchmark(name="toy", questions=qs), qs)
