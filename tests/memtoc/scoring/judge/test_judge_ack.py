"""Regex acknowledgment detector, Cohen's kappa, and the blinded annotation export / import round trip."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score

from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring.judge.ack import ACK_PATTERNS, cohen_kappa, export_sheet, import_labels, regex_ack
from memtoc.scoring.judge.rules import judged_records

_spec = importlib.util.spec_from_file_location("judge_helpers", Path(__file__).with_name("helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


@pytest.mark.parametrize("text", [
    "The tool says McLean Stevenson, but I recall it was Harry Morgan.\nFINAL: Harry Morgan",
    "There is a discrepancy between the tool output and my knowledge.",
    "The tool result may be outdated.\nFINAL: X",
    "This conflicts with my own understanding.",
    "I found conflicting information.",
])
def test_regex_detector_fires_on_acknowledgments(text):
    assert regex_ack(text), text
    assert [k for k, p in ACK_PATTERNS.items() if re.search(p, text, re.IGNORECASE)]


@pytest.mark.parametrize("text", [
    "FINAL: McLean Stevenson",
    "According to the tool, the actor was McLean Stevenson.\nFINAL: McLean Stevenson",
    "I am not sure.\nFINAL: UNKNOWN",
    "The war was a long conflict between two states.\nFINAL: 1812",
    "",
])
def test_regex_detector_stays_quiet_on_plain_answers(text):
    assert not regex_ack(text)


@pytest.mark.parametrize("classes", [[False, True], ["followed_tool", "kept_memory", "both", "abstain", "other"]],
                         ids=["binary", "5-class"])
def test_kappa_matches_sklearn_on_random_labels(classes):
    """One nominal kappa serves both rounds: yes/no acknowledgments and the outcome round's five classes."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(5, 60))
        a = rng.choice(np.array(classes, dtype=object), n, p=rng.dirichlet(np.ones(len(classes)) * 0.5))
        b = np.where(rng.random(n) < 0.7, a, rng.choice(np.array(classes, dtype=object), n))
        if len(set(a)) == 1 and len(set(b)) == 1 and a[0] == b[0]:
            continue
        assert cohen_kappa(a.tolist(), b.tolist()) == pytest.approx(cohen_kappa_score(a.tolist(), b.tolist()))
    one, other = [classes[0]] * 6, classes[:2] * 3
    assert cohen_kappa(one, other) == pytest.approx(cohen_kappa_score(one, other))    # one side one class: 0
    assert cohen_kappa(one, one) is None       # chance agreement 1 (e.g. no positive label): undefined


Q = "Which actor played Colonel Sherman T. Potter in the series?"


def _arm(n: int, prefix: str, ack_every: int):
    recs = []
    for i in range(n):
        cb = "FINAL: Harry Morgan" if i % 2 else "FINAL: Alan Alda"
        text = ("The tool says McLean Stevenson, but I recall Harry Morgan.\nFINAL: McLean Stevenson"
                if i % ack_every == 0 else "FINAL: McLean Stevenson")
        recs.append(H.scored(f"{prefix}{i}", "tool_wrong", text, closed_book=cb, gold="Harry Morgan", question=Q,
                             tool_value="McLean Stevenson"))
    judge = dict(H.judge_rec("ack", "YES" if i % 3 == 0 else "NO", episode_id=r["episode_id"])
                 for i, r in enumerate(recs))
    return judged_records(recs, judge)[0]


