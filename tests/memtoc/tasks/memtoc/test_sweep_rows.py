"""A sweep elicits the untreated closed book once and runs its strengths as rows of one batch: every strength's
records equal an evaluation of that strength alone, and the closed-book prompts are generated once per sweep."""

from __future__ import annotations

import json

import pytest
import torch

from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.values import build_config
from memtoc.runs.runstore import iter_jsonl
from steering import DirectionEdit, SAEClampEdit
from steering.kinds.function import FunctionEdit
from memtoc.jobs.sweep import run_sweep
from memtoc.tasks.memtoc.sweep import SweepConfig

STRENGTHS = [0.0, 3.0, 12.0]
SWEEP = dict(benchmark="demo", formulations="reference", conditions="tool_wrong,tool_right,no_conflict", limit=3,
             batch_size=4, max_new_tokens=10, device="cpu", dtype="float32", progress=False)


def _unit(d, seed):
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def double(site, hidden, positions):
    return hidden * 2.0


def _edit(kind, positions="from_tool_return", **kw):
    if kind == "direction":
        return DirectionEdit.build(name="rows", layers=[1, 2], vectors={1: _unit(32, 1), 2: _unit(32, 2)},
                                   scale={1: 3.0, 2: 3.0}, positions=positions, strength=1.0, toward="memory", **kw)
    if kind == "sae_clamp":
        from sae_lens import StandardSAE, StandardSAEConfig

        torch.manual_seed(0)
        sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=64))
        with torch.no_grad():
            for p in sae.parameters():
                p.normal_(0, 0.3)
        spec = {"schema_version": "memtoc-edit-v1", "name": "rows-clamp", "kind": "sae_clamp", "layers": [2],
                "positions": positions, "strength": 1.0, "sae": {"2": {"path": "in-memory"}},
                "features": {"2": {"remove": [0, 1, 2], "remove_targets": [1.0, 1.0, 1.0], "add": [3, 4, 5],
                                   "add_targets": [2.0, 3.0, 4.0]}}, "steer_toward": "memory", "force": True, **kw}
        return SAEClampEdit(spec, saes={2: sae.eval()})
    return FunctionEdit.build(double, layers=[1], positions=positions, toward="memory", **kw)


class Counting:
    """The backend, counting the prompts of every generate call."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate(self, prompts, config, *, edit=None):
        self.calls.append((list(prompts), edit))
        return self.backend.generate(prompts, config, edit=edit)


def _sweep(backend, model_dir, out, edit):
    from memtoc.backends.base import InspectableBackend

    InspectableBackend.register(Counting)
    cfg = build_config(SweepConfig, {**SWEEP, "model": str(model_dir), "out": str(out), "direction": "memory",
                                     "strengths": ",".join(f"{s:g}" for s in STRENGTHS), "n_boot": 50, "plot": False})
    counting = Counting(backend)
    res = run_sweep(cfg, backend=counting, edit=edit, log=lambda s: None)
    return res, counting


def _records(run_dir, name="episodes.jsonl", drop=("closed_book_source",)):
    return sorted(({k: v for k, v in r.items() if k not in drop} for r in iter_jsonl(run_dir / name)),
                  key=lambda r: r.get("episode_id") or r["key"])


@pytest.mark.parametrize("kind", ["direction", "sae_clamp", "function"])
def test_sweep_records_equal_each_strength_alone_with_one_closed_book_pass(tiny_backend, tiny_model_dir, tmp_path,
                                                                           kind):
    edit = _edit(kind)
    res, counting = _sweep(tiny_backend, tiny_model_dir, tmp_path / "sweep", edit)
    closed_book_prompts = {r["prompt"] for r in iter_jsonl(res.run_dirs[0.0] / "closed_book.jsonl")}
    sent = [p for prompts, _ in counting.calls for p in prompts if p in closed_book_prompts]
    assert sorted(sent) == sorted(closed_book_prompts)          # one closed-book pass for the whole sweep
    assert all(edit_ is None for prompts, edit_ in counting.calls if set(prompts) & closed_book_prompts)
    tool_calls = [c for c in counting.calls if not set(c[0]) & closed_book_prompts]
    n_episodes = len(_records(res.run_dirs[0.0]))
    assert len(tool_calls) == -(-n_episodes // SWEEP["batch_size"])   # strengths as rows: each batch once,
    for prompts, _ in tool_calls:                                         # every strength in it
        n = len(prompts) // len(STRENGTHS)
        assert prompts == prompts[:n] * len(STRENGTHS)
    source = str(res.run_dirs[0.0].resolve())
    for s in STRENGTHS:
        run = res.run_dirs[s]
        ident = json.loads((run / "run.json").read_text())["identity"]
        if s == 0.0:
            assert "closed_book_source" not in ident
        else:                   # the shared closed book is in every other strength's identity
            assert ident["closed_book_source"]["path"] == source
            assert {r["closed_book_source"] for r in iter_jsonl(run / "closed_book.jsonl")} == {source}
        # the same records as an evaluation of this strength alone (its own closed-book pass, no rows)
        alone = tmp_path / f"alone_{s:g}"
        evaluate(build_config(EvaluationConfig, {**SWEEP, "model": str(tiny_model_dir), "out": str(alone)}),
                 backend=tiny_backend, edit=edit.steer("memory", s), log=lambda m: None)
        assert _records(run) == _records(alone), s
        assert _records(run, "closed_book.jsonl") == _records(alone, "closed_book.jsonl")
    assert _records(res.run_dirs[12.0]) != _records(res.run_dirs[0.0])     # the edit does something


def test_an_edit_on_the_closed_book_keeps_one_closed_book_per_strength(tiny_backend, tiny_model_dir, tmp_path):
    edit = _edit("direction", positions="last_input", apply_to_closed_book=True)
    res, counting = _sweep(tiny_backend, tiny_model_dir, tmp_path / "sweep", edit)
    for s in STRENGTHS:
        ident = json.loads((res.run_dirs[s] / "run.json").read_text())["identity"]
        assert "closed_book_source" not in ident
    cb = {r["prompt"] for r in iter_jsonl(res.run_dirs[0.0] / "closed_book.jsonl")}
    sent = [p for prompts, _ in counting.calls for p in prompts if p in cb]
    assert len(sent) == len(STRENGTHS) * len(cb)


def test_a_resumed_sweep_runs_only_what_is_missing(tiny_backend, tiny_model_dir, tmp_path):
    edit = _edit("direction")
    first, _ = _sweep(tiny_backend, tiny_model_dir, tmp_path / "sweep", edit)
    again, counting = _sweep(tiny_backend, tiny_model_dir, tmp_path / "sweep", edit)
    assert counting.calls == []
    assert [r["strength"] for r in again.rows] == STRENGTHS
