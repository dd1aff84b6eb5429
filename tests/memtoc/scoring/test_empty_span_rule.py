"""The release's empty-span rule, end to end: offline re-scoring, the evaluator's scorer and the release checker.

The release counts a tool-conditioned answer whose extracted span is empty as an abstention (``abstain`` true,
``neither_subtype`` abstain) even when the raw text holds no refusal. The reference decisions here are
release-format records built by hand with that labelling, plus the release's own sample of scored episodes.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from memtoc.bench.offline import score_record

REPO = Path(__file__).resolve().parents[3]


def _checker():
    path = REPO / "benchmarks" / "check_release_scoring.py"
    spec = importlib.util.spec_from_file_location("check_release_scoring_empty", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("condition", "tool_value", "abstain"), [
    ("tool_right", "Paris", True), ("tool_wrong", "Lyon", True), ("no_conflict", "Paris", True),
    ("tool_error", None, True), ("no_tool", None, False),
])
def test_offline_rescoring_applies_the_rule_to_tool_conditioned_records(condition, tool_value, abstain):
    rec = {"question": "What is the capital of France?", "gold_answer": "Paris", "condition": condition,
           "response": "Let me think about this.\nFINAL:", "tool_value": tool_value, "memory_answer": "FINAL: Paris"}
    out = score_record(rec)
    assert out["extracted"] == ""
    assert out["abstain"] is abstain
    assert out["neither_subtype"] == ("abstain" if abstain else "other")
    assert out["abstain_raw"] is False and out["outcome"] == "neither"


def test_release_records_with_empty_span_agree_with_our_decisions(shared_memtoc, tmp_path):
    """Release-format records labelled by the release rule (empty span -> abstain) match our re-scoring."""
    checker = _checker()
    episodes = checker.episode_index(shared_memtoc)
    records = []
    for cond in ("tool_right", "tool_wrong", "tool_error", "no_conflict"):
        ep = episodes[f"0-1-{cond}-v0"]
        records.append({"episode_id": ep.episode_id, "condition": cond, "extracted": "",
                        "parametric_span": ep.question.gold_answer, "mem_absent": False, "memory_correct": True,
                        "followed_tool": False, "kept_memory": False, "final_correct": False,
                        "outcome": "neither", "neither_subtype": "abstain", "abstain": True, "ack_proxy": False})
    folder = tmp_path / "scored_episodes"
    folder.mkdir()
    (folder / "m_reference.json").write_text(json.dumps({"meta": {"n_outcome_corrected": 0}, "scored": records}))
    cmp = checker.compare(checker.find_release_files(tmp_path), episodes)
    assert cmp.unmatched == []
    tally = cmp.per_file["m_reference"]
    for f in ("abstain", "neither_subtype", "outcome"):
        assert (tally[f].n, tally[f].disagree) == (4, 0), f


def test_release_sample_file_still_agrees(shared_memtoc, tmp_path):
    """The release's sample of scored episodes (10 records) agrees with our decisions field by field."""
    sample = shared_memtoc / "sample_scored_qwen2.5-7b-instruct_reference.json"
    folder = tmp_path / "scored_episodes"
    folder.mkdir()
    (folder / "qwen2.5-7b-instruct_reference.json").write_bytes(sample.read_bytes())
    checker = _checker()
    cmp = checker.compare(checker.find_release_files(tmp_path), checker.episode_index(shared_memtoc))
    assert cmp.unmatched == []
    assert sum(cmp.n_records.values()) == 10
    for f, t in cmp.overall.items():
        assert t.n > 0 and t.disagree == 0, (f, cmp.examples[f][:2])
