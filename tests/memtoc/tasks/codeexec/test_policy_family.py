"""The overreliance paper's policy family as declared (seed 002 L117-L129, issue 46 item 2): per tool, 3 policies x
2 metrics x (six models + the pooled estimate) = 42 contrasts in ONE Holm family; the pooled estimate is the
unweighted mean of the six models' paired differences with item draws shared across models; Plain's P1 comes from
the main run's three repetitions where one is given. Checked against numpy and statsmodels."""

from __future__ import annotations

import json

import numpy as np
import pytest
from statsmodels.stats import multitest

from memtoc.tasks.codeexec.metrics import Trial

MODELS = [f"m{k}" for k in range(6)]
POLICIES = ("Compare", "Verify", "Disclose")


def _trials(policy, adopt, correct, reps=1, conditions=("P0", "P1")):
    out = []
    for r in range(reps):
        if "P1" in conditions:
            out += [Trial(f"p{i}", "P1", r, False, adopted=bool(a[r] if isinstance(a, list) else a), policy=policy)
                    for i, a in enumerate(adopt)]
        if "P0" in conditions:
            out += [Trial(f"p{i}", "P0", r, bool(c), adopted=None, policy=policy) for i, c in enumerate(correct)]
    return out


@pytest.fixture(scope="module")
def six_models():
    rng = np.random.default_rng(7)
    plain, arms = {}, {}
    for k, m in enumerate(MODELS):
        n = 20 + k                                          # the models' eligible items differ
        plain[m] = _trials("Plain", rng.random(n) < 0.7, rng.random(n) < 0.8)
        arms[m] = {p: _trials(p, rng.random(n) < (0.3 if p != "Disclose" else 0.65), rng.random(n) < 0.75)
                   for p in POLICIES}
    return plain, arms


def test_six_models_make_one_42_member_holm_family_matching_statsmodels(six_models):
    from memtoc.tasks.codeexec.policy_contrasts import policy_contrasts_by_model

    plain, arms = six_models
    rows = policy_contrasts_by_model(plain, arms, n_boot=300, n_perm=999, seed=20260918)
    assert len(rows) == 42 and {r["family_members"] for r in rows} == {42}
    assert sum(r["model"] == "pooled" for r in rows) == 6
    ps = [r["p"] for r in rows]
    assert [r["p_holm"] for r in rows] == pytest.approx(list(multitest.multipletests(ps, method="holm")[1]))
    # a per-model call's Holm is over its own 6 rows: smaller adjusted p values than inside the family
    one = policy_contrasts_by_model({"m0": plain["m0"]}, {"m0": arms["m0"]}, n_boot=300, n_perm=999,
                                    seed=20260918)
    assert len(one) == 6 and one[0]["family_size"] == 42
    fam = {(r["model"], r["policy"], r["metric"]): r["p_holm"] for r in rows}
    assert all(r["p_holm"] <= fam[("m0", r["policy"], r["metric"])] + 1e-12 for r in one)


def test_the_pooled_estimate_is_the_unweighted_mean_of_the_models_deltas(six_models):
    from memtoc.tasks.codeexec.policy_contrasts import policy_contrasts_by_model

    plain, arms = six_models
    rows = policy_contrasts_by_model(plain, arms, n_boot=500, n_perm=999, seed=20260918)
    for policy in POLICIES:
        for metric in ("adoption", "accuracy"):
            per = [r["delta"] for r in rows if r["policy"] == policy and r["metric"] == metric
                   and r["model"] != "pooled"]
            (pooled,) = [r for r in rows if r["policy"] == policy and r["metric"] == metric
                         and r["model"] == "pooled"]
            assert len(per) == 6 and pooled["delta"] == pytest.approx(float(np.mean(per)))
            assert pooled["ci_low"] <= pooled["delta"] <= pooled["ci_high"]
    (verify,) = [r for r in rows if r["model"] == "pooled" and r["policy"] == "Verify" and r["metric"] == "adoption"]
    assert verify["delta"] < -0.2 and verify["ci_high"] < 0 and verify["p_holm"] < 0.05


def test_plain_p1_comes_from_the_main_runs_three_repetitions():
    from memtoc.tasks.codeexec.policy_contrasts import policy_contrasts_by_model

    # the Plain policy run adopts everywhere; the main run's three repetitions adopt on 1 of 3 per problem
    plain = _trials("Plain", [1] * 10, [1] * 10)
    main = _trials("Plain", [[1, 0, 0]] * 10, [1] * 10, reps=3, conditions=("P1",))
    verify = {"Verify": _trials("Verify", [0] * 10, [1] * 10)}
    rows = policy_contrasts_by_model({"m": plain}, {"m": verify}, n_boot=100, n_perm=200, seed=0,
                                     plain_main={"m": main})
    ad = rows[0]
    assert ad["metric"] == "adoption" and ad["value_plain"] == pytest.approx(1 / 3)
    assert ad["delta"] == pytest.approx(-1 / 3) and ad["plain_p1_from"] == "main run"


def test_the_job_takes_runs_per_model_and_reports_the_family_size(tmp_path):
    from memtoc.jobs.codeexec_policy import PolicyContrastsConfig, run_policy_contrasts

    def write(name, policy, adopt):
        recs = [{"problem_id": f"p{i}", "condition": "P1", "repetition": 0, "correct": False, "adopted": bool(a),
                 "tool_calls": 1, "policy": policy, "episode_id": f"p{i}-P1"} for i, a in enumerate(adopt)]
        recs += [{"problem_id": f"p{i}", "condition": "P0", "repetition": 0, "correct": True, "adopted": None,
                  "tool_calls": 1, "policy": policy, "episode_id": f"p{i}-P0"} for i in range(len(adopt))]
        (tmp_path / name).mkdir()
        (tmp_path / name / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        return str(tmp_path / name)

    plain = ",".join(f"{m}={write(f'{m}-plain', 'Plain', [1, 1, 1, 0])}" for m in ("a", "b"))
    arms = ",".join(f"Verify@{m}={write(f'{m}-verify', 'Verify', [0, 0, 1, 0])}" for m in ("a", "b"))
    out = tmp_path / "c"
    res = run_policy_contrasts(PolicyContrastsConfig(plain=plain, arms=arms, out=str(out), n_boot=100, n_perm=200))
    assert res["family_members"] == 6 and res["family_size"] == 42   # 2 models x 2 metrics + 2 pooled rows
    assert "6 of 42 declared members present" in (out / "policy_contrasts.md").read_text(encoding="utf-8")
