"""The paper's Holm families, declared once: family B pooled over the three formulations (12 members),
the planned base-vs-instruct z family (4 members of 10 pairs), no pooled base-vs-instruct slice; Holm p checked
against statsmodels' ``multipletests`` as an independent reference."""

from __future__ import annotations

import pytest
from statsmodels.stats import multitest

from memtoc.jobs.study.analysis import POOLED, StudySettings, run_study
from memtoc.jobs.study.families import DECLARED_FAMILIES, FamilyError, resolve_families
from memtoc.jobs.study.runs import load_run

INSTRUCT = ("mI1", "mI2", "mI3", "mI4")
ARMS = {"warn": "warn", "prior": "source-priority", "flag": "abstain-and-flag"}


@pytest.fixture(scope="module")
def prompting_runs(tmp_path_factory):
    """Four instruct models, each with a base run and the three prompting arms, all three formulations."""
    from tests.memtoc.jobs.study.conftest import GOLD, build_records, qs, write_run
    root = tmp_path_factory.mktemp("family_b")
    bases, arms = [], []
    for i, m in enumerate(INSTRUCT):
        bases.append(load_run(write_run(root / f"{m}_base", f"org/{m}", build_records(keep=qs(0, 2), follow=GOLD,
                                                                                         far=False))))
        for j, (label, intervention) in enumerate(ARMS.items()):
            keep = qs(0, 2 + (i + j) % 7)             # gains of 0..6 questions: some significant, some not
            path = write_run(root / f"{m}_{label}", f"org/{m}", build_records(keep=keep, follow=GOLD, far=False),
                             prompt_intervention=intervention)
            arms.append(__import__("dataclasses").replace(load_run(path), label=label))
    return bases, arms


def test_family_b_pooled_over_formulations_has_twelve_members(prompting_runs):
    bases, arms = prompting_runs
    study = run_study(bases, arms, StudySettings(family="B", n_boot=20, n_perm=400))
    assert list(study.families) == ["B"] and len(study.families["B"]) == 12
    pooled = [r for r in study.paired if r["slice"] == POOLED and r["metric"] == "retention"]
    assert len(pooled) == 12 and {r["family"] for r in pooled} == {"B"}
    ref = multitest.multipletests([r["p"] for r in pooled], method="holm")[1]
    assert [r["p_holm"] for r in pooled] == pytest.approx(list(ref))
    # each formulation is its own family of the same 12 contrasts (Table 5: "each slice's own family")
    ref_rows = [r for r in study.paired if r["slice"] == "reference" and r["metric"] == "retention"]
    assert [r["p_holm"] for r in ref_rows] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in ref_rows], method="holm")[1]))


def test_declared_families_choose_members_by_arm_and_refuse_undeclared_names(prompting_runs, study_dirs):
    from memtoc.jobs.study.runs import pair_contrasts
    bases, arms = prompting_runs
    cs = pair_contrasts(bases, arms)
    assert DECLARED_FAMILIES["B"].size == 12 == len(resolve_families("B", cs)["B"])
    with pytest.raises(FamilyError, match="'finetune'.*no member.*sft, dpo") as exc:
        resolve_families("finetune", cs)
    assert "\n" not in str(exc.value)
    with pytest.raises(FamilyError, match="not declared") as exc:
        resolve_families("B12", cs)
    assert "\n" not in str(exc.value)
    with pytest.raises(FamilyError, match="not declared for the paired table"):
        resolve_families("z-planned", cs)
    policy = DECLARED_FAMILIES["overreliance-policy"]
    assert (policy.size, policy.draws) == (42, (10000, 20000, 20260918))


@pytest.fixture(scope="module")
def five_models(tmp_path_factory):
    """A base model and four instruct models (base runs only), keepQ retention spread across models."""
    from tests.memtoc.jobs.study.conftest import GOLD, build_records, qs, write_run
    root = tmp_path_factory.mktemp("five")
    keeps = {"base": 1, "mI1": 9, "mI2": 6, "mI3": 5, "mI4": 3}
    return [load_run(write_run(root / m, f"org/{m}", build_records(keep=qs(0, k), follow=GOLD, far=False)))
            for m, k in keeps.items()]


def test_planned_z_family_is_base_vs_each_instruct_four_members(five_models):
    pairs = tuple(f"base:{m}" for m in INSTRUCT)
    study = run_study(five_models, [], StudySettings(n_boot=5, n_perm=5, model_pairs=pairs))
    rows = [r for r in study.ztests if r["metric"] == "retention" and r["formulation"] == "reference"]
    assert len(rows) == 10                                          # every pair of 5 models
    assert [r["p_holm"] for r in rows] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in rows], method="holm")[1]))
    planned = [r for r in rows if r["family_planned"]]
    assert len(planned) == 4 and {frozenset((r["model_a"], r["model_b"])) for r in planned} == \
        {frozenset(("base", m)) for m in INSTRUCT}
    assert [r["p_holm_planned"] for r in planned] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in planned], method="holm")[1]))
    # a smaller family: the planned Holm p is never above the all-pairs one
    assert all(r["p_holm_planned"] <= r["p_holm"] + 1e-12 for r in planned)


