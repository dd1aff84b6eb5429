"""``memtoc finetune crossfit`` end to end on the tiny model, then ``finetune table`` with prompting and steering."""

from __future__ import annotations

import json

import pytest
import torch

from memtoc.backends.hf import HFBackend
from memtoc.bench.benchmark import load_benchmark
from memtoc.cli import main
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.adapter import adapter_sha256, read_adapter_meta
from memtoc.jobs.finetune.compare import restrict_to_common_cells
from memtoc.jobs.finetune.crossfit import CrossfitConfig, run_crossfit
from memtoc.jobs.finetune.train import TrainConfig
from memtoc.runs.runstore import iter_jsonl
from memtoc.core.config import EpisodeSelection, GenerationConfig, Intervention, JobSettings, ModelSpec

torch.set_num_threads(1)
CONDITIONS = "tool_right,tool_wrong,tool_error,no_conflict"


@pytest.fixture(scope="module")
def crossfit_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("crossfit")
    backend = HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")
    cfg = CrossfitConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", limit=4, conditions=CONDITIONS),
        job=JobSettings(out=str(out), progress=False), objective="both",
        intervention=Intervention(prompt_intervention="source-priority"), train=TrainConfig(lr=5e-2, batch_size=2),
        generation=GenerationConfig(batch_size=8, max_new_tokens=8))
    res = run_crossfit(cfg, backend=backend, log=lambda s: None)
    return out, res


def test_both_folds_train_and_evaluate_held_out(crossfit_dir):
    out, res = crossfit_dir
    bench = load_benchmark("demo")
    qids = [q.id for q in bench.select("all", 4)]
    m = json.loads((out / "crossfit.json").read_text())
    assert [s["name"] for s in m["splits"]] == ["trainA-evalB", "trainB-evalA"]
    assert sorted(m["adapters"]) == ["dpo-trainA", "dpo-trainB", "sft-trainA", "sft-trainB"]
    for obj in ("sft", "dpo"):
        for s in m["splits"]:
            adir = out / "adapters" / f"{obj}-train{s['train_fold']}"
            meta = read_adapter_meta(adir)
            assert meta["objective"] == obj and meta["adapter_sha256"] == adapter_sha256(adir)
            assert set(meta["train_question_ids"]) == set(s["train_question_ids"])
            assert all(bench.folds[q] == s["train_fold"] for q in meta["train_question_ids"])
            assert meta["data"]["sha256"] == m["data"][s["train_fold"]]["sha256"]
            run = out / "runs" / f"{obj}-{s['name']}"
            info = json.loads((run / "run.json").read_text())
            assert info["identity"]["adapter_sha256"] == meta["adapter_sha256"]
            evaluated = {r["question_id"] for r in iter_jsonl(run / "episodes.jsonl")}
            assert evaluated == set(s["eval_question_ids"])
            assert not evaluated & set(meta["train_question_ids"])       # held out
    # matched arms: same settings and data but the objective
    sft, dpo = read_adapter_meta(out / "adapters" / "sft-trainA"), read_adapter_meta(out / "adapters" / "dpo-trainA")
    assert {**sft["train_config"], "objective": None} == {**dpo["train_config"], "objective": None}
    assert sft["data"]["sha256"] == dpo["data"]["sha256"]
    # merged arms: every question exactly once per condition, each answered by the adapter that did not see it
    for obj in ("sft", "dpo"):
        recs = list(iter_jsonl(out / "arms" / obj / "episodes.jsonl"))
        assert sorted((r["question_id"], r["arm"]) for r in recs) == sorted(
            (q, a) for q in qids for a in CONDITIONS.split(","))
        cb = list(iter_jsonl(out / "arms" / obj / "closed_book.jsonl"))
        assert sorted(r["question_id"] for r in cb) == sorted(qids)
    base = list(iter_jsonl(out / "runs" / "base" / "episodes.jsonl"))
    assert {r["question_id"] for r in base} == set(qids)
    assert "adapter_sha256" not in json.loads((out / "runs" / "base" / "run.json").read_text())["identity"]


def test_comparisons_report_drift_and_verdict_and_the_table_renders(crossfit_dir):
    out, res = crossfit_dir
    for obj in ("sft", "dpo"):
        comp = json.loads((out / "compare" / f"{obj}.json").read_text())
        d = comp["support_drift"]
        assert d["n_shared"] == 4 and d["n_same_cell"] + d["n_changed_cell"] == 4
        assert set(comp["comparisons"]) >= {"retention", "correct_tool_following"}
        assert "reason" in comp["verdict"] and "metric_support_drift" in comp
        base = list(iter_jsonl(out / "runs" / "base" / "episodes.jsonl"))
        arm = list(iter_jsonl(out / "arms" / obj / "episodes.jsonl"))
        rb, ra, drift = restrict_to_common_cells(base, arm)
        assert drift.n_changed_cell == d["n_changed_cell"]
        assert {(r["question_id"], r["arm"]): r["cell"] for r in rb} == \
            {(r["question_id"], r["arm"]): r["cell"] for r in ra}
    md = (out / "table.md").read_text()
    assert md == res.table_markdown
    for label in ("prompting (source-priority)", "LoRA SFT (cross-fitted)", "LoRA DPO (cross-fitted)",
                  "units kept / cell drift", "Ret.", "Tool"):
        assert label in md
    table = json.loads((out / "table.json").read_text())
    assert [a["kind"] for a in table["arms"]] == ["prompt", "sft", "dpo"] and table["n_questions"] == 4