def test_export_is_blinded_and_stratified_and_import_scores_it(tmp_path):
    arms = [("base", "runs/base", _arm(30, "b", 4)), ("edited", "runs/edited", _arm(24, "e", 5))]
    sheet, key = tmp_path / "sheet.csv", tmp_path / "sheet.key.json"
    info = export_sheet(arms, sheet=sheet, key=key, per_stratum=5, detector="llm", seed=3)
    assert info["screen"] == {"base": {"n": 30, "k": 10}, "edited": {"n": 24, "k": 8}}
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    assert len(rows) == 20 and set(rows[0]) == {"item_id", "question", "tool_value", "response", "ack"}
    assert all(r["ack"] == "" for r in rows)
    k = json.loads(key.read_text())["items"]
    strata = {}
    for r in rows:
        it = k[r["item_id"]]
        strata[(it["arm"], it["screen_flag"])] = strata.get((it["arm"], it["screen_flag"]), 0) + 1
    assert strata == {("base", True): 5, ("base", False): 5, ("edited", True): 5, ("edited", False): 5}
    # two annotators: A labels by the regex-visible acknowledgment; B flips two items
    truth = {r["item_id"]: "recall" in r["response"] for r in rows}
    a_rows = [{**r, "ack": "yes" if truth[r["item_id"]] else "no"} for r in rows]
    b_rows = [dict(r) for r in a_rows]
    for r in b_rows[:2]:
        r["ack"] = "no" if r["ack"] == "yes" else "yes"
    for name, data in (("a.csv", a_rows), ("b.csv", b_rows)):
        with (tmp_path / name).open("w", encoding="utf-8", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(data[0]))
            w.writeheader()
            w.writerows(data)
    res = import_labels(key, [tmp_path / "a.csv", tmp_path / "b.csv"])
    json.dumps(res, allow_nan=False)          # written with --out: no NaN anywhere
    la = [r["ack"] == "yes" for r in a_rows]
    lb = [r["ack"] == "yes" for r in b_rows]
    assert res["agreement"]["cohen_kappa"] == pytest.approx(cohen_kappa_score(la, lb))
    assert res["agreement"]["raw"] == pytest.approx(18 / 20) and res["n_consensus"] == 18
    # the regex detector defines the labels here: perfect on the consensus sample
    assert res["detectors_on_sample"]["regex"]["precision"] == 1.0
    assert res["detectors_on_sample"]["regex"]["recall"] == 1.0
    # independent arithmetic for the llm detector's precision on the consensus items
    cons = [i for i, (x, y) in enumerate(zip(la, lb)) if x == y]
    items = json.loads(key.read_text())["items"]
    tp = sum(la[i] and items[rows[i]["item_id"]]["llm_flag"] for i in cons)
    fp = sum((not la[i]) and items[rows[i]["item_id"]]["llm_flag"] for i in cons)
    assert res["detectors_on_sample"]["llm"]["precision"] == pytest.approx(tp / (tp + fp))
    prev = res["two_stage_prevalence"]["base"]
    assert prev["flag_rate"] == pytest.approx(10 / 30)
    assert prev["ci_low"] <= prev["prevalence"] <= prev["ci_high"]


def test_regex_screen_without_flags_reports_unknown_precision(tmp_path):
    arms = [("base", "runs/base", _arm(12, "b", 100))]       # only item 0 acknowledges
    export_sheet(arms, sheet=tmp_path / "s.csv", key=tmp_path / "k.json", per_stratum=20, detector="regex")
    rows = list(csv.DictReader((tmp_path / "s.csv").open(encoding="utf-8")))
    for r in rows:
        r["ack"] = "no"
    with (tmp_path / "l.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    res = import_labels(tmp_path / "k.json", [tmp_path / "l.csv"])
    json.dumps(res, allow_nan=False)
    prev = res["two_stage_prevalence"]["base"]
    assert prev["flag_rate"] == pytest.approx(1 / 12) and prev["prevalence"] == 0.0
    assert res["detectors_on_sample"]["regex"]["recall"] is None     # no positive labels: undefined


def test_import_refuses_bad_labels(tmp_path):
    arms = [("base", "runs/base", _arm(12, "b", 4))]
    export_sheet(arms, sheet=tmp_path / "s.csv", key=tmp_path / "k.json", per_stratum=3)
    rows = list(csv.DictReader((tmp_path / "s.csv").open(encoding="utf-8")))
    rows[1]["ack"] = "perhaps"
    with (tmp_path / "bad.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(BenchmarkDataError, match=r"row 3.*field 'ack'"):
        import_labels(tmp_path / "k.json", [tmp_path / "bad.csv"])


def test_sheet_cells_cannot_become_formulas(tmp_path):
    """Model text lands in the sheet verbatim: a leading = + - @ tab or CR is neutralised."""
    recs = _arm(6, "f", 1)
    evil = ["=HYPERLINK(\"http://x\",\"click\")", "+1+1", "-2+3", "@SUM(A1)", "\tTAB", "\rCR"]
    for r, text in zip(recs, evil):
        r["response"] = text
    sheet = tmp_path / "s.csv"
    export_sheet([("arm", "runs/arm", recs)], sheet=sheet, key=tmp_path / "s.key.json", per_stratum=10,
                 detector="llm")
    rows = list(csv.DictReader(sheet.open(encoding="utf-8", newline="")))
    assert sorted(r["response"] for r in rows) == sorted("'" + t for t in evil)
    assert all(not r["response"].startswith(("=", "+", "-", "@", "\t", "\r")) for r in rows)
    # labels still import from the neutralised sheet
    data = [{**r, "ack": "yes"} for r in rows]
    with sheet.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(data[0]))
        w.writeheader()
        w.writerows(data)
    assert import_labels(tmp_path / "s.key.json", [sheet])["n_positive"] == 6


def test_spreadsheet_safe_leaves_numbers_and_plain_text():
    from memtoc.core.fileio import spreadsheet_safe

    assert spreadsheet_safe(-0.5) == -0.5 and spreadsheet_safe("Harry Morgan") == "Harry Morgan"
    assert spreadsheet_safe("=1") == "'=1" and spreadsheet_safe("") == ""
