"""The scorer-vs-human outcome validation round (the paper's 167 responses, kappa 0.806, per-class recall):
export a blinded sheet stratified by the scorer's class, read labels back; kappa checked against sklearn."""

from __future__ import annotations

import csv
import json

import pytest
from sklearn.metrics import cohen_kappa_score

from memtoc.cli import main
from memtoc.core.errors import BenchmarkDataError, MemtocError
from memtoc.scoring.judge.ack import cohen_kappa
from memtoc.scoring.judge.outcomes import OUTCOME_CLASSES, import_outcome_labels, scorer_class
from memtoc.runs.runstore import RunStore


def _rec(i, outcome, subtype=None):
    return {"episode_id": f"e{i}", "question_id": f"q{i}", "formulation": "reference", "condition": "tool_wrong",
            "divergence_bucket": "near", "cell": "arb", "outcome": outcome, "neither_subtype": subtype,
            "abstain": subtype == "abstain", "mem_absent": False, "memory_span": "Harry Morgan",
            "tool_value": "McLean Stevenson", "question": f"question {i}?", "response": f"FINAL: reply {i}",
            "followed_tool": outcome in ("both", "followed_tool"), "kept_memory": outcome in ("both", "kept_memory"),
            "final_correct": outcome == "kept_memory"}


@pytest.fixture
def run(tmp_path):
    recs = ([_rec(i, "followed_tool") for i in range(6)] + [_rec(i, "kept_memory") for i in range(6, 10)]
            + [_rec(i, "neither", "abstain") for i in range(10, 13)] + [_rec(i, "neither", "other")
                                                                           for i in range(13, 15)])
    store = RunStore.open(tmp_path / "run", identity={"model": "m"}, run_info={"config": {"model": "m"}})
    store.episodes.append(recs)
    return tmp_path / "run", {r["episode_id"]: scorer_class(r) for r in recs}


def _label(sheet, key, human_of):
    k = json.loads(key.read_text())["items"]
    rows = list(csv.DictReader(sheet.open(encoding="utf-8")))
    assert "outcome" in rows[0] and "scorer_class" not in rows[0] and "arm" not in rows[0]     # blinded
    for r in rows:
        r["outcome"] = human_of(k[r["item_id"]]["scorer_class"], k[r["item_id"]]["episode_id"])
    with sheet.open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return k


def test_round_trip_gives_kappa_and_per_class_recall(tmp_path, run, capsys):
    run_dir, _ = run
    sheet, key = tmp_path / "sheet.csv", tmp_path / "sheet.key.json"
    assert main(["outcome-round", "export", str(run_dir), "--sheet", str(sheet), "--per-stratum", "10"]) == 0
    # the human reads two of the scorer's abstentions as kept memory (e10, e11) and one "other" as abstain
    flips = {"e10": "kept_memory", "e11": "kept_memory", "e13": "abstain"}
    k = _label(sheet, key, lambda cls, eid: flips.get(eid, cls))
    assert len(k) == 15
    out_path = tmp_path / "res.json"
    assert main(["outcome-round", "import", str(key), "--labels", str(sheet), "--out", str(out_path)]) == 0
    res = json.loads(out_path.read_text())
    ids = sorted(k)
    human = [flips.get(k[i]["episode_id"], k[i]["scorer_class"]) for i in ids]
    scorer = [k[i]["scorer_class"] for i in ids]
    assert res["cohen_kappa"] == pytest.approx(cohen_kappa_score(human, scorer))
    assert res["recall"]["followed_tool"] == 1.0
    assert res["recall"]["kept_memory"] == pytest.approx(4 / 6)     # 2 of the 6 human kept-memory the scorer missed
    assert res["recall"]["abstain"] == pytest.approx(1 / 2)         # human abstain: e12 (scorer abstain), e13 (other)
    assert res["confusion"]["kept_memory"]["abstain"] == 2 and res["n"] == 15
    assert res["recall"]["both"] is None                            # no human label in that class


def test_two_annotators_agree_before_the_scorer_is_read(tmp_path, run):
    run_dir, _ = run
    sheet, key = tmp_path / "a.csv", tmp_path / "a.key.json"
    assert main(["outcome-round", "export", str(run_dir), "--sheet", str(sheet), "--key", str(key)]) == 0
    sheet_b = tmp_path / "b.csv"
    sheet_b.write_bytes(sheet.read_bytes())
    _label(sheet, key, lambda cls, eid: cls)
    _label(sheet_b, key, lambda cls, eid: "other" if eid == "e0" else cls)
    res = import_outcome_labels(key, [sheet, sheet_b])
    a = [json.loads(key.read_text())["items"][i]["scorer_class"] for i in sorted(json.loads(key.read_text())["items"])]
    assert res["n_disagreements_excluded"] == 1 and res["n"] == 14 and res["cohen_kappa"] == 1.0
    assert res["annotators"]["n"] == 15 and 0 < res["annotators"]["cohen_kappa"] < 1
    assert cohen_kappa(a, a) == 1.0 and set(OUTCOME_CLASSES) >= set(a)


