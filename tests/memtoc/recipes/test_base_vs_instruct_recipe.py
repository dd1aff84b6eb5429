"""App. B / App. E's base-vs-instruct analysis as a recipe: five evaluate steps, each naming its own
model, one study with the planned keepQ z family (base vs each instruct: 4 members, Holm within) and the paired
family C; a whole-recipe --model, which would collapse the five models into one, is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from statsmodels.stats import multitest
from statsmodels.stats.proportion import proportions_ztest

from memtoc.cli import main
from memtoc.core.errors import MemtocError
from memtoc.jobs.study.families import declared_family
from memtoc.jobs.study.run import StudyConfig, run_study
from memtoc.recipes.experiment import load_recipe, run_experiment
from memtoc.runs.runstore import RunStore

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "experiments" / "analyses" / "base_vs_instruct.toml"
#: step -> the paper's model (App. E's five models)
PAPER_MODELS = {"base": "meta-llama/Llama-3.1-8B", "llama_instruct": "meta-llama/Llama-3.1-8B-Instruct",
                "qwen_instruct": "Qwen/Qwen2.5-7B-Instruct", "gemma_instruct": "google/gemma-2-9b-it",
                "mistral_instruct": "mistralai/Mistral-7B-Instruct-v0.3"}


def test_recipe_names_the_papers_five_models_and_runs_the_base_model_raw():
    steps = {st.name: st for st in load_recipe(RECIPE).steps}
    assert {name: steps[name].args["model"] for name in PAPER_MODELS} == PAPER_MODELS
    assert steps["base"].args["chat_template"] == "off"          # the release's completion mode for the base model
    pairs = [p for i, p in enumerate(steps["study"].positional) if steps["study"].positional[i - 1] == "--model-pair"]
    assert sorted(pairs) == sorted(f"${{{s}}}:${{base}}" for s in PAPER_MODELS if s != "base")


def test_whole_recipe_model_is_refused_where_steps_name_their_own(tmp_path):
    for kw in ({"model": "default"}, {"overrides": ["model=default"]}):
        with pytest.raises(MemtocError, match=r"would give one model to steps base, llama_instruct, .*--set "
                                              r"STEP\.model=VALUE"):
            run_experiment(RECIPE, quick=True, out=tmp_path / "x", report=False, **kw)
    assert not (tmp_path / "x" / "runs").exists()                  # refused before any step ran


def test_base_vs_instruct_recipe_quick(tmp_path, tiny_model_dir):
    """The tiny model linked under five names (one base run per model); the planned z family has the declared
    members and its Holm p are statsmodels' over the same raw p, which are statsmodels' z tests on the counts."""
    models = tmp_path / "models"
    models.mkdir()
    sets = []
    for step in PAPER_MODELS:
        (models / step).symlink_to(tiny_model_dir, target_is_directory=True)
        sets += ["--set", f"{step}.model={models / step}"]
    out = tmp_path / "out"
    assert main(["run-experiment", str(RECIPE), "--quick", *sets, "--set", "max_new_tokens=6", "--no-report",
                 "--out", str(out)]) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and all(s["status"] == "ok" for s in state["steps"]), state["steps"]
    for step in PAPER_MODELS:                                      # each step ran its own model
        run = json.loads((out / "runs" / step.replace("_", "-") / "run.json").read_text())
        assert str(models / step) in json.dumps(run)
    study = json.loads((out / "study" / "study.json").read_text())
    assert study["layer"] == "judged"
    _check_families(study["tables"], {step: step for step in PAPER_MODELS})
    # the tiny model's closed book is never right (its keepQ cells are empty, every z p undefined): the recipe's own
    # study step, as recorded, again over five runs whose cells are known (deterministic layer: no judge files)
    step = next(s for s in state["steps"] if s["name"] == "study")
    runs = out / "runs"
    synth = tmp_path / "synth"
    for i, (name, keep) in enumerate(zip(PAPER_MODELS, (3, 12, 7, 16, 10))):
        _write_run(synth / Path(step["config"]["base"][i]).name, str(models / name), keep)
    cfg = {k: [v.replace(str(runs), str(synth)) for v in vals] if k in ("base", "model_pair") else vals
           for k, vals in step["config"].items() if k != "out"}
    (layer,) = run_study(StudyConfig(**{**cfg, "score_layer": "deterministic"})).layers
    tables = layer.study.tables()
    planned = _check_families(tables, {step: step for step in PAPER_MODELS})
    assert all(r["p"] is not None for r in planned) and len({r["p"] for r in planned}) == 4
    for r in planned:                                              # the raw p: the pooled-variance z test
        assert r["p"] == pytest.approx(proportions_ztest([r["k_a"], r["k_b"]], [r["n_a"], r["n_b"]])[1])
    assert [r["p_holm_planned"] for r in planned] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in planned], method="holm")[1]))
    # the planned family is not the all-pairs one: Holm over 4, not 10
    all_pairs = [r for r in tables["ztests"] if r["family"] == planned[0]["family_planned"].replace("z-planned",
                                                                                                   "z-all-pairs")]
    assert len(all_pairs) == 10
    assert [r["p_holm"] for r in all_pairs] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in all_pairs], method="holm")[1]))
    base_rows = [r for r in tables["model_pairs"] if r["metric"] == "retention"]
    assert {r["pair"]: r["delta"] for r in base_rows} == pytest.approx(
        {"llama_instruct:base": (3 - 12) / 40, "qwen_instruct:base": (3 - 7) / 40,
         "gemma_instruct:base": (3 - 16) / 40, "mistral_instruct:base": (3 - 10) / 40})


def _check_families(tables: dict, names: dict[str, str]) -> list[dict]:
    """The planned z family has the declared members (base vs each instruct, keepQ, Reference); the paired family C
    has the four pairs, Reference only (no pooled slice). Returns the planned rows."""
    planned = [r for r in tables["ztests"] if r["family_planned"]]
    fam = declared_family("z-planned", "ztests")
    assert len(planned) == fam.size == 4
    assert {frozenset((r["model_a"], r["model_b"])) for r in planned} == \
        {frozenset((names["base"], names[s])) for s in PAPER_MODELS if s != "base"}
    assert {(r["metric"], r["metric_read"], r["formulation"]) for r in planned} == \
        {("retention", "retention_qminus", "reference")}
    pairs = tables["model_pairs"]
    assert {r["pair"] for r in pairs} == {f"{names[s]}:{names['base']}" for s in PAPER_MODELS if s != "base"}
    assert {r["slice"] for r in pairs} == {"reference"}
    return planned


def _rec(q: str, cond: str, cell: str, outcome: str) -> dict:
    return {"episode_id": f"{q}-{cond}", "question_id": q, "formulation": "reference", "condition": cond,
            "divergence_bucket": "near" if cond == "tool_wrong" else None, "cell": cell, "outcome": outcome,
            "followed_tool": outcome == "followed_tool", "kept_memory": outcome == "kept_memory",
            "final_correct": outcome == ("kept_memory" if cond == "tool_wrong" else "followed_tool"),
            "abstain": False, "ack_proxy": False, "trivial_hop": False}


def _write_run(root: Path, model: str, keep: int, n: int = 40) -> None:
    """A Reference-only run: ``keep`` of ``n`` arbitration questions keep the memory; every correct tool followed."""
    recs = [_rec(f"q{i}", "tool_wrong", "arb", "kept_memory" if i < keep else "followed_tool") for i in range(n)]
    recs += [_rec(f"g{i}", "tool_right", "tool_gold", "followed_tool") for i in range(10)]
    store = RunStore.open(root, identity={"model": model}, run_info={"config": {"model": model}})
    store.episodes.append(recs)
