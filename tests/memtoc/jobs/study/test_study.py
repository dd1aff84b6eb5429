"""``memtoc study`` on constructed runs (two arms, three models), checked against independent references.

References: statsmodels' ``multipletests(method='holm')`` for the Holm-adjusted p-values and
``proportions_ztest`` for the cross-model z tests; exact sign-flip p-values enumerated by hand for a few
contrasts (k clusters all moving the same way: p = 2 / 2^k); the criterion verdicts and the stability rule
worked out by hand from the records described in ``conftest.study_dirs``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from memtoc.cli import main
from memtoc.core.errors import MemtocError, RunStoreError
from memtoc.jobs.study import StudySettings, load_run, resolve_families, run_study
from memtoc.jobs.study.runs import pair_contrasts
from memtoc.jobs.study.output import criterion_matrix, write_study

multitest = pytest.importorskip("statsmodels.stats.multitest")
proportion = pytest.importorskip("statsmodels.stats.proportion")

NB, NP = 200, 4000


def _study(dirs, family="model×arm", **kw):
    bases = [load_run(dirs[m]) for m in ("mA", "mB", "mC")]
    bases = [type(b)("base", b.model, b.path, b.records) for b in bases]
    arms = [load_run(f"{lab.split('/')[1]}={dirs[lab]}") for lab in ("mA/warn", "mA/prior", "mB/warn", "mB/prior")]
    return run_study(bases, arms, StudySettings(family=family, n_boot=NB, n_perm=NP, **kw))


@pytest.fixture(scope="module")
def study(study_dirs):
    return _study(study_dirs)


def _row(rows, **match):
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, len(found))
    return found[0]


def test_runs_carry_model_identity_and_pair_with_their_base(study):
    assert [c.name for c in study.contrasts] == ["mA/warn", "mA/prior", "mB/warn", "mB/prior"]
    assert {c.name: c.base_run.model for c in study.contrasts} == {"mA/warn": "org/mA", "mA/prior": "org/mA",
                                                                   "mB/warn": "org/mB", "mB/prior": "org/mB"}
    assert study.formulations == ("reference", "paraphrase_a", "paraphrase_b")
    assert study.families == {"model×arm": ("mA/warn", "mA/prior", "mB/warn", "mB/prior")}


def test_paired_deltas_on_common_support(study):
    r = _row(study.paired, contrast="mA/warn", slice="reference", metric="retention")
    assert (r["n_common"], r["value_base"], r["value_arm"], r["delta"]) == (10, 0.2, 1.0, pytest.approx(0.8))
    r = _row(study.paired, contrast="mA/warn", slice="pooled", metric="retention")
    assert r["n_common"] == 30 and r["n_clusters"] == 10
    assert r["delta"] == pytest.approx((8 + 1 + 8) / 30)
    r = _row(study.paired, contrast="mA/warn", slice="paraphrase_b", metric="correct_tool_following")
    assert (r["n_common"], r["delta"]) == (10, pytest.approx(-0.8))


@pytest.mark.parametrize(("contrast", "slice_", "metric", "k"), [
    ("mA/warn", "reference", "retention", 8),              # 8 questions all +1
    ("mA/warn", "paraphrase_b", "correct_tool_following", 8),
    ("mB/warn", "pooled", "retention", 5),                 # 5 question clusters all +3
])
def test_sign_flip_p_matches_exact_enumeration(study, contrast, slice_, metric, k):
    """k clusters moving the same way: exactly 2 of the 2^k sign patterns reach |delta|, so p = 2 / 2^k."""
    r = _row(study.paired, contrast=contrast, slice=slice_, metric=metric)
    exact = 2 / 2 ** k
    assert abs(r["p"] - exact) < 4 * math.sqrt(exact * (1 - exact) / NP) + 1 / NP


def test_same_arm_twice_gives_zero_difference_and_p_one(study):
    """mA/prior holds the very records of mA's base: every delta is 0, every p (raw and Holm) is 1."""
    rows = [r for r in study.paired if r["contrast"] == "mA/prior" and r["n_common"] > 0]
    assert rows
    for r in rows:
        assert r["delta"] == 0 and r["ci_low"] == 0 and r["ci_high"] == 0 and r["p"] == 1.0
        assert r["value_base"] == r["value_arm"]
    for r in rows:
        if r["p_holm"] is not None:
            assert r["p_holm"] == 1.0


