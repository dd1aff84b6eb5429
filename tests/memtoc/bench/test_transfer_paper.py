"""App. F.1 as the paper ran it: the MC matcher as the transfer set's scorer (a closed-book "B" is memory-correct,
a kept-memory answer in the passage frame counts toward retention), the unanswerable split's abstention, and
Table 6 with the closed-book ±0.03 band -- on constructed runs, with the statistics checked against scipy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.cli import main
from memtoc.tasks.memtoc.evaluation import score_episode
from memtoc.bench.episodes import build_episode
from memtoc.scoring.metrics import get_metric
from memtoc.runs.runstore import RunStore
from memtoc.bench.transfer import TransferScorer, load_transfer, to_questions

ROWS = [
    {"id": "c1", "question": "Which planet is closest to the Sun?",
     "choices": [{"label": "A", "text": "Venus"}, {"label": "B", "text": "Mercury"}, {"label": "C", "text": "Mars"}],
     "answerKey": "B", "counterfactual_answerKey": "A",
     "context": "Venus, not Mercury or Mars, travels on the innermost orbit."},
    {"id": "u1", "split": "unanswerable", "question": "Which gas do the moons of Neptune exhale?",
     "choices": [{"label": "A", "text": "argon"}, {"label": "B", "text": "neon"}],
     "context": "Neptune has fourteen known moons."},
]


@pytest.fixture
def transfer_file(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return p


def _score(bench, condition, response, closed_book, qi=0):
    q = bench.questions[qi]
    ep = build_episode(q, condition, "reference", frame="tool-no-schema")
    mem = bench.scorer.memory_status(q, closed_book)
    return bench.scorer.rescore(score_episode(ep, response, {"memory_span": mem.span, "mem_absent": mem.mem_absent,
                                                             "memory_correct": mem.memory_correct}))


def test_a_closed_book_option_label_is_memory_correct(transfer_file):
    bench = load_benchmark(f"transfer:value:{transfer_file}")
    scorer = bench.scorer
    assert isinstance(scorer, TransferScorer)
    q = bench.questions[0]
    assert scorer.memory_status(q, "FINAL: B").memory_correct is True
    assert scorer.memory_status(q, "FINAL: B) Mercury").memory_correct is True
    assert scorer.memory_status(q, "FINAL: Mercury").memory_correct is True
    assert scorer.memory_status(q, "FINAL: A").memory_correct is False
    rec = _score(bench, "tool_wrong", "FINAL: B", "FINAL: B")
    assert rec["cell"] == "arb" and rec["outcome"] == "kept_memory" and rec["final_correct"] is True
    assert get_metric("retention").qualifies(rec)
    rec = _score(bench, "tool_wrong", "FINAL: Venus", "FINAL: B")
    assert rec["outcome"] == "followed_tool" and rec["mc_label"] == "A"


def test_a_kept_memory_answer_in_the_passage_frame_counts_toward_retention(transfer_file):
    bench = load_benchmark(f"transfer:passage:{transfer_file}")
    assert bench.questions[0].near == ROWS[0]["context"]          # the tool returns the passage
    # the string matcher finds "Mercury" inside the passage: it would score the kept answer "both"
    rec = _score(bench, "tool_wrong", "FINAL: Mercury", "FINAL: Mercury")
    assert rec["outcome"] == "kept_memory" and rec["kept_memory"] and not rec["followed_tool"]
    assert rec["cell"] == "arb" and get_metric("retention").qualifies(rec)
    rec = _score(bench, "tool_wrong", "FINAL: Venus", "FINAL: Mercury")
    assert rec["outcome"] == "followed_tool"


def test_the_unanswerable_split_is_passage_only_and_read_for_abstention(transfer_file):
    items = load_transfer(transfer_file)
    assert items[1].unanswerable and items[1].counterfactual_key is None
    assert len(to_questions(items, "value")) == 1 and len(to_questions(items, "passage")) == 2
    bench = load_benchmark(f"transfer:passage:{transfer_file}")
    rec = _score(bench, "tool_wrong", "FINAL: I don't know", "FINAL: I don't know", qi=1)
    assert rec["transfer_split"] == "unanswerable" and rec["abstain"] is True
    summary = bench.summarize_records([rec])["transfer_mc"]
    assert summary["unanswerable_abstention"] == {"n": 1, "k": 1, "rate": 1.0}


def _write_run(root, frame, transfer_file, cases, cb):
    """cases: (question index, condition, response); cb: question index -> closed-book response."""
    bench = load_benchmark(f"transfer:{frame}:{transfer_file}")
    by_id = {q.id: q for q in bench.questions}
    recs, cbs = [], []
    for qi, cond, resp in cases:
        q = by_id[f"{qi}.0"]
        ep = build_episode(q, cond, "reference", frame="tool-no-schema")
        mem = bench.scorer.memory_status(q, cb[qi])
        recs.append(bench.scorer.rescore(score_episode(ep, resp, {"memory_span": mem.span,
                                                                  "mem_absent": mem.mem_absent,
                                                                  "memory_correct": mem.memory_correct})))
    for qi, text in cb.items():
        if f"{qi}.0" in by_id:
            mem = bench.scorer.memory_status(by_id[f"{qi}.0"], text)
            cbs.append({"key": f"{qi}.0|reference", "question_id": f"{qi}.0", "formulation": "reference",
                        "memory_span": mem.span, "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct})
    store = RunStore.open(root, identity={"model": "m"}, run_info={"config": {"model": "m"}})
    store.closed_book.append(cbs)
    store.episodes.append(recs)
    return root


def test_transfer_table_reads_both_frames_abstention_and_the_retention_band(tmp_path, transfer_file):
    cb = {0: "FINAL: B", 1: "FINAL: I don't know"}
    base_v = _write_run(tmp_path / "bv", "value", transfer_file, [(0, "tool_wrong", "FINAL: A")], cb)
    arm_v = _write_run(tmp_path / "av", "value", transfer_file, [(0, "tool_wrong", "FINAL: B")], cb)
    base_p = _write_run(tmp_path / "bp", "passage", transfer_file,
                        [(0, "tool_wrong", "FINAL: A"), (1, "tool_wrong", "FINAL: I don't know")], cb)
    arm_p = _write_run(tmp_path / "ap", "passage", transfer_file,
                       [(0, "tool_wrong", "FINAL: Mercury"), (1, "tool_wrong", "FINAL: A")], cb)
    out = tmp_path / "table"
    assert main(["transfer-table", "--base-value", str(base_v), "--arm-value", str(arm_v), "--base-passage",
                 str(base_p), "--arm-passage", str(arm_p), "--n-boot", "200", "--out", str(out)]) == 0
    t = json.loads((out / "transfer_table.json").read_text())
    assert t["n_common_questions"] == 1
    assert t["value_frame"]["delta"] == 1.0 and t["passage_frame"]["delta"] == 1.0   # kept memory after training
    assert t["abstention"]["delta"] == -1.0 and t["abstention"]["n"] == 1               # the abstention leak
    assert t["retention"]["delta"] == 0 and t["retention"]["within_band"] is True and t["retention"]["band"] == 0.03
    assert "inside ±0.03" in (out / "transfer_table.md").read_text()


def test_retention_band_is_the_papers_pm_003():
    """A change of 0.04 in closed-book accuracy is outside the band, 0.025 inside (App. F.1's SFT arm: +0.045 ->
    +0.025 after the matcher repair, fail -> pass); the paired mean difference equals numpy's."""
    from memtoc.jobs.transfer_table import RETENTION_BAND, _paired

    a = [1.0] * 40 + [0.0] * 60
    b = [1.0] * 44 + [0.0] * 56
    res = _paired(a, b, list(range(100)), 200, 0)
    assert res["delta"] == pytest.approx(float(np.mean(np.array(b) - np.array(a)))) == pytest.approx(0.04)
    assert abs(res["delta"]) > RETENTION_BAND == 0.03


