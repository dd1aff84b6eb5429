"""``memtoc report`` over a study: the study's tables (families, criterion per formulation, paired changes, the
controls' paired contrasts, z tests, stability rule) appear in the report, and a run's control rows (NoopTool, the
three error payloads) appear beside its headline rows. Constructed records, computed by hand."""

from __future__ import annotations

import json

from memtoc.cli import main
from memtoc.runs.runstore import RunStore


def _r(q: int, cond: str, *, abstain=False, kept=False, correct=False, outcome=None, cell=None) -> dict:
    cell = cell or (None if cond == "no_tool" else ("arb" if q < 10 else "both_wrong"))
    outcome = outcome or ("kept_memory" if kept else "neither")
    return {"episode_id": f"q{q}-{cond}-v0", "question_id": f"q{q}", "formulation": "reference",
            "condition": cond, "divergence_bucket": "near" if cond == "tool_wrong" else None, "cell": cell,
            "outcome": outcome, "followed_tool": outcome == "followed_tool", "kept_memory": kept,
            "final_correct": correct, "abstain": abstain, "ack_proxy": False, "trivial_hop": False}


def _records(keep: int) -> list[dict]:
    """q0..q9 memory right, q10..q19 memory wrong; the first ``keep`` arb questions keep memory under tool_wrong.
    Controls: timeout abstains on q0..q11 (12/20), permission on q10..q19 (10/20), service unavailable on all."""
    out = []
    for q in range(20):
        out.append(_r(q, "tool_wrong", kept=q < keep, correct=q < keep,
                      outcome="kept_memory" if q < keep else "followed_tool"))
        out.append(_r(q, "tool_right", outcome="followed_tool", correct=True,
                      cell="agree" if q < 10 else "tool_gold"))
        out.append(_r(q, "tool_error", abstain=True))
        out.append(_r(q, "tool_error_timeout", abstain=q < 12))
        out.append(_r(q, "tool_error_permission", abstain=q >= 10, kept=q < 10, correct=q < 10))
        out.append(_r(q, "no_tool", kept=q < 10, correct=q < 10))
        out.append(_r(q, "noop_tool", kept=q < 6, correct=q < 6))
    return out


def _run(root, model, records):
    store = RunStore.open(root, identity={"model": model, "prompt_intervention": "none", "frame": "tool"},
                          run_info={"status": "running"})
    store.episodes.append(records)
    store.update_run_info(status="complete")
    store.close()
    return root


def test_report_shows_study_tables_and_control_rows(tmp_path, capsys):
    exp = tmp_path / "exp"
    base = _run(exp / "runs" / "base", "org/mA", _records(keep=1))
    arm = _run(exp / "runs" / "warn", "org/mA", _records(keep=9))
    assert main(["study", "--score-layer", "deterministic", "--base", str(base), "--arm", f"warn={arm}", "--n-boot", "50", "--n-perm", "500",
                 "--out", str(exp / "study")]) == 0
    study = json.loads((exp / "study" / "study.json").read_text())
    assert study["tables"]["controls"], "the controls' paired contrasts are part of the study"
    assert main(["report", str(exp)]) == 0
    md = (exp / "report.md").read_text(encoding="utf-8")
    html = (exp / "report.html").read_text(encoding="utf-8")
    # the study section with its tables
    assert "Study study" in md and "Study study" in html
    assert "Asymmetric criterion per formulation and pooled" in md
    assert "Holm families (--holm-family 'arm'" in md
    assert "Control arms (control - reference)" in md
    assert "Paired changes (arm - base)" in md
    # retention 1/10 -> 9/10: a paired change of +0.8 on 10 questions, in the paired table
    paired = [r for r in study["tables"]["paired"] if r["metric"] == "retention" and r["slice"] == "pooled"]
    assert paired[0]["delta"] == 0.8 and paired[0]["n_common"] == 10
    assert "| mA/warn | mA | warn | pooled | retention | 10 | 10 | 10 | 10 | 0.1 | 0.9 | 0.8 |" in md
    # the controls' contrasts: timeout abstains 12/20 vs service unavailable 20/20 -> -0.4
    timeout = [r for r in study["tables"]["controls"] if r.get("control") == "tool_error_timeout"
               and r.get("metric_control") == "tool_error_abstention_timeout"]
    assert timeout and abs(timeout[0]["delta"] + 0.4) < 1e-12
    # each run's compact table carries its control rows beside the headline rows, computed by hand
    assert "tool_error_abstention_timeout" in md and "Err. timeout" in md
    assert "60.0% [" in md and "(12/20)" in md        # timeout abstention 12/20
    assert "noop_retention" in md and "(6/10)" in md    # NoopTool retention on arb: q0..q5 of q0..q9


def test_report_of_a_study_directory_alone(tmp_path):
    base = _run(tmp_path / "base", "org/mA", _records(keep=1))
    arm = _run(tmp_path / "warn", "org/mA", _records(keep=9))
    assert main(["study", "--score-layer", "deterministic", "--base", str(base), "--arm", f"warn={arm}", "--n-boot", "20", "--n-perm", "200",
                 "--out", str(tmp_path / "st")]) == 0
    assert main(["report", str(tmp_path / "st")]) == 0
    assert "Asymmetric criterion" in (tmp_path / "st" / "report.md").read_text(encoding="utf-8")


def test_report_of_a_study_without_arms_says_so(tmp_path):
    base = _run(tmp_path / "exp" / "base", "org/mA", _records(keep=1))
    assert main(["study", "--score-layer", "deterministic", "--base", str(base), "--n-boot", "20", "--n-perm", "200", "--out",
                 str(tmp_path / "exp" / "st")]) == 0
    assert main(["report", str(tmp_path / "exp")]) == 0
    md = (tmp_path / "exp" / "report.md").read_text(encoding="utf-8")
    assert "No arm in this study" in md and "Control arms (control - reference)" in md
    assert "|  |" not in md