@pytest.mark.parametrize("family", ["model×arm", "arm", "model"])
def test_holm_matches_statsmodels(study_dirs, family):
    study = _study(study_dirs, family=family)
    assert study.families
    for name, members in study.families.items():
        for s in study.slices:
            rows = [_row(study.paired, contrast=m, slice=s, metric="retention") for m in members]
            ref = multitest.multipletests([r["p"] for r in rows], method="holm")[1]
            assert [r["p_holm"] for r in rows] == pytest.approx(list(ref), abs=1e-12), (name, s)
            assert all(r["family"] == name for r in rows)
    # secondary metrics are never adjusted
    assert all(r["p_holm"] is None for r in study.paired if r["metric"] != "retention")


def test_family_builders_and_custom_families(study):
    cs = study.contrasts
    assert resolve_families("arm", cs) == {"arm:warn": ("mA/warn", "mB/warn"), "arm:prior": ("mA/prior", "mB/prior")}
    assert resolve_families("model", cs) == {"model:mA": ("mA/warn", "mA/prior"), "model:mB": ("mB/warn", "mB/prior")}
    assert resolve_families("model-arm", cs) == resolve_families("model×arm", cs)
    assert resolve_families("none", cs) == {}
    assert resolve_families("W=mA/warn,mB/warn;P=mA/prior", cs) == {"W": ("mA/warn", "mB/warn"), "P": ("mA/prior",)}
    for bad, msg in (("F=mA/warn,mZ/warn", "unknown contrast 'mZ/warn'"),
                     ("F=mA/warn;G=mA/warn", "in two families"), ("bogus", "not declared: choose a paper family")):
        with pytest.raises(MemtocError, match=msg):
            resolve_families(bad, cs)


def test_criterion_per_formulation_matches_hand_and_reference(study):
    """Table 5: retention must rise at Holm p < .05 and correct-tool following must not fall at raw p < .05."""
    matrix = {r["contrast"]: r for r in criterion_matrix(study)}
    assert matrix["mA/warn"] == {"contrast": "mA/warn", "reference": "met", "paraphrase_a": "failk",
                                 "paraphrase_b": "failt", "pooled": "failt"}
    for s in study.slices:
        assert matrix["mA/prior"][s] == "failk"
        assert matrix["mB/warn"][s] == "failk"     # 5 clusters: the smallest possible p is 2/32 > .05
    # the verdict recomputed from the reference Holm p-values (statsmodels) and the raw tool p-values
    fam = study.families["model×arm"]
    for s in study.slices:
        rets = [_row(study.paired, contrast=m, slice=s, metric="retention") for m in fam]
        holm_ref = multitest.multipletests([r["p"] for r in rets], method="holm")[1]
        for m, ret, ph in zip(fam, rets, holm_ref):
            tool = _row(study.paired, contrast=m, slice=s, metric="correct_tool_following")
            rises = ret["delta"] > 0 and ph < 0.05
            falls = tool["delta"] is not None and tool["delta"] < 0 and tool["p"] < 0.05
            crit = _row(study.criterion, contrast=m, slice=s)
            assert crit["verdict"] == ("met" if rises and not falls else "fail"), (m, s)
            assert crit["retention_p"] == pytest.approx(ph) and crit["retention_p_is_holm"]


def test_criterion_uses_raw_p_outside_any_family(study_dirs):
    study = _study(study_dirs, family="none")
    crit = _row(study.criterion, contrast="mA/warn", slice="reference")
    ret = _row(study.paired, contrast="mA/warn", slice="reference", metric="retention")
    assert crit["retention_p"] == ret["p"] and not crit["retention_p_is_holm"]


