"""App. F.1's Table 6 as the paper reads it (issue 46 item 1): retention on the elicitation set whatever pool the
frame files hold, both frames on the anchor's fixed memory-right support, and the value frame's secondary reading
on its whole pool -- on constructed runs whose passage file, value file and elicitation set all differ."""

from __future__ import annotations

import json

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episode
from memtoc.cli import main
from memtoc.core.errors import MemtocError
from memtoc.runs.runstore import RunStore
from memtoc.tasks.memtoc.evaluation import score_episode


def _row(i: int) -> dict:
    return {"id": f"c{i}", "question": f"Which option is right for question {i}?",
            "choices": [{"label": "A", "text": f"wrong{i}"}, {"label": "B", "text": f"right{i}"}],
            "answerKey": "B", "counterfactual_answerKey": "A", "context": f"Passage {i} argues for wrong{i}."}


ROWS = [_row(i) for i in range(8)]
UNANSWERABLE = {"id": "u1", "split": "unanswerable", "question": "Which colour is the wind?",
                "choices": [{"label": "A", "text": "blue"}, {"label": "B", "text": "red"}], "context": "Wind."}
# elicitation set: all 8 answerable rows (+1 unanswerable); value pool: c0-c5 (the wider pool); passage pool: c0-c3
POOLS = {"elicit": ROWS + [UNANSWERABLE], "value": ROWS[:6], "passage": ROWS[:4] + [UNANSWERABLE]}


def _write(tmp_path, name, rows):
    p = tmp_path / f"{name}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def _run(root, frame, path, answers, cb):
    """answers: item id -> tool_wrong response; cb: item id -> closed-book response (items of this file only)."""
    bench = load_benchmark(f"transfer:{frame}:{path}")
    recs, cbs = [], []
    for q in bench.questions:
        item = bench.scorer.item(q.id)
        mem = bench.scorer.memory_status(q, cb[item.id])
        ep = build_episode(q, "tool_wrong", "reference", frame="tool-no-schema")
        recs.append(bench.scorer.rescore(score_episode(ep, answers.get(item.id, "FINAL: A"), {
            "memory_span": mem.span, "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct})))
        cbs.append({"key": f"{q.id}|reference", "question_id": q.id, "formulation": "reference",
                    "memory_span": mem.span, "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct})
    store = RunStore.open(root, identity={"model": "m"}, run_info={"config": {"model": "m"}})
    store.closed_book.append(cbs)
    store.episodes.append(recs)
    return str(root)


# The base is right closed-book on c0, c1, c2, c4, c6 (the anchor's memory-right set); the arm re-elicits and is
# right on c0, c3, c4, c5, c6, c7 (it lost c1, c2, gained c3, c5, c7). Closed-book accuracy on the 8-item
# elicitation set: base 5/8, arm 6/8 -> +0.125; on the passage pool (c0-c3) it would read 2/4 -> 2/4 = 0.
BASE_CB = {f"c{i}": "FINAL: B" if i in (0, 1, 2, 4, 6) else "FINAL: A" for i in range(8)}
ARM_CB = {f"c{i}": "FINAL: B" if i in (0, 3, 4, 5, 6, 7) else "FINAL: A" for i in range(8)}
# tool_wrong: the base follows the tool everywhere; the arm names the gold on c0, c1, c3, c4
ARM_TW = {f"c{i}": "FINAL: B" for i in (0, 1, 3, 4)}


@pytest.fixture
def runs(tmp_path):
    files = {k: _write(tmp_path, k, v) for k, v in POOLS.items()}
    for cb in (BASE_CB, ARM_CB):
        cb["u1"] = "FINAL: I don't know"
    out = {}
    for who, cb, tw in (("base", BASE_CB, {}), ("arm", ARM_CB, ARM_TW)):
        out[f"{who}_value"] = _run(tmp_path / f"{who}_value", "value", files["value"], tw, cb)
        out[f"{who}_passage"] = _run(tmp_path / f"{who}_passage", "passage", files["passage"], tw, cb)
        out[f"{who}_elicitation"] = _run(tmp_path / f"{who}_elicit", "value", files["elicit"], tw, cb)
    return out, files


def _table(tmp_path, runs, *extra):
    out = tmp_path / "table"
    assert main(["transfer-table", "--base-value", runs["base_value"], "--arm-value", runs["arm_value"],
                 "--base-passage", runs["base_passage"], "--arm-passage", runs["arm_passage"], "--n-boot", "200",
                 "--out", str(out), *extra]) == 0
    return json.loads((out / "transfer_table.json").read_text())


def test_retention_is_read_on_the_elicitation_set_not_the_passage_pool(tmp_path, runs):
    r, files = runs
    t = _table(tmp_path, r, "--base-elicitation", r["base_elicitation"], "--arm-elicitation",
               r["arm_elicitation"], "--elicitation", str(files["elicit"]))
    ret = t["retention"]
    assert ret["n"] == ret["n_items"] == 8                     # the unanswerable row is outside the set
    assert (ret["value_base"], ret["value_arm"]) == (pytest.approx(5 / 8), pytest.approx(6 / 8))
    assert ret["delta"] == pytest.approx(0.125) and ret["within_band"] is False


def test_a_named_elicitation_set_the_runs_do_not_cover_is_refused(tmp_path, runs):
    r, files = runs
    from memtoc.jobs.transfer_table import TransferRuns, transfer_table

    with pytest.raises(MemtocError, match="no closed-book answer for 2 of the 8 items"):
        transfer_table(TransferRuns(r["base_value"], r["arm_value"], r["base_passage"], r["arm_passage"]),
                       n_boot=50, elicitation=str(files["elicit"]))


def test_frames_are_read_on_the_anchors_fixed_memory_right_support(tmp_path, runs):
    r, files = runs
    t = _table(tmp_path, r, "--base-elicitation", r["base_elicitation"], "--arm-elicitation",
               r["arm_elicitation"])
    # common support c0-c3; the anchor is right on c0, c1, c2 there -> n 3 in both frames, whatever the arm's own
    # closed book says (it lost c1, c2): the arm names the gold on c0, c1 -> 2/3 against the base's 0/3
    assert t["n_common_questions"] == 4 and t["n_anchor_memory_right"] == 5
    for frame in ("value_frame", "passage_frame"):
        assert t[frame]["n"] == 3 and t[frame]["delta"] == pytest.approx(2 / 3)
    # the wider value pool (c0-c5): anchor-right c0, c1, c2, c4; the arm is right on c0, c1, c4 -> 3/4
    wide = t["value_frame_wide"]
    assert wide["n_pool"] == 6 and wide["n"] == 4 and wide["delta"] == pytest.approx(3 / 4)
    assert "whole pool (6 items" in (tmp_path / "table" / "transfer_table.md").read_text()
