"""The paper recipes (``experiments/paper/*.toml``): each parses and validates, targets the paper's analysis set in
full mode, and runs end to end under ``--quick`` on the tiny model, with the tables it exists for in its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.cli.recipes import validate_recipe
from memtoc.recipes.experiment import load_recipe

REPO = Path(__file__).resolve().parents[3]
PAPER = REPO / "experiments" / "paper"
RECIPES = {p.stem: p for p in sorted(PAPER.glob("*.toml"))}


def test_one_recipe_per_paper_table_and_each_validates():
    assert set(RECIPES) == {"table4_baseline_arms", "table5_prompting_ladder", "table1_finetuning", "controls",
                            "protocol_ablation_switch", "distractor_distance"}
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
        if name in DETERMINISTIC:
            _deterministic_study(recipe)
        else:
            _judged_study(recipe)


#: recipes whose conditions the paper reads in the deterministic layer (its judge reads only tool_wrong)
DETERMINISTIC = {"controls"}


def _deterministic_study(recipe):
    """No judge step and a deterministic study, and the reason holds: the judge builds no request for any episode
    of the recipe's conditions, so a judged layer would be the deterministic one under another name."""
    from memtoc.bench.controls import CONTROL_ARMS
    from memtoc.bench.episodes import parse_conditions
    from memtoc.scoring.judge.prompts import load_judge_prompts
    from memtoc.scoring.judge.requests import build_requests

    assert not any(st.command == ["judge"] for st in recipe.steps), recipe.name
    assert "judge_model" not in recipe.defaults, recipe.name
    assert all(st.args.get("score_layer") == "deterministic" for st in recipe.steps if st.command == ["study"])
    conds = recipe.defaults["conditions"].replace("controls", ",".join(CONTROL_ARMS)).split(",")
    conds = [c for c in conds if c]
    assert "tool_wrong" not in parse_conditions(",".join(conds))
    recs = [{"condition": c, "question_id": f"q{i}", "formulation": "reference", "question": "Who wrote it?",
             "episode_id": f"q{i}-{c}", "extracted": "x y z w v u t s", "memory_span": "who wrote it the book x",
             "gold_answer": "it", "outcome": "neither", "neither_subtype": "other", "abstain": False}
            for i, c in enumerate(conds)]
    assert build_requests(recs, load_judge_prompts()) == []


def _judged_study(recipe):
    """The paper reads its tables from the judged layer (App. B): every run a study reads has a judge pass that
    the study waits for, the judge is the paper's on a GPU ('auto'), and the study reads the judged layer."""
    by_name = {st.name: st for st in recipe.steps}
    assert recipe.defaults.get("judge_model") == "auto", recipe.name
    judged = {st.positional[0] for st in recipe.steps if st.command == ["judge"]}
    for st in recipe.steps:
        if st.command != ["study"]:
            continue
        assert st.args.get("score_layer") == "judged", recipe.name
        runs = {v.split("=", 1)[-1] for k, v in zip(st.positional, st.positional[1:]) if k in ("--base", "--arm")}
        assert runs and runs <= judged, (recipe.name, runs - judged)
        assert {by_name[a].positional[0] for a in st.after} == runs, recipe.name


#: the recipes outside experiments/paper that reproduce a paper result (MemToC App. C, F.1, H; the overreliance
#: paper's main table and its probe/steering study)
PAPER_RESULT_RECIPES = ("sae_steering.toml", "rank_table.toml", "transfer.toml", "codeexec_main_table.toml",
                        "codeexec_probe_and_steer.toml")


def test_every_paper_recipe_runs_under_the_paper_protocol():
    paths = [*RECIPES.values(), *(REPO / "experiments" / n for n in PAPER_RESULT_RECIPES)]
    for path in paths:
        assert path.is_file(), path
        recipe = load_recipe(path)
        assert recipe.protocol == "paper", f"{path.name}: protocol = {recipe.protocol!r}, not 'paper'"
        validate_recipe(recipe)                       # a protocol no step takes is refused there


