"""``memtoc study --score-layer``: the judged layer (paper App. B) reaches the paper tables, read from ``judge.jsonl``.

The runs are built with the toolkit's own scorer; the judge file is constructed so that the judge changes one
decision class (a kept-memory answer the matcher misses, ``Morgan, Harry``). The judged study must read it, the
deterministic one must not, and the expected values are counted here by hand.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.runs.runstore import RunStore

_spec = importlib.util.spec_from_file_location("judge_helpers", Path(__file__).parents[2] / "scoring" / "judge" / "helpers.py")
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

Q = "Which actor played Colonel Sherman T. Potter in the series?"
GOLD, TOOL = "Harry Morgan", "McLean Stevenson"
N = 10
JUDGE = {"model": "constructed-judge", "weights_sha256": "0" * 8, "backend": "hf", "dtype": "float32",
         "chat_template_sha256": None, "prompt_version": "t", "prompts_sha256": "t", "max_new_tokens": 32}


def _run(root: Path, responses: list[str], judge_fix: set[int]) -> Path:
    """N tool_wrong (arb) and N tool_right episodes; ``judge_fix``: episodes whose final the judge reads as gold."""
    recs, judge = [], []
    for i, resp in enumerate(responses):
        q = f"q{i}"
        recs.append(H.scored(q, "tool_wrong", resp, closed_book=f"FINAL: {GOLD}", gold=GOLD, question=Q,
                             tool_value=TOOL))
        recs.append(H.scored(q, "tool_right", f"FINAL: {GOLD}", closed_book=f"FINAL: {GOLD}", gold=GOLD,
                             question=Q, tool_value=GOLD))
        if i in judge_fix:
            rid, jr = H.judge_rec("extract_final", GOLD, episode_id=recs[-2]["episode_id"])
            judge.append({**jr, "judge": JUDGE})
    for i in range(4):              # tool_error: the judge reads two answers as abstentions (a scorer metric)
        recs.append(H.scored(f"q{i}", "tool_error", "FINAL: Morgan, Harry", closed_book=f"FINAL: {GOLD}", gold=GOLD,
                             question=Q, tool_value=None))
        if i < 2 and judge_fix:
            rid, jr = H.judge_rec("extract_final", "ABSTAIN", episode_id=recs[-1]["episode_id"])
            judge.append({**jr, "judge": JUDGE})
    for i in range(N, N + 4):       # tool_right ∩ tool_gold (memory wrong): correct-tool following's support
        recs.append(H.scored(f"q{i}", "tool_right", f"FINAL: {GOLD}", closed_book="FINAL: Alan Alda", gold=GOLD,
                             question=Q, tool_value=GOLD))
    store = RunStore.open(root, identity={"model": "m/model-x"}, run_info={"config": {"model": "m/model-x"}})
    store.episodes.append(recs)
    judge = _complete_pass(recs, judge) if judge_fix else []
    (root / "judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in judge), encoding="utf-8")
    return root


def _complete_pass(recs: list[dict], chosen: list[dict]) -> list[dict]:
    """A whole judge pass bound to the run: every request the run has (a judge file must be the run's own and
    complete), the constructed verdicts where given, elsewhere the scorer's own span read back (no change)."""
    from memtoc.scoring.judge.binding import expected_spans

    given = {r["request_id"]: r for r in chosen}
    out = []
    for rid, (kind, span) in expected_spans(recs).items():
        ep = rid.split("|", 1)[1]
        rec = given.get(rid) or {**H.judge_rec(kind, "NO" if kind == "ack" else (span or "ABSTAIN"),
                                               episode_id=None if kind == "extract_closed_book" else ep)[1],
                                 "judge": JUDGE}
        out.append({**rec, "answer": span})
    return out


@pytest.fixture
def runs(tmp_path):
    # base: 3 of 10 keep memory in the matcher's words; arm: 3 keep, 5 more keep memory as "Morgan, Harry"
    base = _run(tmp_path / "base", [f"FINAL: {GOLD}"] * 3 + [f"FINAL: {TOOL}"] * 7, {0})   # q0: no change
    arm_resp = [f"FINAL: {GOLD}"] * 3 + ["FINAL: Morgan, Harry"] * 5 + [f"FINAL: {TOOL}"] * 2
    arm = _run(tmp_path / "arm", arm_resp, judge_fix={3, 4, 5, 6, 7})
    return base, arm


def _study(tmp_path, base, arm, layer):
    out = tmp_path / f"study-{layer}"
    assert main(["study", "--base", str(base), "--arm", f"warn={arm}", "--score-layer", layer, "--n-boot", "20",
                 "--n-perm", "200", "--out", str(out)]) == 0
    return out, json.loads((out / "study.json").read_text(encoding="utf-8"))


