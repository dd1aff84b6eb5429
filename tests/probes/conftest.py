"""Fixtures shared by the probes tests: a tiny evaluated run, its arbitration-cell copy, a fitted tiny lens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from probes.fit import fit_lens
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec


def _rewrite(path: Path, fn) -> None:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("".join(json.dumps(fn(r), ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")


@pytest.fixture(scope="session")
def tiny_run(tiny_backend, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("rank") / "run"
    cfg = EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", formulations="reference", conditions="tool_wrong", limit=4),
        job=JobSettings(out=str(root), progress=False), generation=GenerationConfig(batch_size=4, max_new_tokens=12))
    evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    return root


@pytest.fixture(scope="session")
def arb_run(tiny_run, tmp_path_factory):
    """A copy of the tiny run edited so that every tool_wrong episode sits in the arbitration cell.

    Memory spans become the gold answers (as a correct closed-book answer would be); outcomes alternate between
    followed_tool and kept_memory, and one answer is made to occur in its prompt.
    """
    root = tmp_path_factory.mktemp("rank_arb") / "run"
    shutil.copytree(tiny_run, root)
    gold = {}

    def ep(r):
        gold[r["question_id"]] = r["gold_answer"]
        i = len(gold) - 1
        r.update(cell="arb", mem_absent=False, memory_correct=True, memory_span=r["gold_answer"],
                 outcome=["followed_tool", "kept_memory", "followed_tool", "neither"][i % 4])
        if i == 0:   # an answer that is written in the prompt itself
            r["memory_span"] = r["question"].split()[-1].strip("?")
        return r

    _rewrite(root / "episodes.jsonl", ep)

    def cb(r):
        r.update(mem_absent=False, memory_correct=True, memory_span=gold[r["question_id"]])
        return r

    _rewrite(root / "closed_book.jsonl", cb)
    return root


@pytest.fixture(scope="session")
def tiny_lens(tiny_backend, tmp_path_factory):
    path = tmp_path_factory.mktemp("lens") / "tiny.safetensors"
    fit_lens(tiny_backend.model, tiny_backend.tokenizer, path, limit=3, max_seq_len=40, skip_first=4)
    return path


def _read_lenses(parts, cap, kinds, artifact=None):
    """``kind -> site -> [B, d]`` through the lens registry (``artifact``: the jacobian lens's matrices)."""
    from probes.lenses import LensInputs, lens_class, read_all

    lenses = [lens_class(k)() for k in kinds]
    for lens in lenses:
        if artifact is not None:
            lens.artifact = artifact
    return read_all(lenses, LensInputs(parts, cap, cap.sites))


@pytest.fixture
def read_lenses():
    """The registered lenses read from one capture, as the rank table reads them."""
    return _read_lenses
