"""A study knows each declared family's size (issue 46 item 3): members present vs declared are printed and
recorded; a declared family with members missing is refused unless asked for as partial by name; the per-model
recipe runs of a family combine into one study (``--experiment DIR`` per model) that computes it whole -- its
Holm p values checked against statsmodels' ``multipletests``."""

from __future__ import annotations

import json

import pytest
from statsmodels.stats import multitest

from memtoc.cli import main
from memtoc.jobs.study.analysis import POOLED
from tests.memtoc.jobs.study.conftest import GOLD, build_records, qs, write_run

MODELS = ("mI1", "mI2", "mI3", "mI4")
ARMS = {"warn": "warn", "source-priority": "source-priority", "abstain-and-flag": "abstain-and-flag"}


@pytest.fixture(scope="module")
def experiments(tmp_path_factory):
    """One per-model experiment directory each (as run-experiment leaves it: runs/ and experiment.json whose study
    step names the runs by the path run-experiment was given, here relative: exp/<model>/runs/...)."""
    root = tmp_path_factory.mktemp("family_sizes")
    out = {}
    for i, m in enumerate(MODELS):
        exp = root / m
        write_run(exp / "runs" / "standard", f"org/{m}", build_records(keep=qs(0, 2), follow=GOLD, far=False))
        argv = ["memtoc", "study", "--base", f"exp/{m}/runs/standard"]
        for j, (label, intervention) in enumerate(ARMS.items()):
            write_run(exp / "runs" / label, f"org/{m}",
                      build_records(keep=qs(0, 2 + (i + 2 * j) % 8), follow=GOLD, far=False),
                      prompt_intervention=intervention)
            argv += ["--arm", f"{label}=exp/{m}/runs/{label}"]
        argv += ["--holm-family", "B", "--partial-family", "B"]
        steps = [{"name": "standard", "command": "evaluate", "argv": ["memtoc", "evaluate"], "status": "ok"},
                 {"name": "study", "command": "study", "argv": argv, "status": "ok"}]
        (exp / "experiment.json").write_text(json.dumps({"schema_version": "memtoc-experiment-v1", "steps": steps}))
        out[m] = exp
    return out


def _study(args, out):
    return main(["study", "--score-layer", "deterministic", "--n-boot", "50", "--n-perm", "999", *args,
                 "--out", str(out)])


def test_a_per_model_study_reports_3_of_12_and_is_refused_unless_asked_partial(experiments, tmp_path, capsys):
    exp = experiments["mI1"]
    one = ["--base", str(exp / "runs" / "standard")] + [a for label in ARMS
                                                         for a in ("--arm", f"{label}={exp / 'runs' / label}")]
    assert _study([*one, "--holm-family", "B"], tmp_path / "refused") == 2
    err = capsys.readouterr().err
    assert "family 'B' has 3 of its 12 declared members" in err and "--partial-family B" in err
    assert _study([*one, "--holm-family", "B", "--partial-family", "B"], tmp_path / "one") == 0
    assert "family B: 3 of 12 declared members (partial, asked for by name)" in capsys.readouterr().out
    sizes = json.loads((tmp_path / "one" / "study.json").read_text())["family_sizes"]
    assert sizes["B"] == {"present": 3, "declared": 12, "partial": True, "asked_partial": True}


def test_the_four_per_model_experiments_combine_into_the_whole_family(experiments, tmp_path, capsys):
    args = [a for m in MODELS for a in ("--experiment", str(experiments[m]))]
    assert _study([*args, "--holm-family", "B"], tmp_path / "four") == 0
    assert "family B: 12 of 12 declared members" in capsys.readouterr().out
    study = json.loads((tmp_path / "four" / "study.json").read_text())
    assert study["family_sizes"]["B"]["present"] == 12 and not study["family_sizes"]["B"]["partial"]
    assert len(study["families"]["B"]) == 12
    for s in (POOLED, "reference"):
        rows = [r for r in study["tables"]["paired"] if r["slice"] == s and r["metric"] == "retention"]
        assert len(rows) == 12 and {r["family"] for r in rows} == {"B"}
        ref = multitest.multipletests([r["p"] for r in rows], method="holm")[1]
        assert [r["p_holm"] for r in rows] == pytest.approx(list(ref))


def test_an_output_inside_an_experiments_run_is_refused(experiments, capsys):
    exp = experiments["mI1"]
    assert _study(["--experiment", str(exp), "--holm-family", "B", "--partial-family", "B"],
                  exp / "runs" / "warn" / "study") == 2
    assert "lies in the input run" in capsys.readouterr().err


def test_an_experiment_without_a_study_step_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "experiment.json").write_text(json.dumps({"steps": []}))
    assert _study(["--experiment", str(tmp_path / "e")], tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert "no study step was run" in err and "\n" not in err
