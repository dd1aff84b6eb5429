"""The smaller protocol gaps pinned to the paper: the base-versus-instruct paired family, the keepQ
z tests, and the switch's decided-only Y -- each against an independent reference (statsmodels, numpy)."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats import multitest, proportion

from memtoc.scoring.metrics import get_metric, metric_units
from memtoc.jobs.study.analysis import StudySettings, run_study
from memtoc.jobs.study.families import StudyError
from memtoc.jobs.study.runs import load_run


def test_ztests_read_retention_as_keepq_without_trivial_hops(tmp_path, sd):
    # model A keeps memory on q0..q4, model B on q0..q7; q0..q3 are trivial hops (gold inside the question)
    runs = {}
    for name, keep in (("mA", sd.qs(0, 5)), ("mB", sd.qs(0, 8))):
        recs = sd.build_records(keep=keep, follow=sd.GOLD, far=False)
        for r in recs:
            r["trivial_hop"] = r["question_id"] in sd.qs(0, 4)
        runs[name] = load_run(sd.write_run(tmp_path / name, f"org/{name}", recs))
    study = run_study(list(runs.values()), [], StudySettings(n_boot=20, n_perm=50))
    (row,) = [r for r in study.ztests if r["metric"] == "retention" and r["formulation"] == "reference"]
    assert row["metric_read"] == "retention_qminus"
    assert (row["k_a"], row["n_a"], row["k_b"], row["n_b"]) == (1, 6, 4, 6)        # q4 of q4..q9; q4..q7 of q4..q9
    z, p = proportion.proportions_ztest(np.array([1, 4]), np.array([6, 6]))
    assert row["z"] == pytest.approx(z) and row["p"] == pytest.approx(p)


def test_base_vs_instruct_pairs_are_paired_on_common_support_with_holm(study_dirs):
    bases = [load_run(study_dirs[m]) for m in ("mA", "mB", "mC")]
    study = run_study(bases, [], StudySettings(n_boot=50, n_perm=2000, model_pairs=("mA:mB", "mA:mC")))
    rows = [r for r in study.model_pairs if r["metric"] == "retention" and r["slice"] == "reference"]
    assert [r["pair"] for r in rows] == ["mA:mB", "mA:mC"]
    for r, other in zip(rows, ("mB", "mC")):
        ua = metric_units(load_run(study_dirs["mA"]).records, get_metric("retention"), formulations=["reference"])
        ub = metric_units(load_run(study_dirs[other]).records, get_metric("retention"), formulations=["reference"])
        common = sorted(set(ua) & set(ub))
        assert r["n_common"] == len(common)
        assert r["delta"] == pytest.approx(float(np.mean([float(ub[u]) - float(ua[u]) for u in common])))
    ref = multitest.multipletests([r["p"] for r in rows], method="holm")[1]
    assert [r["p_holm"] for r in rows] == pytest.approx(list(ref))
    assert {r["family"] for r in rows} == {"base-vs-instruct:retention:reference"}
    with pytest.raises(StudyError, match="--model-pair 'mA:nope'"):
        run_study(bases, [], StudySettings(n_boot=5, n_perm=5, model_pairs=("mA:nope",)))


def test_decided_only_y_leaves_out_answers_that_took_no_side(sd):
    m = get_metric("cra_arb_decided")
    recs = [sd.rec("q0", "reference", "tool_wrong", "arb", "kept_memory", bucket="near"),
            sd.rec("q1", "reference", "tool_wrong", "arb", "followed_tool", bucket="near"),
            sd.rec("q2", "reference", "tool_wrong", "arb", "followed_tool", bucket="near"),
            sd.rec("q3", "reference", "tool_wrong", "arb", "neither", bucket="near"),
            sd.rec("q4", "reference", "tool_wrong", "arb", "both", bucket="near")]
    units = metric_units(recs, m)
    assert sorted(u[0] for u in units) == ["q0", "q1", "q2"]                    # neither / both left out
    assert sum(units.values()) / len(units) == pytest.approx(1 / 3)
    assert len(metric_units(recs, get_metric("cra_arb"))) == 5                  # the all-answers accuracy