def test_transfer_recipe_quick_on_the_tiny_model(tmp_path, tiny_model_dir):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[3] / "experiments" / "transfer.toml"
    out = tmp_path / "exp"
    assert main(["run-experiment", str(recipe), "--quick", "--model", str(tiny_model_dir), "--set",
                 "max_new_tokens=6", "--no-report", "--out", str(out)]) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and state["protocol"] == "paper"
    t = json.loads((out / "table" / "transfer_table.json").read_text())
    assert {"value_frame", "passage_frame", "abstention", "retention"} <= set(t) and t["retention"]["band"] == 0.03
    recs = [json.loads(x) for x in (out / "runs" / "dpo-passage" / "episodes.jsonl").read_text().splitlines()]
    assert recs and all(r["scorer"] == "transfer_mc" for r in recs)
    # the paper's arms per model: SFT and DPO (App. F.1: Llama SFT, Llama DPO, gemma DPO), trained with the
    # primary adapters' seed (App. E: 20260705)
    sft = json.loads((out / "table-sft" / "transfer_table.json").read_text())
    assert sft["retention"]["band"] == 0.03 and sft["retention"]["n"] > 0
    steps = {s["name"]: s for s in state["steps"]}
    for name in ("train_sft", "train"):
        assert "--train-seed 20260705" in " ".join(map(str, steps[name]["argv"]))


