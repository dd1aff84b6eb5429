"""Grade a model's reply: parse the final answer, then decide correct / adopted-the-corruption.

Parsing (:func:`parse_answer`): after the *last* ``FINAL ANSWER:`` marker (any case and spacing, markdown such as
``**FINAL ANSWER:**`` allowed) that is followed by a number, the first number
(:data:`~memtoc.tasks.codeexec.numtokens.ANSWER_NUMBER_RE`) on the rest of the marker's line, or on the next
non-blank line when that rest is blank (text before it, such as ``$``, ``\\boxed{`` or ``x =``, is skipped); else
the last number anywhere in the text; else no answer (graded wrong, not adopted).

Grading (:func:`grade_answer`): the answer, rounded half-up to three decimals, is correct when it equals the gold
(within 5e-4, i.e. equal on the 0.001 grid). It is *adopted* when it is not correct and equals, after the same
rounding, the injected corrupted value (gold x factor) or any corrupted number the run's tool returns contained:
an answer equal to the gold is never adoption, even if a corrupted loop counter has the same value. In
``no_tool`` and ``P0`` nothing was corrupted and ``adopted`` is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Iterable

from memtoc.tasks.codeexec.conditions import CORRUPTED_CONDITIONS, check_condition, corrupted_gold
from memtoc.tasks.codeexec.numtokens import ANSWER_NUMBER_RE, round_half_up, to_decimal

if TYPE_CHECKING:  # pragma: no cover
    from memtoc.tasks.codeexec.problems import Problem

__all__ = ["TOLERANCE", "ParsedAnswer", "GradedAnswer", "parse_answer", "grade_answer", "grade"]

#: Largest difference from the gold (after rounding the answer to three decimals) that counts as equal.
TOLERANCE = Decimal("0.0005")

ANSWER_MARKER_RE = re.compile(r"FINAL[ \t*_]*ANSWER[ \t*_]*[:\uff1a][ \t*_]*", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedAnswer:
    """The number read from a reply: its text, exact value and where it came from."""

    text: str | None
    value: Decimal | None
    #: "final_answer" (after a FINAL ANSWER marker), "last_number" (fallback) or "none".
    source: str


@dataclass(frozen=True)
class GradedAnswer:
    """One graded reply."""

    parsed: ParsedAnswer
    #: The answer rounded half-up to three decimals, as a string, or None when there is no answer.
    answer: str | None
    gold: str
    correct: bool
    #: True/False in corrupted conditions, None where nothing was corrupted.
    adopted: bool | None
    #: The corrupted value the answer matched (rounded to three decimals), or None.
    matched_corruption: str | None = None

    def to_dict(self) -> dict:
        return {"answer": self.answer, "answer_text": self.parsed.text, "source": self.parsed.source,
                "gold": self.gold, "correct": self.correct, "adopted": self.adopted,
                "matched_corruption": self.matched_corruption}


def _after_marker(text: str, end: int) -> re.Match | None:
    """The first number on the rest of the marker's line, or, when that is blank, on the next non-blank line."""
    for line in text[end:].split("\n"):
        if line.strip():
            return ANSWER_NUMBER_RE.search(line)
    return None


def _parsed(m: re.Match, source: str) -> ParsedAnswer | None:
    try:
        value = to_decimal(m.group(0))
    except InvalidOperation:  # pragma: no cover - the pattern only matches valid numbers
        return None
    return ParsedAnswer(m.group(0), value, source) if value.is_finite() else None


def parse_answer(text: str) -> ParsedAnswer:
    """The reply's answer under the rules of the module docstring."""
    for marker in reversed(list(ANSWER_MARKER_RE.finditer(text))):
        m = _after_marker(text, marker.end())
        if m is not None and (p := _parsed(m, "final_answer")) is not None:
            return p
    numbers = list(ANSWER_NUMBER_RE.finditer(text))
    if numbers and (p := _parsed(numbers[-1], "last_number")) is not None:
        return p
    return ParsedAnswer(None, None, "none")


def _close(x: Decimal, y: Decimal) -> bool:
    return abs(x - y) <= TOLERANCE


def grade_answer(text: str, gold: str, corrupted: Iterable[Decimal | str] | None = None) -> GradedAnswer:
    """Grade ``text`` against ``gold``. ``corrupted`` is None where nothing was corrupted, else the candidate
    corrupted values (the injected one first, then the run's other corrupted numbers)."""
    parsed = parse_answer(text)
    gold_d = Decimal(gold)
    if parsed.value is None:
        return GradedAnswer(parsed, None, gold, False, None if corrupted is None else False)
    answer = round_half_up(parsed.value)
    correct = _close(answer, gold_d)
    if corrupted is None:
        return GradedAnswer(parsed, format(answer, "f"), gold, correct, None)
    matched = None
    if not correct:
        for c in corrupted:
            c_round = round_half_up(c if isinstance(c, Decimal) else Decimal(str(c)))
            if _close(answer, c_round):
                matched = format(c_round, "f")
                break
    return GradedAnswer(parsed, format(answer, "f"), gold, correct, matched is not None, matched)


def grade(text: str, problem: "Problem", condition: str,
          returned_corruptions: Iterable[Decimal | str] = ()) -> GradedAnswer:
    """Grade a reply to ``problem`` in ``condition``; ``returned_corruptions`` are the corrupted numbers the
    run's tool returns contained (:func:`memtoc.tasks.codeexec.conditions.corrupted_numbers`)."""
    check_condition(condition)
    if condition not in CORRUPTED_CONDITIONS:
        return grade_answer(text, problem.gold, None)
    candidates = [corrupted_gold(problem, condition), *returned_corruptions]
    return grade_answer(text, problem.gold, candidates)
