"""The paper recipes (``experiments/paper/*.toml``): each parses and validates, targets the paper's analysis set in
full mode, and runs end to end under ``--quick`` on the tiny model, with the tables it exists for in its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.recipes.experiment import load_recipe, validate_recipe

REPO = Path(__file__).resolve().parents[3]
PAPER = REPO / "experiments" / "paper"
RECIPES = {p.stem: p for p in sorted(PAPER.glob("*.toml"))}


def test_one_recipe_per_paper_table_and_each_validates():
    assert set(RECIPES) == {"table4_baseline_arms", "table5_prompting_ladder", "table1_finetuning", "controls",
                            "protocol_ablation_switch"}
    readme = (PAPER / "README.md").read_text(encoding="utf-8")
    for name, path in RECIPES.items():
        recipe = load_recipe(path)
        assert recipe.name == name and recipe.description
        assert validate_recipe(recipe) == []          # every step's subcommand is registered here
        # full mode: the paper's 542-question analysis set of the release; --quick: the packaged demo set
        assert recipe.defaults["question_set"] == "analysis" and recipe.defaults["model"] == "default"
        assert recipe.quick["benchmark"] == "demo" and recipe.quick["question_set"] == "all"
        assert any(st.command == ["study"] for st in recipe.steps), name
        assert f"experiments/paper/{name}.toml" in readme, f"{name} is not documented in README.md"


def _run(name: str, tmp_path: Path, tiny_model_dir: Path, *extra: str) -> tuple[Path, dict]:
    out = tmp_path / name
    argv = ["run-experiment", str(RECIPES[name]), "--quick", "--model", str(tiny_model_dir), "--set",
            "max_new_tokens=6", "--set", "n_boot=20", "--set", "n_perm=200", *extra, "--out", str(out)]
    assert main(argv) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and all(s["status"] == "ok" for s in state["steps"]), state["steps"]
    return out, json.loads((out / "study" / "study.json").read_text())


def test_controls_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("controls", tmp_path, tiny_model_dir, "--set", "limit=2")
    controls = {r["control"] for r in study["tables"]["controls"]}
    assert controls == {"noop_tool", "tool_error_timeout", "tool_error_permission"}
    recs = [json.loads(line) for line in (out / "runs" / "standard" / "episodes.jsonl").read_text().splitlines()]
    assert {r["condition"] for r in recs} == {"tool_error", "no_tool", "noop_tool", "tool_error_timeout",
                                              "tool_error_permission"}
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Control arms (control - reference)" in md and "Err. timeout" in md and "Noop acc." in md


def test_protocol_ablation_and_switch_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("protocol_ablation_switch", tmp_path, tiny_model_dir, "--set", "limit=2")
    arms = {r["arm"] for r in study["tables"]["paired"]}
    assert arms == {"no-protocol-sentence", "source-priority", "switch-oracle", "switch-observable"}
    info = json.loads((out / "runs" / "no-protocol-sentence" / "run.json").read_text())
    assert info["identity"]["prompt_intervention"] == "no-protocol-sentence"
    ep = json.loads((out / "runs" / "no-protocol-sentence" / "episodes.jsonl").read_text().splitlines()[0])
    assert "cannot be called again" not in ep["prompt"]
    for gate in ("oracle", "observable"):
        sw = json.loads((out / "runs" / f"switch-{gate}" / "run.json").read_text())
        assert sw["identity"]["prompt_intervention"] == f"switch:{gate}:source-priority"
        summary = json.loads((out / "runs" / f"switch-{gate}" / "summary.json").read_text())
        assert {"switch_false_fire_agree", "switch_fire_conflict", "retention"} <= set(summary["metrics"]["metrics"])
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Run runs/switch-oracle" in md and "Asymmetric criterion" in md


def test_table5_prompting_ladder_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("table5_prompting_ladder", tmp_path, tiny_model_dir, "--set", "limit=2")
    slices = {r["slice"] for r in study["tables"]["criterion"]}
    assert slices == {"reference", "paraphrase_a", "paraphrase_b", "pooled"}
    assert set(study["families"]) == {"model:" + study["runs"][0]["model_name"]}


def test_table4_baseline_arms_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("table4_baseline_arms", tmp_path, tiny_model_dir, "--set", "limit=2")
    assert {r["slice"] for r in study["tables"]["criterion"]} == {"reference", "pooled"}
    assert {r["arm"] for r in study["tables"]["paired"]} == {"warn", "source-priority", "abstain-and-flag"}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_table1_finetuning_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("table1_finetuning", tmp_path, tiny_model_dir, "--set", "limit=4")
    assert {r["arm"] for r in study["tables"]["paired"]} == {"sft", "dpo"}
    assert len(study["families"]) == 1          # model x objective: one family of both contrasts
    assert (out / "crossfit" / "crossfit.json").exists()