def test_near_vs_far_is_paired_on_questions_with_both(study):
    r = _row(study.near_far, run="base", model="mA", slice="reference", metric="retention")
    assert (r["n_common"], r["value_near"], r["value_far"]) == (6, pytest.approx(2 / 6), 1.0)
    assert r["delta_far_minus_near"] == pytest.approx(4 / 6)
    assert abs(r["p"] - 2 / 16) < 4 * math.sqrt(0.125 * 0.875 / NP) + 1 / NP
    w = _row(study.near_far, run="base", model="mA", slice="reference", metric="incorrect_tool_following")
    assert (w["n_common"], w["delta_far_minus_near"]) == (6, pytest.approx(-4 / 6))
    # formulations without far records give empty contrasts; runs without any far record give no rows
    assert _row(study.near_far, run="base", model="mA", slice="paraphrase_a", metric="retention")["n_common"] == 0
    assert {r["model"] for r in study.near_far} == {"mA", "mB"}


def test_cross_model_z_tests_match_statsmodels(study):
    rows = [r for r in study.ztests if r["arm"] == "base" and r["metric"] == "retention"
            and r["formulation"] == "reference"]
    assert [(r["model_a"], r["model_b"]) for r in rows] == [("mA", "mB"), ("mA", "mC"), ("mB", "mC")]
    expected_counts = {"mA": (2, 10), "mB": (5, 10), "mC": (6, 10)}
    for r in rows:
        assert (r["k_a"], r["n_a"]) == expected_counts[r["model_a"]]
        assert (r["k_b"], r["n_b"]) == expected_counts[r["model_b"]]
        z, p = proportion.proportions_ztest(np.array([r["k_a"], r["k_b"]]), np.array([r["n_a"], r["n_b"]]))
        assert r["z"] == pytest.approx(z, rel=1e-9) and r["p"] == pytest.approx(p, rel=1e-9)
    ref = multitest.multipletests([r["p"] for r in rows], method="holm")[1]
    assert [r["p_holm"] for r in rows] == pytest.approx(list(ref), rel=1e-12)
    # arm groups with two models are tested too (warn: mA vs mB)
    assert {r["arm"] for r in study.ztests} == {"base", "warn", "prior"}


def test_stability_rule_pooled_and_every_formulation(study):
    """Retention: mA < mB everywhere (stable); mC crosses both (reference .6, paraphrase_a .1)."""
    rows = {(r["model_a"], r["model_b"]): r for r in study.stability if r["arm"] == "base"
            and r["metric"] == "retention"}
    assert rows[("mA", "mB")]["stable"] and rows[("mA", "mB")]["stable_ordering"] == "mA < mB"
    assert rows[("mA", "mC")] | {} == rows[("mA", "mC")] and not rows[("mA", "mC")]["stable"]
    assert (rows[("mA", "mC")]["reference"], rows[("mA", "mC")]["paraphrase_a"]) == ("<", ">")
    assert not rows[("mB", "mC")]["stable"] and rows[("mB", "mC")]["pooled"] == ">"
    rank = _row(study.rankings, arm="base", metric="retention")
    assert rank["reference"] == "mC > mB > mA" and rank["paraphrase_a"] == "mB > mA > mC"
    assert rank["ranking_stable"] is False and (rank["n_stable_pairs"], rank["n_pairs"]) == (1, 3)


def test_stability_tie_or_missing_breaks_an_ordering(sd, tmp_path):
    a = sd.write_run(tmp_path / "a", "org/a", sd.build_records(keep=sd.qs(0, 2), follow=sd.GOLD))
    b = sd.write_run(tmp_path / "b", "org/b", sd.build_records(
        keep={"reference": sd.qs(0, 5), "paraphrase_a": sd.qs(0, 2), "paraphrase_b": sd.qs(0, 5)},
        follow=sd.GOLD))
    study = run_study([load_run(a), load_run(b)], [], StudySettings(n_boot=NB, n_perm=NP))
    r = _row(study.stability, arm="base", metric="retention")
    assert (r["reference"], r["paraphrase_a"], r["pooled"], r["stable"]) == ("<", "=", "<", False)
    assert study.contrasts == [] and study.paired == [] and study.criterion == []