def test_a_bad_label_names_the_file_row_and_field(tmp_path, run):
    run_dir, _ = run
    sheet, key = tmp_path / "s.csv", tmp_path / "s.key.json"
    assert main(["outcome-round", "export", str(run_dir), "--sheet", str(sheet)]) == 0
    _label(sheet, key, lambda cls, eid: "tool" if eid == "e0" else cls)
    with pytest.raises(BenchmarkDataError, match="field 'outcome'"):
        import_outcome_labels(key, [sheet])


@pytest.fixture
def labelled(tmp_path, run):
    """An exported sheet labelled as the scorer did, and its key."""
    sheet, key = tmp_path / "s.csv", tmp_path / "s.key.json"
    assert main(["outcome-round", "export", str(run[0]), "--sheet", str(sheet)]) == 0
    _label(sheet, key, lambda cls, eid: cls)
    return sheet, key


def test_an_excel_bom_sheet_is_read(labelled, capsys):
    sheet, key = labelled
    sheet.write_bytes(b"\xef\xbb\xbf" + sheet.read_bytes())         # Excel's "CSV UTF-8"
    capsys.readouterr()
    assert main(["outcome-round", "import", str(key), "--labels", str(sheet)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_labelled"] == [15] and res["cohen_kappa"] == 1.0


def _bad(case, sheet, key):
    """Spoil the labelled sheet or key as ``case`` says; the (key, sheets) to import."""
    if case == "duplicate":                         # last-wins used to hide a second, conflicting label
        lines = sheet.read_text(encoding="utf-8").splitlines(keepends=True)
        sheet.write_text("".join(lines) + lines[3].rstrip().rsplit(",", 1)[0] + ",both\r\n", encoding="utf-8")
    elif case == "latin-1":
        text = sheet.read_text(encoding="utf-8").replace("question 0?", "qu\u00e9stion 0?")
        sheet.write_bytes(text.encode("latin-1"))
    elif case == "sheet-as-key":                    # a copy: the same path twice is "given twice"
        copy = sheet.with_name("sheet_as_key.csv")
        copy.write_bytes(sheet.read_bytes())
        return copy, [sheet]
    elif case == "broken-key":
        key.write_text(key.read_text()[:-10])
    elif case == "same-sheet-twice":
        return key, [sheet, sheet]
    return key, [sheet]


@pytest.mark.parametrize("case, needles", [
    ("duplicate", ["row 17, field 'item_id'", "appears twice (first on row 4)"]),
    ("latin-1", ["s.csv: not a UTF-8 CSV annotation sheet (UnicodeDecodeError)"]),
    ("sheet-as-key", ["sheet_as_key.csv: not an annotation key", "the key is the .key.json file"]),
    ("broken-key", ["s.key.json: not an annotation key", "JSONDecodeError"]),
    ("same-sheet-twice", ["given twice"])])
def test_bad_files_are_refused_in_one_line(labelled, capsys, case, needles):
    key, sheets = _bad(case, *labelled)
    with pytest.raises(MemtocError) as exc:
        import_outcome_labels(key, sheets)
    assert len(str(exc.value).splitlines()) == 1 and all(n in str(exc.value) for n in needles), str(exc.value)
    capsys.readouterr()
    assert main(["outcome-round", "import", str(key), *[a for s in sheets for a in ("--labels", str(s))]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and all(n in err for n in needles), err


def test_each_round_refuses_the_other_rounds_key_in_one_line(labelled, capsys):
    """An outcome-round key given to ``memtoc ack import`` (whose items have no detector flags) is one line naming
    the schema, not a KeyError; and an ack key to ``outcome-round import`` likewise."""
    sheet, key = labelled
    capsys.readouterr()
    assert main(["ack", "import", str(key), "--labels", str(sheet)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a key written by `memtoc ack export`" in err, err
    doc = json.loads(key.read_text(encoding="utf-8"))
    key.write_text(json.dumps({**doc, "schema": "memtoc-ack-key-v1"}), encoding="utf-8")
    assert main(["outcome-round", "import", str(key), "--labels", str(sheet)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a key written by `memtoc outcome-round export`" in err, err
