"""Model pairs get a pooled slice where both runs have every formulation (issue 46 item 4): App. F.2's 70B point
is "paired against Llama-Instruct on common support", formulation-pooled (Δ +0.133 on 185 shared questions); the
scale recipe computes that contrast itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memtoc.jobs.study.analysis import POOLED, StudySettings, run_study
from memtoc.jobs.study.runs import load_run
from tests.memtoc.jobs.study.conftest import FORMS, GOLD, build_records, qs, write_run

REPO = Path(__file__).resolve().parents[4]


def test_the_pooled_slice_pairs_every_formulations_units_on_common_support(tmp_path):
    # the anchor keeps memory on q0-q1 in every formulation; the 70B on q0-q5 (reference), q0-q3, q0-q6
    keep70 = {"reference": qs(0, 6), "paraphrase_a": qs(0, 4), "paraphrase_b": qs(0, 7)}
    anchor = load_run(write_run(tmp_path / "anchor", "org/llama-8b-instruct",
                                build_records(keep=qs(0, 2), follow=GOLD, far=False)))
    big = load_run(write_run(tmp_path / "big", "org/llama-70b-awq",
                             build_records(keep=keep70, follow=GOLD, far=False)))
    study = run_study([anchor, big], [], StudySettings(n_boot=200, n_perm=999,
                                                       model_pairs=("llama-8b-instruct:llama-70b-awq",)))
    (pooled,) = [r for r in study.model_pairs if r["slice"] == POOLED and r["metric"] == "retention"]
    a = np.array([[float(q in qs(0, 2)) for q in qs(0, 10)] for _ in FORMS])
    b = np.array([[float(q in keep70[f]) for q in qs(0, 10)] for f in FORMS])
    assert pooled["n_common"] == 30 and pooled["delta"] == pytest.approx(float(np.mean(b - a)))
    # 5 questions differ, all one way: the sign-flip p is at its floor 2 / 2**5 (questions are the clusters)
    assert pooled["ci_low"] <= pooled["delta"] <= pooled["ci_high"] and pooled["p"] == pytest.approx(1 / 16, abs=0.01)
    # a run made on one formulation only: no pooled row for its pair
    ref_only = [r for r in build_records(keep=qs(0, 5), follow=GOLD, far=False) if r["formulation"] == "reference"]
    one = load_run(write_run(tmp_path / "one", "org/base-8b", ref_only))
    study = run_study([anchor, one], [], StudySettings(n_boot=20, n_perm=99, model_pairs=("base-8b:llama-8b-instruct",)))
    assert {r["slice"] for r in study.model_pairs} == {"reference"}


def test_the_scale_recipe_pairs_the_70b_with_llama_instruct_pooled():
    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(REPO / "experiments" / "analyses" / "scale_70b.toml")
    steps = {st.name: st for st in recipe.steps}
    assert steps["anchor"].args["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    pair = steps["study_pair"]
    assert pair.args["model_pair"] == "${anchor}:${standard}" and pair.args["score_layer"] == "judged"
    assert {"${anchor}", "${standard}"} <= set(pair.positional)