def test_pairing_refusals(study_dirs):
    a = load_run(study_dirs["mA"])
    with pytest.raises(RunStoreError, match="two base runs for model 'org/mA'"):
        pair_contrasts([a, load_run(study_dirs["mA/warn"])], [])
    with pytest.raises(RunStoreError, match="no base run of its model 'org/mB'"):
        pair_contrasts([a], [load_run(study_dirs["mB/warn"])])
    with pytest.raises(RunStoreError, match="two arms named 'mA/x'"):
        pair_contrasts([a], [load_run(f"x={study_dirs['mA/warn']}"), load_run(f"x={study_dirs['mA/prior']}")])
    with pytest.raises(MemtocError, match="unknown metric"):
        StudySettings(metrics=("retention", "nope"))


def test_outputs_are_written_as_markdown_csv_json(study, tmp_path):
    out = tmp_path / "study_out"
    paths = write_study(study, out)
    names = sorted(p.name for p in paths)
    assert names == sorted(["paired.csv", "criterion.csv", "near_far.csv", "controls.csv", "ztests.csv",
                            "stability.csv", "rankings.csv", "model_pairs.csv", "study.json", "study.md"])
    assert not list(out.glob("*.tmp"))
    data = json.loads((out / "study.json").read_text())
    assert data["families"] == {"model×arm": ["mA/warn", "mA/prior", "mB/warn", "mB/prior"]}
    assert len(data["tables"]["criterion"]) == 4 * 4
    header = (out / "criterion.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["contrast", "model", "arm", "slice", "verdict"]
    md = (out / "study.md").read_text()
    assert "| mA/warn | met | failk | failt | failt |" in md
    assert "Stable cross-model orderings:" in md


def test_cli_study_and_errors(study_dirs, tmp_path, capsys):
    d = study_dirs
    rc = main(["study", "--score-layer", "deterministic", "--base", str(d["mA"]), "--base", str(d["mB"]), "--arm", f"warn={d['mA/warn']}",
               "--arm", f"warn={d['mB/warn']}", "--holm-family", "arm", "--n-boot", "50", "--n-perm", "500",
               "--out", str(tmp_path / "o")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "`arm:warn`: mA/warn, mB/warn" in out
    assert json.loads((tmp_path / "o" / "study.json").read_text())["families"] == {"arm:warn": ["mA/warn",
                                                                                               "mB/warn"]}
    rc = main(["study", "--score-layer", "deterministic", "--base", str(d["mA"]), "--arm", str(d["mB/warn"])])
    assert rc == 2
    assert "no base run of its model 'org/mB'" in capsys.readouterr().err
    rc = main(["study", "--score-layer", "deterministic", "--base", str(d["mA"]), "--arm", f"warn={d['mA/warn']}", "--holm-family", "F=mA/nope"])
    assert rc == 2
    assert "unknown contrast 'mA/nope'" in capsys.readouterr().err


def test_compare_same_run_twice_is_zero_with_p_one(study_dirs, tmp_path, capsys):
    """`memtoc compare` on an arm and its copy: zero differences, p = 1, Holm p = 1, verdict FAIL (the same path
    twice is refused: one input given twice)."""
    import shutil

    run = str(study_dirs["mA/warn"])
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    assert main(["compare", run, run, "--out", str(tmp_path / "c.json")]) == 2
    assert "given twice" in capsys.readouterr().err
    assert main(["compare", run, str(twin), "--out", str(tmp_path / "c.json")]) == 0
    data = json.loads((tmp_path / "c.json").read_text())
    comps = [c for c in data["comparisons"].values() if c["n_common"] > 0]
    assert len(comps) >= 5
    for c in comps:
        assert c["delta"] == 0 and c["p_value"] == 1.0 and c["value_a"] == c["value_b"]
        assert c["p_adjusted"] == 1.0
    assert data["verdict"]["success"] is False
    assert "+0.0 [+0.0, +0.0]" in capsys.readouterr().out
