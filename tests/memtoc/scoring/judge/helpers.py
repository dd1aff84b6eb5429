"""Constructed scored records and judge records, made with the toolkit's own scorer and parser."""

from __future__ import annotations

from typing import Any

from memtoc.scoring.judge.requests import hop_key, request_id
from memtoc.scoring.judge.rules import parse_record
from memtoc.bench.conditions import tool_correct as condition_tool_correct
from memtoc.scoring import assign_cell, is_trivial_hop, memory_status, score_response


def scored(qid: str, condition: str, response: str, *, closed_book: str, gold: str, question: str,
           tool_value: str | None, formulation: str = "reference", bucket: str | None = None) -> dict[str, Any]:
    """A record as ``memtoc evaluate`` writes it (the fields the judge layer and the metrics read)."""
    mem = memory_status(closed_book, gold)
    tool_correct = condition_tool_correct(condition)
    s = score_response(response, gold=gold, tool_value=tool_value,
                       memory_span="" if mem.mem_absent else mem.span)
    rec = {"episode_id": f"{qid}|{formulation}|{condition}", "question_id": qid, "formulation": formulation,
           "condition": condition, "divergence_bucket": bucket or ("near" if condition == "tool_wrong" else None),
           "question": question, "gold_answer": gold, "aliases": [], "tool_value": tool_value,
           "tool_correct": tool_correct, "response": response, "memory_span": mem.span,
           "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct,
           "cell": assign_cell(mem.memory_correct, mem.mem_absent, tool_correct),
           "trivial_hop": is_trivial_hop(gold, question)}
    rec.update(s.to_dict())
    return rec


def judge_rec(kind: str, reply: str, *, episode_id: str | None = None, question_id: str = "",
              formulation: str = "reference", error: str | None = None) -> tuple[str, dict[str, Any]]:
    key = hop_key(question_id, formulation) if kind == "extract_closed_book" else episode_id
    rec = {"request_id": request_id(kind, key), "kind": kind, "question_id": question_id,
           "formulation": formulation, "episode_id": episode_id, "reply": reply, "error": error}
    rec["verdict"] = parse_record(rec)
    return rec["request_id"], rec
