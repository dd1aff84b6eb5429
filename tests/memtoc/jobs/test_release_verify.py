"""``memtoc verify-release`` on a small fake release tree whose expected values are worked out by hand.

The fake release has one model (gemma-2-9b-it, summary key ``gemma``) in three formulations, 10 questions x 5
conditions each. Its ``aggregate_v1`` blocks and ``arm_metrics.json`` store the hand-computed values, except two
cells set deliberately off, which must be flagged and nothing else. The release's own sample file checks the
layout against counts taken directly from its records.
"""

from __future__ import annotations

import json
import shutil

import pytest

from memtoc.cli import main
from memtoc.jobs.release_verify import verify_release

MODEL = "gemma-2-9b-it"
FORMS = ("reference", "paraphrase_a", "paraphrase_b")
# per formulation: arb questions kept (of q0..q2; q3 is 'both'), both_wrong followed (of q4..q7),
# tool_gold followed (of q4..q9), tool_error abstained (of q0..q9)
PLAN = {"reference": (2, 3, 5, 7), "paraphrase_a": (1, 1, 6, 10), "paraphrase_b": (3, 2, 3, 4)}
EXPECTED = {  # (Ret., Tool, Wrong, Err.) by hand
    "reference": (2 / 4, 5 / 6, 3 / 4, 7 / 10),
    "paraphrase_a": (1 / 4, 6 / 6, 1 / 4, 10 / 10),
    "paraphrase_b": (3 / 4, 3 / 6, 2 / 4, 4 / 10),
}


def _rec(i, pv, cond, cell, outcome, abstain=False):
    return {"episode_id": f"{i}-0-{cond}-v{pv}", "condition": cond, "cell": cell,
            "divergence_bucket": "near" if cond == "tool_wrong" else None, "outcome": outcome,
            "followed_tool": outcome in ("both", "followed_tool"), "kept_memory": outcome in ("both", "kept_memory"),
            "final_correct": False, "abstain": abstain, "ack_proxy": outcome == "both", "neither_subtype": None}


def _records(form):
    pv = FORMS.index(form)
    keep, wrong, follow, abst = PLAN[form]
    out = []
    for i in range(10):
        cell_w = "arb" if i < 4 else "both_wrong" if i < 8 else "mem_absent"
        if i < 3:
            o = "kept_memory" if i < keep else "followed_tool"
        elif i == 3:
            o = "both"
        elif i < 8:
            o = "followed_tool" if i < 4 + wrong else "neither"
        else:
            o = "followed_tool"
        out.append(_rec(i, pv, "tool_wrong", cell_w, o))
        cell_r = "agree" if i < 4 else "tool_gold"
        out.append(_rec(i, pv, "tool_right", cell_r, "followed_tool" if i < 4 or i < 4 + follow else "neither"))
        out.append(_rec(i, pv, "tool_error", cell_w, "neither", abstain=i < abst))
        out.append(_rec(i, pv, "no_tool", None, "kept_memory"))
        out.append(_rec(i, pv, "no_conflict", cell_r, "followed_tool"))
    return out


def _aggregate(form, err_offset=0.0):
    ret, tool, wrong, err = EXPECTED[form]
    agg = {c: {"n": 10, "cells": {}} for c in ("tool_right", "tool_wrong", "tool_error", "no_tool", "no_conflict")}
    agg["tool_right"]["cells"]["tool_gold"] = {"n": 6, "followed_tool": tool}
    agg["tool_wrong"]["cells"]["both_wrong"] = {"n": 4, "followed_tool": wrong}
    agg["tool_error"]["abstain_rate"] = err + err_offset
    return agg


@pytest.fixture
def release(tmp_path):
    root = tmp_path / "memtoc"
    folder = root / "results" / "scored_episodes"
    folder.mkdir(parents=True)
    arm = {"judged": {"gemma": {}}, "det": {"gemma": {}}}
    for form in FORMS:
        off = 0.02 if form == "paraphrase_b" else 0.0           # deliberately off: aggregate Err. of paraphrase_b
        (folder / f"{MODEL}_{form}.json").write_text(json.dumps(
            {"meta": {}, "aggregate_v1": _aggregate(form, off), "scored": _records(form)}))
        ret, tool, wrong, err = EXPECTED[form]
        cell = {"keep_strict": round(ret, 4), "tool_gold_follow": round(tool, 4),
                "prior_bw": round(wrong + (0.05 if form == "paraphrase_a" else 0.0), 4),  # deliberately off
                "te_abstain": round(err, 4), "n_arb": 4, "n_bw": 4}
        arm["judged"]["gemma"][f"canonical_pv{FORMS.index(form)}"] = cell
        arm["det"]["gemma"][f"canonical_pv{FORMS.index(form)}"] = {**cell, "prior_bw": round(wrong, 4)}
    (root / "results" / "summaries").mkdir()
    (root / "results" / "summaries" / "arm_metrics.json").write_text(json.dumps(arm))
    return root


