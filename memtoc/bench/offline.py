"""Offline re-scoring of per-episode records (``memtoc score``) with the same scorer the evaluator uses."""

from __future__ import annotations

from typing import Any, Mapping

from memtoc.bench.conditions import get_condition, recorded_conditions
from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring import assign_cell, is_trivial_hop, memory_status, score_response

REQUIRED = ("question", "gold_answer", "condition", "response")


def score_record(rec: Mapping[str, Any], *, row: int | str | None = None, path: str | None = None) -> dict[str, Any]:
    """Add the scorer's fields to one input record.

    ``memory_answer`` (the closed-book answer, raw or extracted, or null) goes through the same extraction
    and abstention rules as in the evaluator, so a re-scored file reproduces a run's decisions.
    """
    for name in REQUIRED:
        if name not in rec:
            raise BenchmarkDataError("missing", path=path, row=row, field=name)
    for name in ("question", "gold_answer"):
        if not isinstance(rec[name], str) or not rec[name].strip():
            raise BenchmarkDataError("expected a non-empty string", path=path, row=row, field=name)
    if not isinstance(rec["response"], str):      # a number, NaN or null where the model's text belongs
        raise BenchmarkDataError(f"expected the response text (a string), got {type(rec['response']).__name__} "
                                 f"{rec['response']!r}", path=path, row=row, field="response")
    memory = rec.get("memory_answer")
    if memory is not None and not isinstance(memory, str):
        raise BenchmarkDataError(f"expected a string or null, got {type(memory).__name__} {memory!r}", path=path,
                                 row=row, field="memory_answer")
    known = recorded_conditions()
    if rec["condition"] not in known:
        raise BenchmarkDataError(f"unknown condition {rec['condition']!r}; expected one of {', '.join(known)}",
                                 path=path, row=row, field="condition")
    cond = get_condition(rec["condition"])
    aliases = rec.get("aliases") or []
    if not isinstance(aliases, list):
        raise BenchmarkDataError("expected a list of strings", path=path, row=row, field="aliases")
    tool_value = rec.get("tool_value")
    if tool_value is not None and not isinstance(tool_value, str):
        tool_value = str(tool_value)
    mem = memory_status(memory, rec["gold_answer"], aliases) if memory is not None else None
    score = score_response(rec["response"], gold=rec["gold_answer"], tool_value=tool_value,
                           memory_span="" if mem is None or mem.mem_absent else mem.span, aliases=aliases,
                           tool_conditioned=cond.has_tool_return)
    out = dict(rec)
    out.update(score.to_dict())
    out["memory_span"] = None if mem is None else mem.span
    out["mem_absent"] = True if mem is None else mem.mem_absent
    out["memory_correct"] = None if mem is None else mem.memory_correct
    out["cell"] = assign_cell(out["memory_correct"], out["mem_absent"], cond.tool_correct)
    out["tool_correct"] = cond.tool_correct
    out["trivial_hop"] = is_trivial_hop(rec["gold_answer"], rec["question"])
    out.setdefault("question_id", rec.get("qkey") or rec["question"])
    out.setdefault("formulation", "reference")
    out.setdefault("divergence_bucket", cond.bucket)
    return out
