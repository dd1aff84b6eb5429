"""Recipes for the paper analyses no recipe ran before (issue 38): App. G's tool-choice protocols (greedy, then
T = 0.7 on three seeds), the permissive-elicitation sensitivity (§4.2 / App. D), and the seed robustness of App. E
(family T3). Each validates; the first two run end to end under --quick on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

from memtoc.cli import main
from memtoc.cli.recipes import validate_recipe
from memtoc.recipes.experiment import load_recipe

REPO = Path(__file__).resolve().parents[3]
ANALYSES = REPO / "experiments" / "analyses"


def test_analysis_recipes_validate_and_state_the_papers_settings():
    names = {p.stem for p in ANALYSES.glob("*.toml")}
    assert {"app_g_tool_choice", "permissive_sensitivity", "seed_robustness"} <= names
    for path in ANALYSES.glob("*.toml"):
        assert validate_recipe(load_recipe(path)) == [], path.name
        assert "paper silent; ours" in path.read_text(encoding="utf-8").lower(), path.name
    g = {st.name: st for st in load_recipe(ANALYSES / "app_g_tool_choice.toml").steps}
    assert set(g["greedy"].args["tool_choice"].split(",")) == {"guided", "auto", "two-stage"}
    assert (g["sampled"].args["temperature"], g["sampled"].args["repetitions"]) == (0.7, 3)
    seeds = load_recipe(ANALYSES / "seed_robustness.toml")
    assert sorted(st.args["train_seed"] for st in seeds.steps if st.command == ["finetune", "crossfit"]) == \
        [42, 20260719]
    assert [st.args["holm_family"] for st in seeds.steps if st.command == ["study"]] == ["T3"]


def _quick(name: str, tmp_path: Path, tiny_model_dir: Path) -> Path:
    out = tmp_path / name
    assert main(["run-experiment", str(ANALYSES / f"{name}.toml"), "--quick", "--model", str(tiny_model_dir),
                 "--set", "max_new_tokens=6", "--set", "limit=2", "--no-report", "--out", str(out)]) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and all(s["status"] == "ok" for s in state["steps"]), state["steps"]
    return out


def test_app_g_recipe_quick(tmp_path, tiny_model_dir):
    out = _quick("app_g_tool_choice", tmp_path, tiny_model_dir)
    for arm in ("greedy", "sampled-t0.7"):
        files = sorted((out / "runs" / arm).rglob("*.jsonl"))
        assert files, (arm, sorted(p.name for p in (out / "runs").rglob("*")))


def test_permissive_sensitivity_recipe_quick(tmp_path, tiny_model_dir):
    out = _quick("permissive_sensitivity", tmp_path, tiny_model_dir)
    study = json.loads((out / "study" / "study.json").read_text())
    assert {r["arm"] for r in study["tables"]["paired"]} == {"permissive"}