def _row(study, metric, slice_="pooled"):
    (row,) = [r for r in study["tables"]["paired"] if r["metric"] == metric and r["slice"] == slice_]
    return row


def test_judged_layer_changes_retention_where_the_judge_changed_a_decision(tmp_path, runs):
    base, arm = runs
    _, det = _study(tmp_path, base, arm, "deterministic")
    out, jud = _study(tmp_path, base, arm, "judged")
    # deterministic: "Morgan, Harry" is `neither`, so retention 3/10 in the arm; judged: 8/10
    assert _row(det, "retention")["value_arm"] == pytest.approx(0.3)
    assert _row(jud, "retention")["value_arm"] == pytest.approx(0.8)
    assert _row(det, "retention")["value_base"] == _row(jud, "retention")["value_base"] == pytest.approx(0.3)
    assert _row(jud, "retention")["delta"] == pytest.approx(0.5) and _row(det, "retention")["delta"] == 0
    # correct-tool following (no judge change there) is the same in both layers
    assert _row(det, "correct_tool_following")["value_arm"] == _row(jud, "correct_tool_following")["value_arm"] == 1
    # tool-error abstention is a deterministic-scorer value in the paper's judged tables (App. B); a judge file
    # holds no tool_error verdicts at all (its requests are tool_wrong's: memtoc.scoring.judge.binding)
    assert _row(det, "tool_error_abstention")["value_arm"] == _row(jud, "tool_error_abstention")["value_arm"] == 0
    assert jud["layer"] == "judged" and det["layer"] == "deterministic"
    assert {r["judge"] for r in jud["runs"]} == {"constructed-judge"}
    md = (out / "study.md").read_text(encoding="utf-8")
    assert "[judged layer]" in md and "Layer: judged layer" in md and "[deterministic layer]" not in md


def test_judged_is_the_default_and_both_writes_each_layer(tmp_path, runs, capsys):
    base, arm = runs
    out = tmp_path / "both"
    assert main(["study", "--base", str(base), "--arm", f"warn={arm}", "--n-boot", "20", "--n-perm", "200"]) == 0
    assert "[judged layer]" in capsys.readouterr().out
    assert main(["study", "--base", str(base), "--arm", f"warn={arm}", "--score-layer", "both", "--n-boot", "20",
                 "--n-perm", "200", "--out", str(out)]) == 0
    assert json.loads((out / "study.json").read_text())["layer"] == "judged"
    assert json.loads((out / "deterministic" / "study.json").read_text())["layer"] == "deterministic"


def test_judged_layer_without_a_judge_file_is_a_one_line_error(tmp_path, runs, capsys):
    base, arm = runs
    (arm / "judge.jsonl").unlink()
    assert main(["study", "--base", str(base), "--arm", f"warn={arm}"]) == 2
    err = capsys.readouterr().err
    assert "judge.jsonl" in err and "memtoc judge" in err and "Traceback" not in err


def test_arm_and_base_judged_by_different_judges_are_refused(tmp_path, runs, capsys):
    base, arm = runs
    lines = [json.loads(s) for s in (arm / "judge.jsonl").read_text().splitlines()]
    (arm / "judge.jsonl").write_text("".join(json.dumps({**r, "judge": {**JUDGE, "model": "other"}}) + "\n"
                                             for r in lines))
    assert main(["study", "--base", str(base), "--arm", f"warn={arm}"]) == 2
    assert "different judges" in capsys.readouterr().err


def test_the_judge_model_auto_is_the_paper_judge_on_gpu_and_default_on_cpu(tmp_path, runs):
    from memtoc.jobs.judge import PAPER_JUDGE_MODEL, resolve_judge_model

    base, _ = runs
    said = []
    assert resolve_judge_model("auto", base, cuda=True, log=said.append) == PAPER_JUDGE_MODEL == \
        "Qwen/Qwen2.5-7B-Instruct"
    assert resolve_judge_model("auto", base, cuda=False, log=said.append) == "default"
    assert "NOT the paper's" in said[-1]
    assert resolve_judge_model("run", base, log=said.append) == "m/model-x"
    assert resolve_judge_model("some/judge", base) == "some/judge"


def test_the_judge_model_auto_asks_torch_for_a_gpu_when_not_told(tmp_path, runs, monkeypatch):
    """``cuda=None``: the answer is ``torch.cuda.is_available()`` (forced here both ways)."""
    import torch

    from memtoc.jobs.judge import PAPER_JUDGE_MODEL, resolve_judge_model

    base, _ = runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_judge_model("auto", base, log=lambda s: None) == PAPER_JUDGE_MODEL
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_judge_model("auto", base, log=lambda s: None) == "default"
