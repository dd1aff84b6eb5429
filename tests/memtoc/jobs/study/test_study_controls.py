"""The control arms in ``memtoc study``: each control against its reference inside one run, paired by question.

Hand-built runs (one formulation, 20 questions: q0..q9 memory right, q10..q19 memory wrong). Expected deltas are
counted by hand, sign-flip p-values are exact enumerations (k clusters moving the same way: p = 2 / 2^k), and
the Holm values are checked against statsmodels.
"""

from __future__ import annotations

import math

import pytest

from memtoc.jobs.study import StudySettings, load_run, run_study

multitest = pytest.importorskip("statsmodels.stats.multitest")
NP = 4000


def _r(q: int, cond: str, *, abstain=False, kept=False, correct=False) -> dict:
    cell = None if cond == "no_tool" else ("arb" if q < 10 else "both_wrong")
    outcome = "kept_memory" if kept else "neither"
    return {"episode_id": f"q{q}-{cond}-v0", "question_id": f"q{q}", "formulation": "reference",
            "condition": cond, "divergence_bucket": None, "cell": cell, "outcome": outcome, "followed_tool": False,
            "kept_memory": kept, "final_correct": correct, "abstain": abstain, "ack_proxy": False,
            "trivial_hop": False}


def _records(timeout_abstains: range) -> list[dict]:
    out = []
    for q in range(20):
        out.append(_r(q, "tool_error", abstain=True))
        out.append(_r(q, "tool_error_timeout", abstain=q in timeout_abstains))
        out.append(_r(q, "tool_error_permission", abstain=q >= 10, kept=q < 10, correct=q < 10))
        out.append(_r(q, "no_tool", kept=q < 10, correct=q < 10))
        out.append(_r(q, "noop_tool", abstain=q in range(6, 10), kept=q < 6, correct=q < 6))
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from memtoc.runs.runstore import RunStore

    root = tmp_path_factory.mktemp("controls")
    paths = []
    for model, timeout in (("org/mA", range(16)), ("org/mB", range(20))):
        store = RunStore.open(root / model.split("/")[1], identity={"model": model}, run_info={})
        store.episodes.append(_records(timeout))
        paths.append(store.root)
    return run_study([load_run(p) for p in paths], [], StudySettings(n_boot=200, n_perm=NP))


def _row(study, model, metric_control):
    rows = [r for r in study.controls if r["model"] == model and r["metric_control"] == metric_control
            and r["slice"] == "reference"]
    assert len(rows) == 1
    return rows[0]


def _close(p, exact):
    return abs(p - exact) < 4 * math.sqrt(exact * (1 - exact) / NP) + 1 / NP


@pytest.mark.parametrize(("metric", "ref_value", "ctl_value", "n", "exact_p"), [
    ("tool_error_abstention_timeout", 1.0, 16 / 20, 20, 2 / 2 ** 4),
    ("tool_error_abstention_permission", 1.0, 10 / 20, 20, 2 / 2 ** 10),
    ("tool_error_fallback_permission", 0.0, 1.0, 10, 2 / 2 ** 10),   # memory right: falls back to memory
    ("tool_error_bw_abstention_permission", 1.0, 1.0, 10, 1.0),      # memory wrong: still abstains
    ("noop_accuracy", 10 / 20, 6 / 20, 20, 2 / 2 ** 4),              # NoopTool vs no tool
    ("noop_abstention", 0.0, 4 / 20, 20, 2 / 2 ** 4),
])
def test_control_contrasts_against_hand_counts(study, metric, ref_value, ctl_value, n, exact_p):
    r = _row(study, "mA", metric)
    assert r["n_common"] == n
    assert (r["value_reference"], r["value_control"]) == (pytest.approx(ref_value), pytest.approx(ctl_value))
    assert r["delta"] == pytest.approx(ctl_value - ref_value)
    assert _close(r["p"], exact_p) if exact_p < 1 else r["p"] == 1.0


def test_control_holm_across_models_matches_statsmodels(study):
    for metric in ("tool_error_abstention_timeout", "noop_accuracy"):
        rows = [_row(study, m, metric) for m in ("mA", "mB")]
        assert rows[0]["family"] == rows[1]["family"]
        ref = multitest.multipletests([r["p"] for r in rows], method="holm")[1]
        assert [r["p_holm"] for r in rows] == pytest.approx(list(ref), abs=1e-12)
    assert _row(study, "mB", "tool_error_abstention_timeout")["p"] == 1.0   # identical payload behaviour


def test_runs_without_control_episodes_have_no_control_rows(study_dirs):
    s = run_study([load_run(study_dirs["mA"])], [], StudySettings(n_boot=20, n_perm=50))
    assert s.controls == []
