"""Judge replies -> verdicts -> the judged layer, by the release's rules (scoring.md "Judged channel").

docs/judge.md states the rules this module applies: how an extract reply is parsed (first line, at most
``max_words`` words, ``ABSTAIN``, discarded otherwise) and an ack reply read (YES / NO), and how
:func:`judged_records` applies them to copies of the deterministic records: the closed-book fix per hop (memory
and cell recomputed, ``kept_memory`` and ``outcome`` not), the outcome fix of ``neither`` / ``other`` episodes
against this layer's memory (``final_correct`` never recomputed), and ``ack_judge`` on every tool_wrong episode.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from memtoc.scoring.judge.requests import hop_key, request_id
from memtoc.scoring import assign_cell, is_abstain, match, match_any
from memtoc.scoring.score import outcome_label

SPAN, ABSTAIN, DISCARDED = "span", "abstain", "discarded"


@dataclass(frozen=True)
class Extraction:
    """A parsed extract reply: ``status`` is span | abstain | discarded (with ``reason``)."""

    status: str
    span: str = ""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "span": self.span, "reason": self.reason}


def parse_extraction(reply: str | None, *, max_words: int = 12, abstain_token: str = "ABSTAIN",
                     strip_chars: str = "\"'*`", error: str | None = None) -> Extraction:
    """The release's reading of an extract reply (module docstring)."""
    if error:
        return Extraction(DISCARDED, reason="judge error")
    lines = (reply or "").strip().splitlines()
    first = lines[0].strip().strip(strip_chars + " \t").strip() if lines else ""
    if not first:
        return Extraction(DISCARDED, reason="empty")
    if first.upper().startswith(abstain_token.upper()):
        return Extraction(ABSTAIN)
    if len(first.split()) > max_words:
        return Extraction(DISCARDED, reason=f"longer than {max_words} words")
    return Extraction(SPAN, span=first)


_YESNO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)


def parse_ack(reply: str | None, *, error: str | None = None) -> bool | None:
    """YES -> True, NO -> False; anything else (or an error) is no verdict."""
    if error or not reply:
        return None
    m = _YESNO.match(reply.strip())
    return None if m is None else m.group(1).lower() == "yes"


def parse_record(rec: Mapping[str, Any], **parse_kw: Any) -> dict[str, Any]:
    """The ``verdict`` field of a judge record from its raw reply."""
    if rec["kind"] == "ack":
        return {"ack": parse_ack(rec.get("reply"), error=rec.get("error"))}
    return parse_extraction(rec.get("reply"), error=rec.get("error"), **parse_kw).to_dict()


@dataclass
class LayerChanges:
    """How many labels the judged layer changed (for the printout and the tests)."""

    closed_book_fixed_hops: int = 0
    cells_changed: int = 0
    outcomes_fixed: int = 0
    relabelled_abstain: int = 0
    discarded: int = 0             # extract replies discarded (empty, > max words, judge error)
    ack_without_verdict: int = 0   # ack replies that were neither YES nor NO

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def judged_records(records: Iterable[Mapping[str, Any]], judge: Mapping[str, Mapping[str, Any]]
                   ) -> tuple[list[dict[str, Any]], LayerChanges]:
    """Apply the judge's verdicts (``request_id`` -> judge record with ``verdict``) to copies of the records."""
    changes = LayerChanges()
    fixed_hops: dict[str, str] = {}
    for jr in judge.values():
        if jr.get("kind") != "extract_closed_book":
            continue
        v = jr["verdict"]
        if v["status"] == DISCARDED:
            changes.discarded += 1
            continue
        fixed_hops[hop_key(jr["question_id"], jr["formulation"])] = v["span"] if v["status"] == SPAN else ""
    changes.closed_book_fixed_hops = len(fixed_hops)
    out = []
    for rec in records:
        r = copy.deepcopy(dict(rec))
        r["layer"] = "judged"
        hop = hop_key(str(r["question_id"]), str(r["formulation"]))
        if hop in fixed_hops:
            span = fixed_hops[hop]
            r["memory_span_deterministic"] = r.get("memory_span")
            r["memory_span"] = span
            r["mem_absent"] = not span or is_abstain(span)
            r["memory_correct"] = (None if r["mem_absent"]
                                   else match_any(span, [r["gold_answer"], *(r.get("aliases") or [])]))
            cell = assign_cell(r["memory_correct"], r["mem_absent"], r.get("tool_correct"))
            if cell != r.get("cell"):
                changes.cells_changed += 1
            r["cell_deterministic"], r["cell"] = r.get("cell"), cell
        ep = str(r.get("episode_id"))
        ex = judge.get(request_id("extract_final", ep))
        if ex is not None and r.get("outcome") == "neither" and r.get("neither_subtype") == "other":
            v = ex["verdict"]
            if v["status"] == DISCARDED:
                changes.discarded += 1
            elif v["status"] == ABSTAIN:
                r["neither_subtype"], r["abstain"] = "abstain", True
                changes.relabelled_abstain += 1
            else:
                x = v["span"]
                memory = "" if r.get("mem_absent") else (r.get("memory_span") or "")
                ft = r.get("tool_value") is not None and match(x, str(r["tool_value"]))
                km = bool(memory) and match(x, memory)
                r["judge_extracted"] = x
                r["followed_tool"], r["kept_memory"], r["outcome"] = ft, km, outcome_label(ft, km)
                r["ack_proxy"] = ft and km
                r["neither_subtype"] = "other" if r["outcome"] == "neither" else None
                if r["outcome"] != "neither":
                    changes.outcomes_fixed += 1
        ack = judge.get(request_id("ack", ep))
        r["ack_judge"] = None if ack is None else ack["verdict"].get("ack")
        changes.ack_without_verdict += ack is not None and r["ack_judge"] is None
        out.append(r)
    return out, changes
