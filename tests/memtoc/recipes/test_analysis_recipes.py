"""Recipes for the paper analyses no recipe ran before: App. G's tool-choice protocols (greedy, then
T = 0.7 on three seeds), the permissive-elicitation sensitivity (§4.2 / App. D), the seed robustness of App. E
(family T3), §5.4's presentation formats (family A), reverse transfer (FaithEval x ARC rows supplied by the user)
and the 70B point of App. F.2. Each validates and runs end to end under --quick on the tiny model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.cli.recipes import validate_recipe
from memtoc.recipes.experiment import load_recipe

REPO = Path(__file__).resolve().parents[3]
ANALYSES = REPO / "experiments" / "analyses"


def test_analysis_recipes_validate_and_state_the_papers_settings():
    names = {p.stem for p in ANALYSES.glob("*.toml")}
    assert {"app_g_tool_choice", "permissive_sensitivity", "seed_robustness", "presentation_formats",
            "reverse_transfer", "scale_70b"} <= names
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


def _quick(name: str, tmp_path: Path, tiny_model_dir: Path, *extra: str) -> Path:
    out = tmp_path / name
    assert main(["run-experiment", str(ANALYSES / f"{name}.toml"), "--quick", "--model", str(tiny_model_dir),
                 "--set", "max_new_tokens=6", "--set", "limit=2", *extra, "--no-report", "--out", str(out)]) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and all(s["status"] in ("ok", "skipped (quick)") for s in state["steps"]), state["steps"]
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
    agree = json.loads((out / "agreement" / "elicitation_agreement.json").read_text())
    assert agree["n_shared"] > 0 and set(agree["unknown"]) == {"k", "n", "rate"}     # App. D's two quantities


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]


#: the release's ragsnip templates (scoring.md §6.5), an independent copy of the text the frames must render
RAGSNIP = {
    "reference": "You retrieved the snippet below from a document search; it is shown. The search cannot be run "
                 "again \u2014 do not write another search query, answer now. Use the snippet together with your "
                 "judgment to answer the question.\nRetrieved snippet: {tool_output}\nEnd your reply with one line "
                 "that starts with 'FINAL: ' followed by your answer.\nQuestion: {question}\n",
    "paraphrase_a": "A document search was run and returned the snippet below. Do not attempt another search; answer "
                    "the question directly.\nSnippet: {tool_output}\nFinish with a single line that starts with "
                    "'FINAL: ' and then your answer.\nQ: {question}\n",
    "paraphrase_b": "Here is what a document search returned. No further searches are possible \u2014 give the final "
                    "answer to the question yourself.\nRetrieved: {tool_output}\nYour last line must start with "
                    "'FINAL: ' followed by the answer itself.\nQuestion: {question}\n",
}


def test_presentation_frames_are_the_releases_text():
    """toolns is the schema frame with its schema line deleted, ragsnip the release's retrieval text (scoring.md
    §6.5), for every formulation; both are data (prompts.json), and family A takes the two arms by label."""
    from memtoc.jobs.study.families import DECLARED_FAMILIES

    doc = json.loads((REPO / "memtoc" / "data" / "prompts.json").read_text(encoding="utf-8"))
    for form, spec in doc["formulations"].items():
        frames = spec["frames"]
        no_schema = "".join(line for line in frames["tool"].splitlines(keepends=True) if "{schema}" not in line)
        assert frames["tool-no-schema"] == no_schema, form
        assert frames["passage"] == RAGSNIP[form], form
    fam = DECLARED_FAMILIES["A"]
    labels = fam.arm_labels()
    assert fam.size == 10 and (labels["tool-no-schema"], labels["passage"]) == ("toolns", "ragsnip")
    recipe = load_recipe(ANALYSES / "presentation_formats.toml")
    steps = {st.name: st for st in recipe.steps}
    assert (steps["standard"].args["frame"], steps["toolns"].args["frame"], steps["ragsnip"].args["frame"]) == \
        ("tool", "tool-no-schema", "passage")
    assert recipe.defaults["conditions"] == "tool_right,tool_wrong"
    assert steps["study"].args["holm_family"] == "A"


def test_presentation_formats_recipe_quick(tmp_path, tiny_model_dir):
    out = _quick("presentation_formats", tmp_path, tiny_model_dir)
    runs = {name: _records(out / "runs" / name) for name in ("standard", "toolns", "ragsnip")}
    for name, frame in (("standard", "tool"), ("toolns", "tool-no-schema"), ("ragsnip", "passage")):
        assert {r["frame"] for r in runs[name]} == {frame}
        assert {r["condition"] for r in runs[name]} == {"tool_right", "tool_wrong"}
    # the arms share the standard run's closed book: identical memory spans per question
    mem = {name: {r["question_id"]: r["memory_span"] for r in recs} for name, recs in runs.items()}
    assert mem["toolns"] == mem["standard"] == mem["ragsnip"]
    assert all("Retrieved snippet:" in r["prompt"] for r in runs["ragsnip"])
    assert not any("Tool schema:" in r["prompt"] for r in runs["toolns"])
    assert all("Tool schema:" in r["prompt"] for r in runs["standard"])
    study = json.loads((out / "study" / "study.json").read_text())
    rows = [r for r in study["tables"]["paired"] if r["metric"] == "retention"]
    assert {r["arm"] for r in rows} == {"toolns", "ragsnip"}
    assert all(str(r.get("family", "")).startswith("A") for r in rows), rows[0]


FIXTURE = Path(__file__).parent / "data" / "faitheval_arc_rows.jsonl"


def test_reverse_transfer_recipe_needs_the_data_and_trains_on_the_rows_given(tmp_path, tiny_model_dir):
    """The FaithEval x ARC rows are an input: the full recipe names a file this checkout lacks (one line, before
    any model), and --set train.benchmark=transfer:value:FILE trains on that file only (the MemToC steps keep the
    benchmark); the adapter then reads against the base in family reverse-transfer."""
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.transfer import load_transfer

    recipe = load_recipe(ANALYSES / "reverse_transfer.toml")
    train = {st.name: st for st in recipe.steps}["train"]
    assert train.args["benchmark"].startswith("transfer:value:") and train.args["objective"] == "dpo"
    assert not Path(train.args["benchmark"].split(":", 2)[2]).exists()
    out = _quick("reverse_transfer", tmp_path, tiny_model_dir, "--set", f"train.benchmark=transfer:value:{FIXTURE}",
                 "--set", "train.limit=10")
    data = json.loads((out / "adapters" / "reverse-dpo" / "memtoc_adapter.json").read_text())["data"]
    answerable = [it for it in load_transfer(FIXTURE) if not it.unanswerable]     # the unanswerable row: no pair
    assert data["n_questions"] == len(answerable) == 3 and data["n_pairs"] == 2 * len(answerable)
    assert data["benchmark_files"][f"transfer/{FIXTURE.name}"] == hashlib.sha256(FIXTURE.read_bytes()).hexdigest()
    base, arm = _records(out / "runs" / "base"), _records(out / "runs" / "reverse-dpo")
    assert {r["question_id"] for r in base} == {r["question_id"] for r in arm}
    demo = {q.id: q.question for q in load_benchmark("demo").questions}          # the MemToC steps keep theirs
    assert base and all(demo.get(r["question_id"]) == r["question"] for r in base + arm)
    study = json.loads((out / "study" / "study.json").read_text())
    rows = [r for r in study["tables"]["paired"] if r["metric"] == "retention"]
    assert {r["arm"] for r in rows} == {"reverse-dpo"}
    assert all(str(r.get("family", "")).startswith("reverse-transfer") for r in rows), rows[0]


def test_step_scoped_set_is_checked_against_the_step(tmp_path):
    from memtoc.core.errors import MemtocError
    from memtoc.recipes.experiment import run_experiment

    path = ANALYSES / "reverse_transfer.toml"
    with pytest.raises(MemtocError, match="no step named 'nosuch'"):
        run_experiment(path, quick=True, overrides=["nosuch.benchmark=demo"], out=tmp_path / "a", report=False)
    with pytest.raises(MemtocError, match="step study .* has no option --objective"):
        run_experiment(path, quick=True, overrides=["study.objective=sft"], out=tmp_path / "b", report=False)


def test_scale_70b_recipe_targets_the_70b_on_a_gpu_and_runs_quick(tmp_path, tiny_model_dir):
    recipe = load_recipe(ANALYSES / "scale_70b.toml")
    assert "70b" in recipe.defaults["model"].lower() and recipe.defaults["backend"] == "vllm"
    assert recipe.quick["model"] == "default" and recipe.quick["backend"] == "hf"
    out = _quick("scale_70b", tmp_path, tiny_model_dir)
    run = json.loads((out / "runs" / "standard" / "run.json").read_text())
    assert str(tiny_model_dir) in json.dumps(run)              # --model overrides the recipe's model
    assert (out / "study" / "study.json").is_file()
    # the anchor pairing (its own model) is left out under --quick: one model cannot pair with itself
    steps = {s["name"]: s["status"] for s in json.loads((out / "experiment.json").read_text())["steps"]}
    assert steps["anchor"] == steps["study_pair"] == "skipped (quick)"


def test_seed_robustness_recipe_quick(tmp_path, tiny_model_dir):
    """Both further seeds train (each adapter records its seed) and read against the base in family T3."""
    out = _quick("seed_robustness", tmp_path, tiny_model_dir)
    for seed in (42, 20260719):
        adapters = sorted((out / f"crossfit-seed{seed}" / "adapters").glob("dpo-*/memtoc_adapter.json"))
        assert len(adapters) == 2                                     # one per fold
        assert {json.loads(p.read_text())["train_config"]["seed"] for p in adapters} == {seed}
    study = json.loads((out / "study" / "study.json").read_text())
    assert {(r["arm"], r["family"]) for r in study["tables"]["paired"] if r["metric"] == "retention"} == \
        {("dpo-seed42", "T3"), ("dpo-seed20260719", "T3")}
