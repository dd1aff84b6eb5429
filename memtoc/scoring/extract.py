"""Answer-span extraction (scoring spec section 1).

Every raw model response, closed-book or with-tool, is reduced to one answer span *before* any
matching: matching whole responses confounds answer style with answer content (a verbose but right
answer fails, a wrong answer whose reasoning mentions the gold passes). The rules reproduce the
MemToC release scorer decision for decision, including its quirks, so that our numbers stay
comparable with the published ones.
"""

from __future__ import annotations

import re

from memtoc.core.answer_line import FINAL_MARKER_RE, QUOTE_CHARS

__all__ = ["QUOTE_CHARS", "extract_span"]


# Template v1 said `FINAL: <answer>` literally and some models echo the placeholder.
_PLACEHOLDER_RE = re.compile(r"<answer>", re.IGNORECASE)


def _nonempty_lines(text: str) -> list[str]:
    """Stripped non-empty lines; `str.splitlines` boundaries, as the release uses."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _used_markers(text: str) -> list[re.Match[str]]:
    """Marker occurrences that count: quoted ones are dropped unless every occurrence is quoted."""
    hits = list(FINAL_MARKER_RE.finditer(text))
    unquoted = [h for h in hits if h.start() == 0 or text[h.start() - 1] not in QUOTE_CHARS]
    # All quoted -> keep them all (the release falls back to its pre-quote-rule behaviour).
    return unquoted or hits


def _span_after_marker(text: str, marker: re.Match[str]) -> str:
    """First non-empty line after the marker, with the placeholder-echo repair."""
    lines = _nonempty_lines(text[marker.end():])
    span = lines[0] if lines else ""
    placeholder = _PLACEHOLDER_RE.match(span)
    if placeholder is None:
        return span
    rest = span[placeholder.end():].strip()
    if rest:
        return rest
    # Bare `<answer>`: the real answer is the last non-empty line above the marker
    # (including any text on the marker's own line before it).
    before = _nonempty_lines(text[:marker.start()])
    return before[-1] if before else ""


def _span_without_marker(text: str) -> str:
    """Last non-empty line, with the loop-truncation repair for runaway repetition."""
    lines = _nonempty_lines(text)
    if not lines:
        return text.strip()
    last = lines[-1]
    # A model looping on one phrase and cut by the token limit leaves a stump as its last line;
    # the nearest earlier line that the stump is a proper prefix of is the full phrase.
    for line in reversed(lines[:-1]):
        if line != last and line.startswith(last):
            return line
    return last


def extract_span(text: str | None) -> str:
    """The answer span of a raw response (possibly empty); not otherwise cleaned.

    Markdown, trailing periods and quotes stay in the span: matching normalises them later, and
    the abstention detector must see the span exactly as the release did.
    """
    if not text:
        return ""
    markers = _used_markers(text)
    if markers:
        return _span_after_marker(text, markers[-1])
    return _span_without_marker(text)
