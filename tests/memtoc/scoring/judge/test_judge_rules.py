"""The release's judge rules on constructed replies (scoring.md "Judged channel")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from memtoc.scoring.judge.prompts import load_judge_prompts
from memtoc.scoring.judge.requests import build_requests, is_suspicious_closed_book
from memtoc.scoring.judge.rules import judged_records, parse_ack, parse_extraction
from memtoc.scoring.metrics import metric_table

_spec = importlib.util.spec_from_file_location("judge_helpers", Path(__file__).with_name("helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

Q = "Which actor played Colonel Sherman T. Potter in the series?"
GOLD, TOOL = "Harry Morgan", "McLean Stevenson"


def test_parse_extraction_rules():
    assert parse_extraction("ABSTAIN").status == "abstain"
    assert parse_extraction("  abstain - no entity given").status == "abstain"
    assert parse_extraction('**"Harry Morgan"**\nmore text').span == "Harry Morgan"
    twelve = " ".join(["w"] * 12)
    assert parse_extraction(twelve).status == "span"
    long = parse_extraction(" ".join(["w"] * 13))
    assert long.status == "discarded" and "12" in long.reason
    assert parse_extraction("").status == "discarded"
    assert parse_extraction("  \n\n").status == "discarded"
    assert parse_extraction("Harry Morgan", error="timeout").status == "discarded"


def test_parse_ack():
    assert parse_ack("YES") is True
    assert parse_ack(" no.") is False
    assert parse_ack("Yes, it flags the tool") is True
    assert parse_ack("Maybe") is None
    assert parse_ack("YES", error="boom") is None
    assert parse_ack("") is None


def _wrong(response, closed_book="FINAL: Harry Morgan", qid="q1"):
    return H.scored(qid, "tool_wrong", response, closed_book=closed_book, gold=GOLD, question=Q, tool_value=TOOL)


def test_outcome_fix_relabels_neither_other_and_keeps_final_correct():
    rec = _wrong("FINAL: Morgan, Harry")        # the matcher's blind spot: no containment either way
    assert rec["outcome"] == "neither" and rec["neither_subtype"] == "other" and rec["final_correct"] is False
    assert rec["cell"] == "arb"
    judge = dict([H.judge_rec("extract_final", "Harry Morgan", episode_id=rec["episode_id"])])
    (out,), ch = judged_records([rec], judge)
    assert out["outcome"] == "kept_memory" and out["kept_memory"] is True and out["followed_tool"] is False
    assert out["neither_subtype"] is None
    assert out["final_correct"] is False          # never recomputed
    assert ch.outcomes_fixed == 1
    assert rec["outcome"] == "neither"            # the input record is not mutated


def test_outcome_fix_to_tool():
    rec = _wrong("FINAL: Stevenson, McLean")
    judge = dict([H.judge_rec("extract_final", "McLean Stevenson", episode_id=rec["episode_id"])])
    (out,), _ = judged_records([rec], judge)
    assert out["outcome"] == "followed_tool" and out["followed_tool"] is True


def test_abstain_reply_relabels_subtype_and_abstain():
    rec = _wrong("FINAL: Morgan, Harry")
    judge = dict([H.judge_rec("extract_final", "ABSTAIN", episode_id=rec["episode_id"])])
    (out,), ch = judged_records([rec], judge)
    assert out["outcome"] == "neither" and out["neither_subtype"] == "abstain" and out["abstain"] is True
    assert ch.relabelled_abstain == 1


@pytest.mark.parametrize("reply,error", [(" ".join(["Harry"] * 13), None), ("", None), ("Harry Morgan", "500")])
def test_long_empty_or_error_replies_keep_the_deterministic_label(reply, error):
    rec = _wrong("FINAL: Morgan, Harry")
    judge = dict([H.judge_rec("extract_final", reply, episode_id=rec["episode_id"], error=error)])
    (out,), ch = judged_records([rec], judge)
    for k in ("outcome", "neither_subtype", "followed_tool", "kept_memory", "abstain", "final_correct", "cell"):
        assert out[k] == rec[k], k
    assert ch.discarded == 1


def test_outcome_fix_only_touches_neither_other():
    rec = _wrong("FINAL: McLean Stevenson")        # followed the tool
    judge = dict([H.judge_rec("extract_final", "Harry Morgan", episode_id=rec["episode_id"])])
    (out,), _ = judged_records([rec], judge)
    assert out["outcome"] == "followed_tool" == rec["outcome"]


def test_closed_book_fix_recomputes_memory_and_cell_for_the_whole_hop():
    q = "Is Paris the capital of France or is it another city?"
    echo = "FINAL: Is Paris the capital of France"     # an echo of the question: 'matches' the gold
    recs = [H.scored("q2", c, "FINAL: Paris", closed_book=echo, gold="Paris", question=q,
                     tool_value=tv) for c, tv in (("tool_wrong", "Lyon"), ("tool_right", "Paris"))]
    other = H.scored("q3", "tool_wrong", "FINAL: Paris", closed_book=echo, gold="Paris", question=q, tool_value="Lyon")
    assert [r["cell"] for r in recs] == ["arb", "agree"] and recs[0]["memory_correct"] is True
    assert is_suspicious_closed_book(recs[0]["memory_span"], "Paris", q)
    reqs = build_requests([*recs, other], load_judge_prompts())
    assert sorted(r.request_id for r in reqs if r.kind == "extract_closed_book") == [
        "extract_closed_book|q2|reference", "extract_closed_book|q3|reference"]
    judge = dict([H.judge_rec("extract_closed_book", "Lyon", question_id="q2")])
    out, ch = judged_records([*recs, other], judge)
    assert [r["cell"] for r in out[:2]] == ["both_wrong", "tool_gold"]
    assert all(r["memory_span"] == "Lyon" and r["memory_correct"] is False for r in out[:2])
    for r, o in zip(recs, out[:2]):   # outcome of the with-tool answer is not recomputed by this fix
        assert (o["outcome"], o["kept_memory"], o["final_correct"]) == (r["outcome"], r["kept_memory"],
                                                                        r["final_correct"])
    assert out[2]["cell"] == other["cell"] == "arb"       # another hop is untouched
    assert ch.closed_book_fixed_hops == 1 and ch.cells_changed == 2
    # the metrics see the changed cells: retention's support moves from arb to both_wrong
    det, jud = metric_table(recs, n_boot=10), metric_table(out[:2], n_boot=10)
    assert det["retention"].per_formulation["reference"].n == 1
    assert jud["retention"].per_formulation["reference"].n == 0
    assert jud["incorrect_tool_following"].per_formulation["reference"].n == 1


def test_closed_book_abstain_makes_memory_absent():
    q = "Is Paris the capital of France or is it another city?"
    rec = H.scored("q2", "tool_wrong", "FINAL: Paris", closed_book="FINAL: Is Paris the capital of France",
                   gold="Paris", question=q, tool_value="Lyon")
    (out,), _ = judged_records([rec], dict([H.judge_rec("extract_closed_book", "ABSTAIN", question_id="q2")]))
    assert out["mem_absent"] is True and out["memory_correct"] is None and out["cell"] == "mem_absent"


def test_requests_follow_the_release():
    right = H.scored("q1", "tool_right", "FINAL: Morgan, Harry", closed_book="FINAL: Harry Morgan", gold=GOLD,
                     question=Q, tool_value=GOLD)
    other = _wrong("FINAL: Morgan, Harry")
    follows = _wrong("FINAL: McLean Stevenson", qid="q9")
    reqs = build_requests([right, other, follows], load_judge_prompts())
    kinds = sorted((r.kind, r.episode_id) for r in reqs)
    assert kinds == [("ack", other["episode_id"]), ("ack", follows["episode_id"]),
                     ("extract_final", other["episode_id"])]
    ex = next(r for r in reqs if r.kind == "extract_final")
    assert "Question: " + Q in ex.prompt and "Answer: Morgan, Harry\n" in ex.prompt
    ack = next(r for r in reqs if r.kind == "ack")
    assert ack.prompt.endswith("One word (YES or NO):") and "Reply to audit: " in ack.prompt


def test_judged_car_is_yes_share_among_verdicts_in_arb_and_both_wrong():
    """The release's CAR_judge arithmetic on constructed records."""
    from memtoc.scoring.judge.ack import car_table

    arb = [_wrong("FINAL: McLean Stevenson", qid=f"a{i}") for i in range(4)]
    bw = [_wrong("FINAL: McLean Stevenson", closed_book="FINAL: Alan Alda", qid=f"b{i}") for i in range(3)]
    absent = _wrong("FINAL: McLean Stevenson", closed_book="FINAL: UNKNOWN", qid="m1")
    right = H.scored("r1", "tool_right", "FINAL: Harry Morgan", closed_book="FINAL: Alan Alda", gold=GOLD,
                     question=Q, tool_value=GOLD)
    assert {r["cell"] for r in arb} == {"arb"} and {r["cell"] for r in bw} == {"both_wrong"}
    assert absent["cell"] == "mem_absent"
    pairs = [(arb[0], "YES"), (arb[1], "NO"), (arb[2], "maybe"), (arb[3], "no"),
             (bw[0], "Yes."), (bw[1], "NO"), (bw[2], ""), (absent, "YES"), (right, "YES")]
    recs = [r for r, _ in pairs]
    judge = dict(H.judge_rec("ack", reply, episode_id=r["episode_id"]) for r, reply in pairs)
    out, ch = judged_records(recs, judge)
    assert ch.ack_without_verdict == 2                 # "maybe" and ""
    # independent arithmetic: verdicts in arb = YES, NO, no (3, 1 yes); both_wrong = Yes, NO (2, 1 yes)
    rows = {row["cell"]: row for row in car_table([("arm", out)])}
    assert (rows["arb"]["n"], rows["arb"]["n_verdict"], rows["arb"]["judge_yes"]) == (4, 3, 1)
    assert rows["arb"]["car_judge"] == pytest.approx(1 / 3)
    assert (rows["both_wrong"]["n_verdict"], rows["both_wrong"]["judge_yes"]) == (2, 1)
    assert rows["arb+both_wrong"]["car_judge"] == pytest.approx(2 / 5)
    assert rows["arb+both_wrong"]["n"] == 7          # mem_absent and tool_right excluded




