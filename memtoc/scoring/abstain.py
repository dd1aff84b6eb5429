"""Abstention detection (scoring spec section 3).

A response abstains when it declines to answer instead of naming an entity. Two families of
case-insensitive patterns decide it:

* family A fires *anywhere* in the text (word-bounded): explicit "unknown"/"don't know" wording and
  passive or impersonal refusals ("cannot be determined", "not provided", ...);
* family B (plus A's "need more information" forms) fires only at the *start* of the text: a phrase
  that opens a reply is a refusal, the same phrase after an answer is only a hedge.

The table reproduces the release patterns, gotchas included: the bare word `na` abstains (so does a
name containing the word "Na"), a bare "stale" does not, and the `I'm sorry ... I don't have`
opener wants ASCII apostrophes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["ABSTAIN_RULES", "AbstainRule", "is_abstain", "matching_rules"]

Anchor = Literal["word", "start"]


@dataclass(frozen=True)
class AbstainRule:
    """One abstention pattern.

    anchor `word`: searched anywhere, with a word boundary on both sides.
    anchor `start`: must match at the start of the text after optional whitespace; any trailing
    boundary is part of the pattern itself (the release has none on the "need more" forms).
    """

    name: str
    family: Literal["A", "B"]
    anchor: Anchor
    pattern: str

    def compile(self) -> re.Pattern[str]:
        """The rule as a regex: word rules are wrapped in `\\b...\\b`, start rules in `\\A\\s*`."""
        body = rf"\b(?:{self.pattern})\b" if self.anchor == "word" else rf"\A\s*(?:{self.pattern})"
        return re.compile(body, re.IGNORECASE)


_UNFORTUNATELY = r"(?:unfortunately[,\s]+)?"

# name, family, anchor, pattern. `\s*` (not `\s+`) where the release tolerates a missing space.
ABSTAIN_RULES: tuple[AbstainRule, ...] = tuple(AbstainRule(*row) for row in (
    # --- family A, explicit refusals, anywhere -------------------------------------------------
    ("unknown",            "A", "word",  r"unknown"),
    ("do_not_know",        "A", "word",  r"do(?:es)?\s*n'?o?t\s*know"),
    ("cannot_say",         "A", "word",  r"can(?:not|'?t)\s*(?:answer|determine|provide|say|tell)"),
    ("no_information",     "A", "word",  r"no\s*(?:information|answer|idea)"),
    ("not_available",      "A", "word",  r"not\s*(?:available|sure)"),
    ("unavailable",        "A", "word",  r"unavailable"),
    # "re-run the tool" recommends instead of answering; a bare "stale" is deliberately absent.
    ("rerun_the_tool",     "A", "word",  r"re-?run\s+the\s+tool"),
    ("unable_to",          "A", "word",  r"unable\s*to"),
    ("n_a",                "A", "word",  r"n/?a"),
    # --- family A, passive and impersonal refusals, anywhere -----------------------------------
    ("cannot_be_found",    "A", "word",
     r"(?:cannot|can\s*not|could\s*not)\s+be\s+"
     r"(?:determined|retrieved|found|verified|identified|established)"),
    ("does_not_provide",   "A", "word",
     r"d(?:oes|id)\s+not\s+(?:provide|specify|identify|mention|contain|allow|state|answer|include)"),
    ("not_provided",       "A", "word",
     r"not\s+(?:provided|specified|mentioned|found|determined|known|possible\s+to\s+determine)"),
    ("insufficient_info",  "A", "word",  r"insufficient\s+(?:information|data)"),
    ("info_insufficient",  "A", "word",  r"(?:information|data)\s+is\s+insufficient"),
    ("insufficient_to",    "A", "word",  r"insufficient\s+to\s+(?:answer|determine)"),
    ("not_enough_info",    "A", "word",  r"do(?:es)?\s+not\s+have\s+enough\s+information"),
    ("not_relevant",       "A", "word",  r"is\s+not\s+relevant\s+to\s+the\s+question"),
    ("no_exact_match",     "A", "word",  r"no\s+exact\s+match"),
    # --- family A, start only: after an answer these are hedges ---------------------------------
    ("need_more_info",     "A", "start", r"(?:i\s+)?need\s+more\s+information"),
    ("more_info_needed",   "A", "start", r"more\s+information\s+is\s+(?:needed|required)"),
    # --- family B, refusal openers, start only --------------------------------------------------
    ("encountered_error",  "B", "start",
     _UNFORTUNATELY + r"i\s+(?:encountered|ran\s+into)\s+an?\s+(?:issue|error|problem)\b"),
    ("could_not_find",     "B", "start",
     _UNFORTUNATELY + r"i\s+(?:couldn'?t|could\s+not|cannot|can'?t|was\s+unable\s+to)"
                      r"\s+find\s+any\s+information\b"),
    # `[^.!?]*` keeps the whole opener inside the first sentence.
    ("sorry_no_info",      "B", "start",
     r"i'?m\s+sorry\b[^.!?]*\bi\s+do(?:n'?t|\s+not)\s+have\b[^.!?]*\binformation\b"),
    # An echoed question instead of an answer (base models): `Question:` or `Q:`.
    ("echoed_question",    "B", "start", r"q(?:uestion)?\s*:"),
))

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple((r.name, r.compile()) for r in ABSTAIN_RULES)


def matching_rules(text: str | None) -> list[str]:
    """Names of the rules that fire on `text` (for debugging and tests; order as in the table)."""
    text = text or ""
    return [name for name, regex in _COMPILED if regex.search(text)]


def is_abstain(text: str | None) -> bool:
    """True if any abstention rule fires. Apply it to the extracted span, not the raw response:
    the tool-error payload says "unavailable" and models echo it in their reasoning."""
    text = text or ""
    return any(regex.search(text) for _, regex in _COMPILED)