def test_transfer_table_retention_is_answerable_only_and_joins_on_item_ids(tmp_path):
    """App. F.1's retention gate reads the elicitation set (answerable items): unanswerable rows, whose closed book
    has no gold (memory_correct None), are left out instead of counted as 0; and the arm's file lists the items in
    another order, so pairing on row indices ("0.0") would compare different items."""
    c2 = {"id": "c2", "question": "Which planet has the Great Red Spot?",
          "choices": [{"label": "A", "text": "Saturn"}, {"label": "B", "text": "Jupiter"}],
          "answerKey": "B", "counterfactual_answerKey": "A", "context": "Saturn carries the Great Red Spot."}
    u2 = {"id": "u2", "split": "unanswerable", "question": "Which colour is the wind on Triton?",
          "choices": [{"label": "A", "text": "blue"}, {"label": "B", "text": "red"}], "context": "Triton is cold."}
    base_rows, arm_rows = [ROWS[0], c2, ROWS[1], u2], [ROWS[1], c2, u2, ROWS[0]]
    files = {}
    for name, rows in (("base", base_rows), ("arm", arm_rows)):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    idx = {name: {r["id"]: i for i, r in enumerate(rows)} for name, rows in (("base", base_rows),
                                                                             ("arm", arm_rows))}
    # closed book: base right on c1 only; the arm right on c1 and c2 -> +0.5 on the 2 answerable items
    # (counting the 2 unanswerable rows as 0 would give +0.25 on 4); unanswerable rows answer "I don't know"
    cb = {"base": {"c1": "FINAL: B", "c2": "FINAL: A", "u1": "FINAL: I don't know", "u2": "FINAL: I don't know"},
          "arm": {"c1": "FINAL: B", "c2": "FINAL: B", "u1": "FINAL: I don't know", "u2": "FINAL: I don't know"}}
    # tool_wrong answers: base follows the tool on c1 and keeps memory nowhere; the arm keeps memory on c1
    ans = {"base": {"c1": "FINAL: A", "c2": "FINAL: A"}, "arm": {"c1": "FINAL: B", "c2": "FINAL: A"}}
    runs = {}
    for name in ("base", "arm"):
        i = idx[name]
        for frame in ("value", "passage"):
            cases = [(i[k], "tool_wrong", v) for k, v in ans[name].items()]
            if frame == "passage":
                cases += [(i["u1"], "tool_wrong", "FINAL: I don't know"), (i["u2"], "tool_wrong", "FINAL: A")]
            runs[f"{name}_{frame}"] = _write_run(tmp_path / f"{name}_{frame}", frame, files[name], cases,
                                                 {i[k]: v for k, v in cb[name].items()})
    out = tmp_path / "table"
    assert main(["transfer-table", "--base-value", str(runs["base_value"]), "--arm-value", str(runs["arm_value"]),
                 "--base-passage", str(runs["base_passage"]), "--arm-passage", str(runs["arm_passage"]),
                 "--n-boot", "200", "--out", str(out)]) == 0
    t = json.loads((out / "transfer_table.json").read_text())
    ret = t["retention"]
    assert ret["n"] == 2 and ret["delta"] == pytest.approx(0.5)
    assert (ret["value_base"], ret["value_arm"]) == (pytest.approx(0.5), pytest.approx(1.0))
    # both frames pair c1 with c1: memory-right (arb) only on c1 for the base; kept memory 0 -> 1
    assert t["n_common_questions"] == 2
    assert t["value_frame"]["n"] == 1 and t["value_frame"]["delta"] == 1.0
    # abstention on the unanswerable split, paired by item: base abstains on u1 only, the arm on u1 only too
    assert t["abstention"]["n"] == 2
