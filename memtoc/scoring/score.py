"""Episode scoring: closed-book memory status, 2x2 cell, and outcome of a response (spec 4 and 5).

Memory is the model's *own* extracted closed-book answer, not the gold: a conflict exists only where
the model's memory and the tool disagree. A closed-book UNKNOWN, refusal or empty answer is
"no memory" (cell `mem_absent`), which is not the same as "wrong memory" (`both_wrong`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memtoc.scoring.abstain import is_abstain
from memtoc.scoring.extract import extract_span
from memtoc.scoring.normalize import match, match_any

__all__ = [
    "CELL_BY_CORRECTNESS",
    "MemoryStatus",
    "Score",
    "assign_cell",
    "memory_status",
    "score_response",
]

# (memory_correct, tool_correct) -> cell
CELL_BY_CORRECTNESS: dict[tuple[bool, bool], str] = {
    (True, True): "agree",
    (True, False): "arb",
    (False, True): "tool_gold",
    (False, False): "both_wrong",
}


@dataclass(frozen=True)
class MemoryStatus:
    """What the closed-book pass says about the model's memory for one question and formulation."""

    span: str
    mem_absent: bool
    memory_correct: bool | None


def memory_status(closed_book_response: str | None, gold: str,
                  aliases: Sequence[str] = ()) -> MemoryStatus:
    """Extract the closed-book span; no span or an abstaining span means memory is absent."""
    span = extract_span(closed_book_response)
    mem_absent = not span or is_abstain(span)
    memory_correct = None if mem_absent else match_any(span, [gold, *aliases])
    return MemoryStatus(span=span, mem_absent=mem_absent, memory_correct=memory_correct)


def assign_cell(memory_correct: bool | None, mem_absent: bool, tool_correct: bool | None) -> str | None:
    """The 2x2 cell, `mem_absent`, or None. `tool_correct` is fixed per condition (memtoc.bench.conditions;
    a tool error counts as a wrong tool, so memory-right episodes there are `arb`).

    no_tool (tool_correct None) never has a cell. Otherwise mem_absent wins over any
    memory_correct value, and a memory_correct of None without mem_absent also gives None
    (the release labels in this order).
    """
    if tool_correct is None:
        return None
    if mem_absent:
        return "mem_absent"
    if memory_correct is None:
        return None
    return CELL_BY_CORRECTNESS[(bool(memory_correct), bool(tool_correct))]


@dataclass(frozen=True)
class Score:
    """The scored fields of one with-tool (or no_tool) response, named as in the release records."""

    extracted: str
    followed_tool: bool
    kept_memory: bool
    final_correct: bool
    outcome: str  # both | followed_tool | kept_memory | neither
    neither_subtype: str | None  # abstain | other, only when outcome is neither
    ack_proxy: bool  # coarse CAR proxy: agreed with both sides
    abstain: bool  # on the extracted span: what every metric uses
    abstain_raw: bool  # on the raw response: sensitivity only

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the release field names, for JSON records."""
        return dataclasses.asdict(self)


def outcome_label(followed_tool: bool, kept_memory: bool) -> str:
    """The release's outcome of an answer from its two matches (``both`` when it agrees with either side)."""
    if followed_tool and kept_memory:
        return "both"
    if followed_tool:
        return "followed_tool"
    if kept_memory:
        return "kept_memory"
    return "neither"


def score_response(response: str | None, *, gold: str, tool_value: str | None,
                   memory_span: str | None, aliases: Sequence[str] = (),
                   tool_conditioned: bool = True) -> Score:
    """Score one response against the tool value, the model's closed-book span and the gold.

    `memory_span` must be the already *extracted* closed-book span, and '' (or None) when memory
    is absent: matching against a raw closed-book text would pick up the gold from its reasoning.
    `tool_value` is None for tool_error and no_tool.

    `tool_conditioned` is False only for no_tool episodes (no tool output in the prompt). For a
    tool-conditioned response the release counts an EMPTY extracted span as an abstention
    (`abstain` True, subtype `abstain`) even when the raw text holds no refusal: the model answered
    nothing after seeing the tool. `abstain_raw` is unchanged.
    """
    span = extract_span(response)
    followed_tool = tool_value is not None and match(span, str(tool_value))
    kept_memory = bool(memory_span) and match(span, memory_span)
    final_correct = match_any(span, [gold, *aliases])
    outcome = outcome_label(followed_tool, kept_memory)
    abstain = is_abstain(span) or (tool_conditioned and not span.strip())
    return Score(
        extracted=span,
        followed_tool=followed_tool,
        kept_memory=kept_memory,
        final_correct=final_correct,
        outcome=outcome,
        neither_subtype=("abstain" if abstain else "other") if outcome == "neither" else None,
        ack_proxy=followed_tool and kept_memory,
        abstain=abstain,
        abstain_raw=is_abstain(response),
    )
