"""The release's five conditions and the far arm (MemToC section 3): what the tool returns for one question."""

from __future__ import annotations

from memtoc.bench.conditions.base import Condition, condition_names, register_condition
from memtoc.core import vocab

for cond in (
    Condition("tool_right", True, lambda q, p: {"result": q.gold_answer}, sets={"all": 0, "sweep": 1, "agent": 0},
              description="the tool returns the gold answer"),
    Condition("tool_wrong", False, lambda q, p: {"result": q.near}, bucket="near", sets={"all": 1, "sweep": 0},
              description="the tool returns the near distractor (a plausible wrong value)"),
    # tool_error counts as a wrong tool, so memory-right episodes there are `arb`
    Condition("tool_error", False, lambda q, p: p.tool_error_payload, sets={"all": 2, "sweep": 2},
              description="the tool returns the release's service-unavailable error"),
    Condition("no_tool", None, None, sets={"all": 3},
              description="no tool call: the closed-book prompt is answered again"),
    Condition("no_conflict", True, lambda q, p: {"result": q.gold_answer}, sets={"all": 4},
              description="the tool returns the gold answer (the no-conflict accuracy's condition)"),
    Condition(vocab.FAR_CONDITION, False, lambda q, p: {"result": q.far} if q.far else None,
              records_as="tool_wrong", bucket="far", sets={"all": 5},
              description="tool_wrong with the far distractor; questions without one have no episode"),
):
    register_condition(cond)

if condition_names() != vocab.ALL_CONDITIONS:  # pragma: no cover - the vocabulary and the objects agree
    raise RuntimeError(f"release conditions {condition_names()} differ from vocab.ALL_CONDITIONS")