def _run(name: str, tmp_path: Path, tiny_model_dir: Path, *extra: str) -> tuple[Path, dict]:
    out = tmp_path / name
    argv = ["run-experiment", str(RECIPES[name]), "--quick", "--model", str(tiny_model_dir), "--set",
            "max_new_tokens=6", "--set", "n_boot=20", "--set", "n_perm=200", *extra, "--out", str(out)]
    assert main(argv) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and all(s["status"] == "ok" for s in state["steps"]), state["steps"]
    return out, json.loads((out / "study" / "study.json").read_text())


def test_controls_recipe_runs_the_payloads_in_fp16_in_the_deterministic_layer():
    """App. A: the three-payload comparison is the one run in fp16; the paper's judge reads only tool_wrong, so the
    controls' study is deterministic (and says so), and the payload texts are marked as the release's or ours."""
    recipe = load_recipe(RECIPES["controls"])
    assert recipe.defaults["dtype"] == "float16"
    _deterministic_study(recipe)
    text = RECIPES["controls"].read_text(encoding="utf-8")
    assert "service-unavailable is the release's" in text and "the project's own" in text
    data = json.loads((REPO / "memtoc" / "data" / "controls.json").read_text(encoding="utf-8"))
    assert "not the paper's" in data["source"]


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
    assert set(study["families"]) == {"B"}           # the release's family B inside each slice


def test_table4_baseline_arms_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("table4_baseline_arms", tmp_path, tiny_model_dir, "--set", "limit=2")
    # Table 4's caption: levels on Reference, the paired changes and Holm tests pooled over the three formulations
    assert {r["slice"] for r in study["tables"]["criterion"]} == {"reference", "paraphrase_a", "paraphrase_b",
                                                                  "pooled"}
    assert {r["arm"] for r in study["tables"]["paired"]} == {"warn", "source-priority", "abstain-and-flag"}
    assert list(study["families"]) == ["B"] and len(study["families"]["B"]) == 3     # one model x 3 strategies
    # a per-model run knows its family is partial: 3 of the 12 declared members (the whole family: `memtoc study
    # --experiment DIR` over the four models' runs)
    assert study["family_sizes"]["B"] == {"present": 3, "declared": 12, "partial": True, "asked_partial": True}
    assert "family B: 3 of 12 declared members (partial" in (out / "study" / "study.md").read_text(encoding="utf-8")
    pooled = [r for r in study["tables"]["paired"] if r["slice"] == "pooled" and r["metric"] == "retention"]
    assert {r["family"] for r in pooled} == {"B"}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_table1_finetuning_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("table1_finetuning", tmp_path, tiny_model_dir, "--set", "limit=4")
    assert {r["arm"] for r in study["tables"]["paired"]} == {"sft", "dpo"}
    assert len(study["families"]) == 1          # model x objective: one family of both contrasts
    assert (out / "crossfit" / "crossfit.json").exists()


def test_distractor_distance_recipe_quick(tmp_path, tiny_model_dir):
    out, study = _run("distractor_distance", tmp_path, tiny_model_dir, "--set", "limit=3")
    recs = [json.loads(x) for x in (out / "runs" / "standard" / "episodes.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in recs} >= {"tool_wrong", "tool_wrong_far"}
    assert {r["metric"] for r in study["tables"]["near_far"]} == {"retention", "incorrect_tool_following"}
    assert study["layer"] == "judged"


def test_table1_recipe_cuts_the_paper_fold_pool_under_the_paper_protocol():
    recipe = load_recipe(RECIPES["table1_finetuning"])
    assert recipe.protocol == "paper"
    assert recipe.defaults["fold_pool"] == "all" and recipe.defaults["train_formulations"] == "reference"
    assert recipe.defaults["question_set"] == "analysis" and recipe.defaults["formulations"] == "all"