def test_prompt_file_is_validated(tmp_path):
    import json

    from memtoc.core.errors import BenchmarkDataError

    p = load_judge_prompts()
    assert p.prompt_version == "release-1" and p.max_new_tokens == 32 and p.max_words == 12
    assert p.templates["extract"].endswith("Asserted entity:")
    bad = json.loads(Path(p.path).read_text(encoding="utf-8")) if Path(p.path).exists() else None
    data = bad or {"prompt_version": "x", "prompts": dict(p.templates)}
    data["prompts"]["ack"] = "no placeholder here"
    f = tmp_path / "judge.json"
    f.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=r"field 'prompts.ack'"):
        load_judge_prompts(f)


def test_a_judge_file_mixing_two_judges_is_refused(tmp_path):
    import json

    from memtoc.core.errors import RunStoreError
    from memtoc.scoring.judge.store import judge_identity_of, read_judge_records

    f = tmp_path / "judge.jsonl"
    a = {"request_id": "ack|e1", "kind": "ack", "judge": {"model": "m1", "weights_sha256": "x"}}
    b = {"request_id": "ack|e2", "kind": "ack", "judge": {"model": "m1", "weights_sha256": "y"}}
    f.write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n" + '{"request_id": "ack|e3", "ki', encoding="utf-8")
    recs = read_judge_records(f)
    assert list(recs) == ["ack|e1", "ack|e2"]                      # torn tail ignored
    assert f.read_text(encoding="utf-8").endswith('"ki')             # ... and the reader did not write
    with pytest.raises(RunStoreError, match="weights_sha256"):
        judge_identity_of(recs, f)