def test_recomputed_columns_match_hand_values(release):
    rep = verify_release(release)
    rows = {(r["formulation"], r["column"]): r for r in rep["rows"]}
    assert len(rows) == 12
    for form, values in EXPECTED.items():
        for col, v in zip(("Ret.", "Tool", "Wrong", "Err."), values):
            assert rows[(form, col)]["ours"] == pytest.approx(v), (form, col)
    assert (rows[("reference", "Ret.")]["k"], rows[("reference", "Ret.")]["n"]) == (2, 4)  # 'both' is not kept


def test_only_the_deliberately_wrong_cells_are_flagged(release):
    rep = verify_release(release)
    flagged = {(r["formulation"], r["column"]) for r in rep["rows"] if r["status"] == "DIFF"}
    assert flagged == {("paraphrase_a", "Wrong"), ("paraphrase_b", "Err.")}
    assert all(r["status"] == "ok" for r in rep["rows"] if (r["formulation"], r["column"]) not in flagged
               and r["column"] != "Ret.")
    # Ret. is stored only in arm_metrics (aggregate_v1 keeps the kept_memory flag, which counts 'both')
    assert all(r["status"] == "ok" and r["stored_aggregate_v1"] is None for r in rep["rows"] if r["column"] == "Ret.")
    pooled = {p["column"]: p for p in rep["pooled"]}
    assert pooled["Wrong"]["status"] == "DIFF" and pooled["Err."]["status"] == "ok"
    assert pooled["Ret."]["ours_pooled"] == pytest.approx((0.5 + 0.25 + 0.75) / 3)
    assert rep["n_differences"] == 3
    # the det channel stores the right prior_bw: only the aggregate cell is left
    rep_det = verify_release(release, channel="det")
    assert {(r["formulation"], r["column"]) for r in rep_det["rows"] if r["status"] == "DIFF"} == \
        {("paraphrase_b", "Err.")}


def test_cli_prints_flags_and_exits_1(release, tmp_path, capsys):
    out_json = tmp_path / "v.json"
    assert main(["verify-release", str(release), "--json", str(out_json), "--csv", str(tmp_path / "v.csv")]) == 1
    text = capsys.readouterr().out
    assert "3 difference(s) flagged" in text
    line = next(ln for ln in text.splitlines() if "paraphrase_a" in ln and "Wrong" in ln)
    assert "25.00 (1/4)" in line and "30.00" in line and line.rstrip().endswith("DIFF")
    assert json.loads(out_json.read_text())["n_differences"] == 3
    assert (tmp_path / "v.csv").read_text().startswith("model,")


def test_clean_release_exits_0(release, capsys):
    arm_path = release / "results" / "summaries" / "arm_metrics.json"
    arm = json.loads(arm_path.read_text())
    arm["judged"]["gemma"]["canonical_pv1"]["prior_bw"] = 0.25
    arm_path.write_text(json.dumps(arm))
    p = release / "results" / "scored_episodes" / f"{MODEL}_paraphrase_b.json"
    data = json.loads(p.read_text())
    data["aggregate_v1"]["tool_error"]["abstain_rate"] = 0.4
    p.write_text(json.dumps(data))
    assert main(["verify-release", str(release)]) == 0
    assert "no differences" in capsys.readouterr().out