def test_restriction_drops_units_whose_cell_changed():
    def rec(q, arm, cell):
        return {"question_id": q, "formulation": "reference", "arm": arm, "condition": arm, "cell": cell}

    base = [rec("1", "tool_wrong", "arb"), rec("1", "tool_right", "tool_gold"),
            rec("2", "tool_wrong", "arb"), rec("2", "tool_right", "tool_gold")]
    treated = [rec("1", "tool_wrong", "arb"), rec("1", "tool_right", "tool_gold"),
               rec("2", "tool_wrong", "both_wrong"), rec("2", "tool_right", "agree")]
    rb, rt, drift = restrict_to_common_cells(base, treated)
    assert {r["question_id"] for r in rb} == {r["question_id"] for r in rt} == {"1"}
    assert (drift.n_shared, drift.n_same_cell, drift.n_changed_cell) == (2, 1, 1)
    assert drift.transitions == {"arb->both_wrong": 1}


def test_table_cli_with_prompting_and_best_steering(crossfit_dir, tiny_backend, tiny_model_dir, tmp_path, capsys):
    from steering import DirectionEdit
    from steering.kinds.direction import save_direction_edit

    out, _ = crossfit_dir
    g = torch.Generator().manual_seed(1)
    v = torch.randn(32, generator=g)
    steer_runs = []
    for strength in (2.0, 8.0):
        edit = DirectionEdit.build(name=f"toward-memory-{strength:g}", layers=[1], vectors={1: v / v.norm()},
                                   scale={1: 3.0}, positions="from_tool_return", strength=strength, toward="tool")
        spec = save_direction_edit(tmp_path / f"edit{strength:g}.json", edit)
        run = tmp_path / f"steer{strength:g}"
        evaluate(EvaluationConfig(
            model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
            selection=EpisodeSelection(benchmark="demo", conditions=CONDITIONS, limit=4),
            job=JobSettings(out=str(run), progress=False), generation=GenerationConfig(batch_size=8, max_new_tokens=8),
            intervention=Intervention(edit=str(spec))), backend=tiny_backend, log=lambda s: None)
        steer_runs.append(run)
    rc = main(["finetune", "table", "--base", str(out / "runs" / "base"), "--sft", str(out / "arms" / "sft"),
               "--dpo", str(out / "arms" / "dpo"), "--prompt", str(out / "runs" / "prompt-source-priority"),
               "--steer", str(steer_runs[0]), "--steer", str(steer_runs[1]), "--out", str(tmp_path / "side")])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| arm | units kept / cell drift |" in printed and "best of 2 edits" in printed
    doc = json.loads((tmp_path / "side.json").read_text())
    assert [a["kind"] for a in doc["arms"]] == ["prompt", "sft", "dpo", "steer"]
    steer = doc["arms"][3]
    assert steer["support_drift"]["n_changed_cell"] == 0       # steering leaves the closed-book pass untreated
    assert (tmp_path / "side.md").read_text().startswith("Paired changes vs base on the same 4 questions")


def test_rerun_resumes_and_uses_only_the_planned_records(crossfit_dir, tiny_model_dir, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(crossfit_dir[0], out)     # a copy: the module's directory stays as the other tests expect
    adapters = {p.name: (p / "adapter_model.safetensors").stat().st_mtime_ns for p in (out / "adapters").iterdir()}
    backend = HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")
    cfg = CrossfitConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", limit=4, conditions="tool_right,tool_wrong"),
        job=JobSettings(out=str(out), progress=False), objective="sft", train=TrainConfig(lr=5e-2, batch_size=2),
        generation=GenerationConfig(batch_size=8, max_new_tokens=8))
    logs: list[str] = []
    run_crossfit(cfg, backend=backend, log=logs.append)
    assert sum("nothing left to run" in s for s in logs) == 3             # base and both sft halves resumed
    assert sum("already trained" in s for s in logs) == 2
    assert {p.name: (p / "adapter_model.safetensors").stat().st_mtime_ns
            for p in (out / "adapters").iterdir()} == adapters
    # the run directories still hold tool_error / no_conflict records; the merged arm and comparison do not
    assert {r["arm"] for r in iter_jsonl(out / "runs" / "base" / "episodes.jsonl")} == set(CONDITIONS.split(","))
    assert {r["arm"] for r in iter_jsonl(out / "arms" / "sft" / "episodes.jsonl")} == {"tool_right", "tool_wrong"}
    comp = json.loads((out / "compare" / "sft.json").read_text())["comparisons"]
    assert comp["no_conflict_accuracy"]["support_a"] == 0 and comp["tool_error_abstention"]["support_a"] == 0
    assert [a["kind"] for a in json.loads((out / "table.json").read_text())["arms"]] == ["sft"]
