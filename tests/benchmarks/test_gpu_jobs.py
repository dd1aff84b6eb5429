"""``benchmarks/gpu_jobs.py`` without a GPU: its command lines are ones the CLI accepts, and its comparison of two
devices' outputs counts agreement and fails a stored stream beyond its bound (the device run itself is recorded
in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock
from memtoc.cli.parse import parse_config

REPO = Path(__file__).resolve().parents[2]
D = 8
SITES = (0, 2)


@pytest.fixture(scope="module")
def gpu_jobs():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_jobs

        yield gpu_jobs
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def test_every_planned_command_line_parses_as_the_cli_reads_it(gpu_jobs, tmp_path):
    steps = gpu_jobs.plan("default", tmp_path, ["cuda", "cpu"], 2, 30, 24)
    names = [(label, name) for label, _, name, _ in steps]
    assert names[:4] == [("0-cuda", "evaluate"), ("0-cuda", "evaluate_default_dtype"), ("0-cuda", "extract"),
                         ("0-cuda", "direction")]
    assert [n for label, n in names if label == "1-cpu"] == ["evaluate", "extract", "sweep", "rank_table", "patch"]
    twice = gpu_jobs.plan("default", tmp_path, ["cpu", "cpu"], 2, 30, 24)     # two runs on one device stay apart
    assert len({(label, name) for label, _, name, _ in twice}) == len(twice)
    for _, dev, name, argv in steps:
        command, cfg = parse_config(argv)
        spec = getattr(cfg, "model_spec", cfg)          # the model jobs' settings, nested or flat
        if name not in ("direction", "evaluate_default_dtype"):
            assert (spec.device, spec.dtype) == (dev, "float32"), name


def _store(path: Path, rows: list[tuple[str, int]], acts: dict[int, np.ndarray]) -> None:
    eids = [e for e, _ in rows]
    index = {"episode_id": eids, "question_id": [e.split("-")[0] for e in eids],
             "condition": ["tool_wrong"] * len(rows), "arm": ["tool_wrong"] * len(rows),
             "formulation": ["reference"] * len(rows), "position_kind": ["tool_span"] * len(rows),
             "token_index": [t for _, t in rows], "token_id": [7] * len(rows), "token_str": ["x"] * len(rows)}
    episodes = sorted({e for e in eids})
    meta = [{"episode_id": e, "n_rows": eids.count(e), "n_prompt_tokens": 10} for e in episodes]
    block = RowBlock(episodes=meta, index=index, acts={s: torch.from_numpy(a) for s, a in acts.items()})
    with ActivationWriter.open(path, identity={"m": 1}, provenance={"model_id": "m"}, sites=SITES, d_model=D,
                               storage_dtype="float32") as w:
        w.append(block)
        w.finish(planned=episodes)


def _device_outputs(folder: Path, responses: list[str], sweep: dict, rows, acts) -> None:
    (folder / "eval").mkdir(parents=True)
    (folder / "eval" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_id": f"e{i}", "response": r, "outcome": "kept_memory"}) + "\n"
        for i, r in enumerate(responses)))
    for sub, name in (("sweep", "sweep.json"), ("rank", "rank_table.json"), ("patch", "patch.json")):
        (folder / sub).mkdir()
        (folder / sub / name).write_text(json.dumps(sweep))
    _store(folder / "acts.h5", rows, acts)


@pytest.mark.parametrize("rel,ok", [(1e-4, True), (5e-3, False)])
def test_compare_counts_agreement_and_fails_a_stream_beyond_the_bound(gpu_jobs, tmp_path, rel, ok):
    rng = np.random.default_rng(0)
    rows = [("e0-1", 0), ("e0-1", 1), ("e1-1", 0), ("e1-1", 3)]
    ref = {s: rng.standard_normal((4, D)).astype(np.float32) for s in SITES}
    order = [2, 0, 3, 1]                                 # the other device stored its rows in another order
    other = {s: a[order].copy() for s, a in ref.items()}
    bump = rng.standard_normal(D).astype(np.float32)
    bump *= rel * np.linalg.norm(ref[2][3]) / np.linalg.norm(bump)
    other[2][order.index(3)] += bump                      # one row of site 2 off by `rel` of its norm
    cuda, cpu = gpu_jobs.folders(tmp_path, ["cuda", "cpu"])
    _device_outputs(cpu, ["Paris", "Rome"], {"a": [1.0, 2.0, float("nan")], "b": 3}, rows, ref)
    _device_outputs(cuda, ["Paris", "Roma"], {"a": [1.0, 2.5, float("nan")], "c": 3}, [rows[i] for i in order],
                    other)
    agreement, failed = gpu_jobs.compare(tmp_path, ["cuda", "cpu"])
    got = agreement["cuda vs cpu"]
    assert got["evaluate"] == {"episodes": "2/2", "responses_equal": "1/2", "outcomes_equal": "2/2"}
    assert got["sweep"] == {"cells": 2, "equal": 1, "max_abs_diff": 0.5, "only_in_one": 2}
    sites = got["extract"]["sites"]
    assert sites["site_0"]["max_rel"] == 0.0 and sites["site_2"]["rows"] == 4
    want = np.linalg.norm(bump.astype(np.float64)) / np.linalg.norm(ref[2][3].astype(np.float64))
    assert sites["site_2"]["max_rel"] == pytest.approx(want, rel=1e-3)
    assert (failed == []) is ok
    if not ok:
        assert len(failed) == 1 and failed[0].startswith("cuda extract: site_2")