def test_a_model_pair_made_on_every_formulation_has_a_pooled_slice(five_models):
    """Both runs on all three formulations: the pooled slice joins (App. F.2's formulation-pooled pairing); a base
    model read on one formulation has none (the next test)."""
    study = run_study(five_models, [], StudySettings(n_boot=5, n_perm=20, model_pairs=("base:mI1",)))
    assert {r["slice"] for r in study.model_pairs} == {"reference", "paraphrase_a", "paraphrase_b", POOLED}


def test_base_model_on_one_formulation_has_no_pooled_ordering(tmp_path):
    """The base model is read on pv0 only; the release calls pooled comparisons involving it undefined (scoring.md
    §10): its stability orderings have no pooled direction (n/a, never stable); the instruct models' keep theirs, and
    the pairs are still addressed by run directory."""
    from tests.memtoc.jobs.study.conftest import GOLD, build_records, qs, write_run
    base = [r for r in build_records(keep=qs(0, 1), follow=GOLD, far=False) if r["formulation"] == "reference"]
    runs = [load_run(write_run(tmp_path / "base", "org/base", base))]
    runs += [load_run(write_run(tmp_path / m, f"org/{m}", build_records(keep=qs(0, k), follow=GOLD, far=False)))
             for m, k in (("mI1", 9), ("mI2", 4))]
    study = run_study(runs, [], StudySettings(n_boot=5, n_perm=20, model_pairs=(f"{tmp_path / 'mI1'}:base",)))
    rows = {(r["model_a"], r["model_b"]): r for r in study.stability if r["metric"] == "retention"}
    assert rows[("base", "mI1")]["reference"] == "<"
    assert rows[("base", "mI1")][POOLED] == "n/a" and not rows[("base", "mI1")]["stable"]
    assert rows[("mI1", "mI2")][POOLED] == ">" and rows[("mI1", "mI2")]["stable"]
    (rank,) = [r for r in study.rankings if r["metric"] == "retention"]
    assert rank[POOLED] is None and rank["reference"] == "mI1 > mI2 > base"
    assert {(r["pair"], r["slice"]) for r in study.model_pairs} == {("mI1:base", "reference")}


def test_presentation_family_a_is_five_models_by_two_frames_and_reverse_transfer_two_anchors(tmp_path):
    """Release family A: 5 models x {toolns, ragsnip} = 10 members per slice (the arms by label, `tool-no-schema`
    and `passage` accepted for them); the reverse-transfer family is the anchors x the FaithEval/ARC adapter."""
    import dataclasses

    from memtoc.jobs.study.runs import pair_contrasts
    from tests.memtoc.jobs.study.conftest import GOLD, build_records, qs, write_run
    bases, arms = [], []
    for i, m in enumerate(("mB", *INSTRUCT)):
        bases.append(load_run(write_run(tmp_path / f"{m}_base", f"org/{m}",
                                        build_records(keep=qs(0, 2), follow=GOLD, far=False))))
        for j, label in enumerate(("toolns", "passage", "reverse-dpo")):
            path = write_run(tmp_path / f"{m}_{label}", f"org/{m}",
                             build_records(keep=qs(0, 2 + (i + j) % 5), follow=GOLD, far=False))
            arms.append(dataclasses.replace(load_run(path), label=label))
    cs = pair_contrasts(bases, arms)
    fam_a = resolve_families("A", cs)["A"]
    assert len(fam_a) == DECLARED_FAMILIES["A"].size == 10
    assert {c.split("/")[-1] for c in fam_a} == {"toolns", "passage"}
    two = [c for c in cs if c.base_run.model_name.endswith(("mI1", "mI2"))]
    rev = resolve_families("reverse-transfer", two)["reverse-transfer"]
    assert len(rev) == DECLARED_FAMILIES["reverse-transfer"].size == 2 and all(c.endswith("/reverse-dpo") for c in rev)
    study = run_study(bases, arms, StudySettings(family="A", n_boot=20, n_perm=200))
    pooled = [r for r in study.paired if r["slice"] == POOLED and r["metric"] == "retention" and r["family"] == "A"]
    assert len(pooled) == 10
    assert [r["p_holm"] for r in pooled] == pytest.approx(
        list(multitest.multipletests([r["p"] for r in pooled], method="holm")[1]))
