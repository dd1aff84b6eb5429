"""Sweeps end to end on the tiny model; strength 0 reproduces the untreated evaluation record for record."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.runs.runstore import iter_jsonl
from steering import DirectionEdit
from steering.kinds.direction import save_direction_edit
from memtoc.tasks.memtoc.sweep import flip_stats, is_degenerate
from memtoc.tasks.sweep_format import parse_strengths


def _unit(d, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def _eval_cfg(model_dir, out, **kw):
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right,tool_error", limit=3, batch_size=4, max_new_tokens=10,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def _responses(run_dir):
    return {r["episode_id"]: r["response"] for r in iter_jsonl(run_dir / "episodes.jsonl")}


def test_sweep_end_to_end_and_strength_zero_is_the_untreated_run(tiny_backend, tiny_model_dir, tmp_path, capsys):
    edit = DirectionEdit.build(name="sweep-test", layers=[1, 2], vectors={1: _unit(32, 1), 2: _unit(32, 2)},
                               scale={1: 3.0, 2: 3.0}, positions="from_tool_return", strength=1.0, toward="tool")
    spec = save_direction_edit(tmp_path / "edit.json", edit)
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--edit", str(spec),
               "--strengths", "0,8", "--direction", "memory", "--benchmark", "demo", "--conditions",
               "tool_wrong,tool_right,tool_error", "--limit", "3", "--batch-size", "4", "--max-new-tokens", "10",
               "--n-boot", "200", "--no-progress", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| strength |" in printed and "flip_to_memory" in printed
    for name in ("sweep.json", "sweep.csv", "sweep.md", "sweep.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for s in ("strength_0", "strength_8"):
        info = json.loads((out / s / "run.json").read_text())
        assert info["status"] == "complete"
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["strength"] for r in doc["rows"]] == [0.0, 8.0]
    # --direction memory on an edit that pushes toward the tool: the spec strength is negated
    assert [r["spec_strength"] for r in doc["rows"]] == [0.0, -8.0]
    assert json.loads((out / "strength_8" / "run.json").read_text())["edit"]["strength"] == -8.0
    row0 = doc["rows"][0]
    assert row0["flips"]["outcome_changed"] == 0 and row0["paired_vs_0"]["retention"]["delta"] in (0.0, None)
    with (out / "sweep.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["strength"] for r in table] == ["0.0", "8.0"] and "flip_to_memory_value" in table[0]
    # strength 0 (hooks installed, adding nothing) == an evaluation without any edit, record for record
    plain = _eval_cfg(tiny_model_dir, tmp_path / "plain")
    evaluate(plain, backend=tiny_backend, log=lambda s: None)
    base = _responses(tmp_path / "plain")
    assert len(base) == 9 and _responses(out / "strength_0") == base
    assert _responses(out / "strength_8") != base                   # the edit does something at strength 8
    # ... and through evaluate(cfg.edit = spec file) with strength 0
    zero = save_direction_edit(tmp_path / "zero.json", edit.with_strength(0.0))
    evaluate(_eval_cfg(tiny_model_dir, tmp_path / "zero", edit=str(zero)), backend=tiny_backend, log=lambda s: None)
    assert _responses(tmp_path / "zero") == base
    recs = list(iter_jsonl(tmp_path / "zero" / "episodes.jsonl"))
    assert {r["edit"] for r in recs} == {"sweep-test"}


def test_flip_stats_pairs_by_episode_on_the_relevant_cell():
    def rec(eid, outcome, cell="arb", cond="tool_wrong", q="q"):
        return {"episode_id": eid, "outcome": outcome, "cell": cell, "condition": cond, "question_id": q + eid,
                "divergence_bucket": None, "formulation": "reference", "trivial_hop": False}
    base = [rec("1", "followed_tool"), rec("2", "kept_memory"), rec("3", "neither"), rec("4", "followed_tool"),
            rec("5", "followed_tool", cell="agree"), rec("6", "followed_tool", cond="tool_right", cell="tool_gold")]
    treated = [rec("1", "kept_memory"), rec("2", "followed_tool"), rec("3", "kept_memory"), rec("4", "followed_tool"),
               rec("5", "kept_memory", cell="agree"), rec("6", "kept_memory", cond="tool_right", cell="tool_gold")]
    st = flip_stats(base, treated, n_boot=50)
    assert st["n"] == 4
    assert st["flip_to_memory"]["k"] == 2 and st["flip_to_memory"]["value"] == 0.5
    assert st["flip_to_tool"]["k"] == 1
    assert st["followed_tool_to_kept_memory"] == 1 and st["kept_memory_to_followed_tool"] == 1
    assert st["outcome_changed"] == 3


def test_degenerate_output_definition():
    assert is_degenerate("") and is_degenerate("   \n")
    assert is_degenerate("the the the the the the the the")
    assert is_degenerate("FINAL: a b c a b c a b c a b c")
    assert is_degenerate("aaaaaaaaaaaaaaaaaaaaaaaa")
    assert not is_degenerate("The play was written by William Shakespeare.\nFINAL: William Shakespeare\n")
    assert not is_degenerate("FINAL: 1945")
    assert parse_strengths("0, 1,2.5,1") == [0.0, 1.0, 2.5]
    with pytest.raises(Exception, match="strength"):
        parse_strengths("1,x")
