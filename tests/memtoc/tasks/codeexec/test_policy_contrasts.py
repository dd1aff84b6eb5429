"""The overreliance paper's policy contrasts (seed 002 L117): each policy vs Plain paired by problem, per-item
means of eligible repetitions, items eligible in both, Holm inside the tool -- checked against numpy and
statsmodels; the job's defaults are the paper's draws and seed; the recipe runs Verify, Compare and Disclose."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from statsmodels.stats import multitest

from memtoc.core.errors import MemtocError
from memtoc.tasks.codeexec.metrics import Trial
from memtoc.tasks.codeexec.policy_contrasts import policy_contrasts_by_model

REPO = Path(__file__).resolve().parents[4]


def _trials(policy, adopt, correct, reps=1):
    out = []
    for r in range(reps):
        out += [Trial(f"p{i}", "P1", r, False, adopted=bool(a), policy=policy) for i, a in enumerate(adopt)]
        out += [Trial(f"p{i}", "P0", r, bool(c), adopted=None, policy=policy) for i, c in enumerate(correct)]
    return out


def test_verify_vs_plain_is_paired_by_problem_with_holm_inside_the_tool():
    rng = np.random.default_rng(1)
    plain = _trials("Plain", rng.random(30) < 0.8, rng.random(30) < 0.7, reps=3)     # Plain: mean of 3 reps
    plain += [Trial("extra", "P1", 0, False, adopted=True, policy="Plain")]         # not eligible in both
    arms = {"Verify": _trials("Verify", rng.random(30) < 0.3, rng.random(30) < 0.7),
            "Compare": _trials("Compare", rng.random(30) < 0.5, rng.random(30) < 0.6)}
    rows = policy_contrasts_by_model({"m": plain}, {"m": arms}, n_boot=200, n_perm=2000, seed=20260918)
    assert [(r["policy"], r["metric"]) for r in rows] == [("Verify", "adoption"), ("Verify", "accuracy"),
                                                          ("Compare", "adoption"), ("Compare", "accuracy")]
    v = rows[0]
    p_ad = np.array([[t.adopted for t in plain if t.condition == "P1" and t.problem_id == f"p{i}"]
                     for i in range(30)], dtype=float).mean(axis=1)
    v_ad = np.array([t.adopted for t in arms["Verify"] if t.condition == "P1"], dtype=float)
    assert v["n_items"] == 30 and v["delta"] == pytest.approx(float(np.mean(v_ad - p_ad)))
    assert v["delta"] < 0 and v["p"] < 0.05                                            # Verify lowers adoption
    assert [r["p_holm"] for r in rows] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in rows], method="holm")[1]))
    assert {r["family"] for r in rows} == {"overreliance-policy"}
    with pytest.raises(MemtocError, match="Plain run is the reference"):
        policy_contrasts_by_model({"m": plain}, {"m": {"Plain": plain}}, n_boot=5, n_perm=5, seed=0)


def test_the_job_defaults_are_the_papers_draws_and_it_writes_its_table(tmp_path):
    from memtoc.jobs.codeexec_policy import PolicyContrastsConfig, run_policy_contrasts
    from memtoc.jobs.catalog import job

    cfg = PolicyContrastsConfig()
    assert (cfg.n_boot, cfg.n_perm, cfg.seed) == (10000, 20000, 20260918)
    assert job("codeexec policy-contrasts").config_class() is PolicyContrastsConfig
    paths = {}
    for policy, adopt in (("Plain", [1, 1, 1, 0]), ("Verify", [0, 0, 1, 0])):
        recs = [{"problem_id": f"p{i}", "condition": "P1", "repetition": 0, "correct": False, "adopted": bool(a),
                 "tool_calls": 1, "policy": policy, "episode_id": f"p{i}-P1"} for i, a in enumerate(adopt)]
        recs += [{"problem_id": f"p{i}", "condition": "P0", "repetition": 0, "correct": True, "adopted": None,
                  "tool_calls": 1, "policy": policy, "episode_id": f"p{i}-P0"} for i in range(4)]
        # what `codeexec evaluate` writes: trials.jsonl, one record per problem x condition x repetition
        (tmp_path / policy).mkdir()
        (tmp_path / policy / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        paths[policy] = str(tmp_path / policy)
    out = tmp_path / "contrasts"
    res = run_policy_contrasts(PolicyContrastsConfig(plain=paths["Plain"], arms=f"Verify={paths['Verify']}",
                                                     out=str(out), n_boot=100, n_perm=200))
    assert res["contrasts"][0]["delta"] == pytest.approx(-0.5)
    assert json.loads((out / "policy_contrasts.json").read_text())["seed"] == 20260918
    assert "Verify | adoption (P1)" in (out / "policy_contrasts.md").read_text(encoding="utf-8")
    with pytest.raises(MemtocError, match="given as 'Compare'"):
        run_policy_contrasts(PolicyContrastsConfig(plain=paths["Plain"], arms=f"Compare={paths['Verify']}",
                                                   out=str(out)))


def test_policy_recipe_runs_every_policy_and_the_contrast_with_the_papers_draws():
    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(REPO / "experiments" / "overreliance" / "policy_contrasts.toml")
    policies = {st.args.get("policy") for st in recipe.steps if st.command == ["codeexec", "evaluate"]}
    assert policies == {"Plain", "Compare", "Verify", "Disclose"}
    (contrast,) = [st for st in recipe.steps if st.command == ["codeexec", "policy-contrasts"]]
    assert (contrast.args["n_boot"], contrast.args["n_perm"], contrast.args["seed"]) == (10000, 20000, 20260918)
    assert {a.split("=")[0] for a in contrast.args["arms"].split(",")} == {"Compare", "Verify", "Disclose"}


def test_policy_recipe_quick_reads_the_runs_codeexec_evaluate_writes(tmp_path, tiny_model_dir):
    """End to end on the tiny model: four policy runs, then the contrast step reads their trials.jsonl (the
    contrast job once read a file the evaluator does not write, which only a real run could show)."""
    from memtoc.cli import main

    out = tmp_path / "policy"
    assert main(["run-experiment", str(REPO / "experiments" / "overreliance" / "policy_contrasts.toml"), "--quick",
                 "--model", str(tiny_model_dir), "--set", "max_new_tokens=6", "--set", "limit=1", "--no-report",
                 "--out", str(out)]) == 0
    res = json.loads((out / "contrasts" / "policy_contrasts.json").read_text())
    rows = res["contrasts"]
    assert {(r["policy"], r["metric"]) for r in rows} == {(p, m) for p in ("Compare", "Verify", "Disclose")
                                                          for m in ("adoption", "accuracy")}
    assert all(r["n_items"] == 1 for r in rows) and res["seed"] == 20260918
