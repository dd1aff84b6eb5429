"""Which judge requests a finished run gets (release ``build_judge_requests.py``, scoring.md "Judged channel").

Only ``tool_wrong`` episodes (near and far), as in the release: ``extract_final`` for an episode whose outcome is
``neither`` / ``other`` (the matcher's blind spot for paraphrase); ``extract_closed_book`` once per hop (question
x formulation) whose closed-book span looks like an echo of the question, because the fix replaces the hop's
memory for all of its episodes; ``ack`` for every final. ``{answer}`` is the scorer's extracted span (the
closed-book span for the closed-book fix).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, Mapping

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.vocab import CONFLICT_CONDITION
from memtoc.scoring.judge.prompts import JudgePrompts
from memtoc.scoring import canonical

REQUEST_KINDS = ("extract_final", "extract_closed_book", "ack")
_TEMPLATE = {"extract_final": "extract", "extract_closed_book": "extract", "ack": "ack"}


@dataclass(frozen=True)
class JudgeRequest:
    """One prompt for the judge. ``request_id`` is the key of its record in ``judge.jsonl``."""

    request_id: str
    kind: str
    question_id: str
    formulation: str
    episode_id: str | None   # None for a closed-book (hop-level) request
    answer: str
    prompt: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hop_key(question_id: str, formulation: str) -> str:
    return f"{question_id}|{formulation}"


def request_id(kind: str, key: str) -> str:
    return f"{kind}|{key}"


def is_suspicious_closed_book(span: str, gold: str, question: str) -> bool:
    """The release's echo test: span longer than the gold by more than two words and the gold inside the question."""
    g = canonical(gold)
    return len((span or "").split()) > len(gold.split()) + 2 and bool(g) and g in canonical(question)


def _need(rec: Mapping[str, Any], key: str, row: int) -> Any:
    if key not in rec:
        raise BenchmarkDataError("episode record lacks a key the judge needs", row=row, field=key)
    return rec[key]


def request_specs(records: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, str, str, str, str | None, str, str]]:
    """``(kind, key, question_id, formulation, episode_id, question, answer)`` of every judge request of the run,
    in record order, closed-book requests once per hop: what both :func:`build_requests` and the judge file's
    check (:func:`memtoc.scoring.judge.binding.expected_spans`) read, so the two never disagree."""
    seen_hops: set[str] = set()
    for row, rec in enumerate(records, start=1):
        if _need(rec, "condition", row) != CONFLICT_CONDITION:
            continue
        qid, form = str(_need(rec, "question_id", row)), str(_need(rec, "formulation", row))
        question, ep = str(_need(rec, "question", row)), str(_need(rec, "episode_id", row))
        extracted = _need(rec, "extracted", row) or ""
        hop = hop_key(qid, form)
        span = _need(rec, "memory_span", row) or ""
        if hop not in seen_hops:
            seen_hops.add(hop)
            if is_suspicious_closed_book(span, str(_need(rec, "gold_answer", row)), question):
                yield "extract_closed_book", hop, qid, form, None, question, span
        if _need(rec, "outcome", row) == "neither" and rec.get("neither_subtype") == "other":
            yield "extract_final", ep, qid, form, ep, question, extracted
        yield "ack", ep, qid, form, ep, "", extracted          # the ack prompt reads the answer alone


def build_requests(records: Iterable[Mapping[str, Any]], prompts: JudgePrompts) -> list[JudgeRequest]:
    """The run's judge requests (:func:`request_specs`) with their prompts."""
    return [JudgeRequest(request_id(kind, key), kind, qid, form, ep, answer,
                         prompts.render(_TEMPLATE[kind], question=question, answer=answer))
            for kind, key, qid, form, ep, question, answer in request_specs(records)]