def test_bad_inputs_name_the_file_row_and_field(tmp_path, release, capsys):
    assert main(["verify-release", str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err      # the path contract, before the release is read
    (tmp_path / "empty").mkdir()
    assert main(["verify-release", str(tmp_path / "empty")]) == 2
    assert "no results/scored_episodes" in capsys.readouterr().err
    p = release / "results" / "scored_episodes" / f"{MODEL}_reference.json"
    data = json.loads(p.read_text())
    del data["scored"][4]["cell"]
    p.write_text(json.dumps(data))
    assert main(["verify-release", str(release)]) == 2
    err = capsys.readouterr().err
    assert p.name in err and "row 5" in err and "'cell'" in err


def test_release_sample_layout(shared_memtoc, tmp_path):
    """The release's sample file (10 of 2,710 records): counts taken straight from its records; marked partial."""
    folder = tmp_path / "rel" / "results" / "scored_episodes"
    folder.mkdir(parents=True)
    sample = shared_memtoc / "sample_scored_qwen2.5-7b-instruct_reference.json"
    shutil.copy(sample, folder / "qwen2.5-7b-instruct_reference.json")
    recs = json.loads(sample.read_text())["scored"]
    rep = verify_release(tmp_path / "rel")
    rows = {r["column"]: r for r in rep["rows"]}

    def kn(cond, cells, field):
        sel = [r for r in recs if r["condition"] == cond and r["cell"] in cells]
        return sum(bool(r[field]) for r in sel), len(sel)

    assert (rows["Tool"]["k"], rows["Tool"]["n"]) == kn("tool_right", ("tool_gold",), "followed_tool")
    assert (rows["Wrong"]["k"], rows["Wrong"]["n"]) == kn("tool_wrong", ("both_wrong",), "followed_tool")
    err = [r for r in recs if r["condition"] == "tool_error"]
    assert (rows["Err."]["k"], rows["Err."]["n"]) == (sum(r["abstain"] for r in err), len(err))
    assert all(r["status"] in ("partial file", "no stored value") for r in rep["rows"])
    assert rep["n_differences"] == 0


# -- what verify-release cannot vouch for is one line and exit 2 (could not verify), never exit 1 --------------

def _edit_scored(release, form, change):
    p = release / "results" / "scored_episodes" / f"{MODEL}_{form}.json"
    data = json.loads(p.read_text())
    change(data)
    p.write_text(json.dumps(data))
    return p


@pytest.mark.parametrize("change, needle", [
    (lambda d: d.update(aggregate_v1="n=50"), "field 'aggregate_v1'"),
    (lambda d: d["scored"][0].update(followed_tool="False"), "row 1, field 'followed_tool'"),
    (lambda d: d["scored"][2].update(abstain="true"), "row 3, field 'abstain'"),
    (lambda d: d["scored"][1].update(condition="tool_rite"), "row 2, field 'condition'"),
    (lambda d: d["scored"][0].update(cell="arbitration"), "row 1, field 'cell'"),
    (lambda d: d["scored"][0].update(outcome="followed"), "row 1, field 'outcome'"),
], ids=["aggregate-string", "bool-string", "abstain-string", "unknown-condition", "unknown-cell",
        "unknown-outcome"])
def test_unusable_records_are_could_not_verify(release, capsys, change, needle):
    p = _edit_scored(release, "reference", change)
    assert main(["verify-release", str(release)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and p.name in err and needle in err, err


def test_binary_files_and_a_list_summary_are_could_not_verify(release, capsys):
    arm = release / "results" / "summaries" / "arm_metrics.json"
    good = arm.read_text()
    arm.write_text("[]")                                        # used to read as "no stored value"
    assert main(["verify-release", str(release)]) == 2
    assert "arm_metrics.json: expected an object" in capsys.readouterr().err
    arm.write_text(good)
    p = release / "results" / "scored_episodes" / f"{MODEL}_reference.json"
    p.write_bytes(bytes(range(256)) * 8)
    assert main(["verify-release", str(release)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and p.name in err and "not a UTF-8 JSON file" in err


def test_unknown_file_names_are_reported(release, capsys):
    folder = release / "results" / "scored_episodes"
    (folder / "whatever.json").write_text("{}")
    shutil.copy(folder / f"{MODEL}_reference.json", folder / f"{MODEL}_paraphrase_c.json")
    rep = verify_release(release)
    assert rep["skipped_files"] == [f"{MODEL}_paraphrase_c.json", "whatever.json"]
    assert main(["verify-release", str(release)]) == 1                        # the deliberate differences
    out = capsys.readouterr().out
    assert f"skipped: {MODEL}_paraphrase_c.json, whatever.json" in out


def test_nothing_to_compare_is_could_not_verify(release, capsys):
    (release / "results" / "summaries" / "arm_metrics.json").write_text("{}")
    for form in FORMS:
        _edit_scored(release, form, lambda d: d.update(aggregate_v1={}))
    assert main(["verify-release", str(release)]) == 2
    assert "COULD NOT VERIFY" in capsys.readouterr().out
