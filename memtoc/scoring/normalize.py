"""Normalisation and answer matching (scoring spec sections 2 and 9).

The v1 matcher is deliberately lenient (bidirectional character containment plus three narrow alias
rules) because extraction already cut the answer to one span; what remains is surface variation
(articles, punctuation, "Name, Title" order, date formats). Its known over-matches (`W` matches
`Ann Wigmore`, `12` matches `2012`) and under-matches (`Perez` vs `Pérez`) are the released scoring
decisions: they are reproduced here on purpose, not fixed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = [
    "canonical",
    "is_trivial_hop",
    "match",
    "match_any",
    "match_v0",
    "normalize",
    "parse_dates",
]

# --- 2.1 base normaliser -------------------------------------------------------------------------

_NON_WORD_RE = re.compile(r"[^\w\s]")
_SPACES_RE = re.compile(r"\s+")


def normalize(s: str | None) -> str:
    """NFKD, lower-case, punctuation -> space, collapsed whitespace.

    NFKD splits accents off into combining marks, which are not word characters and so become
    spaces: `José` -> `jose` but `Pérez` -> `pe rez`. That is the release behaviour.
    """
    s = unicodedata.normalize("NFKD", s or "")
    s = s.lower().strip()
    s = _NON_WORD_RE.sub(" ", s)  # one space per non-word character, collapsed next
    return _SPACES_RE.sub(" ", s).strip()


# --- 2.2 canonical form --------------------------------------------------------------------------

_ARTICLES = frozenset({"the", "a", "an"})
# No `&` -> `and` alias: normalisation has already turned `&` into a space.
_TOKEN_ALIASES = {"st": "saint", "mt": "mount"}


def canonical(s: str | None) -> str:
    """Normalised tokens without articles (anywhere in the string), with `st`/`mt` expanded."""
    tokens = (_TOKEN_ALIASES.get(t, t) for t in normalize(s).split() if t not in _ARTICLES)
    return " ".join(tokens)


# --- 2.4 date parsing ----------------------------------------------------------------------------

_MONTH_NAMES = ("january", "february", "march", "april", "may", "june", "july", "august",
                "september", "october", "november", "december")
# Full names and their first three letters only: `sept` is not a month word in the release.
_MONTHS = {name: i for i, name in enumerate(_MONTH_NAMES, start=1)}
_MONTHS.update({name[:3]: i for i, name in enumerate(_MONTH_NAMES, start=1)})

_ORDINAL = r"(?:st|nd|rd|th)?"
# Scanned in this order; each recognised date is replaced by a space before the next form runs.
# Group order per form: which group holds (year, month, day).
_DATE_FORMS: tuple[tuple[re.Pattern[str], tuple[int, int, int]], ...] = (
    # (a) ISO 2011-1-18
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), (1, 2, 3)),
    # (b) January 18th, 2011 / Jan. 18 2011
    (re.compile(rf"\b([a-z]{{3,9}})\.?\s+(\d{{1,2}}){_ORDINAL}\s*,?\s+(\d{{4}})\b", re.IGNORECASE),
     (3, 1, 2)),
    # (c) 18th January, 2011 / 18 Jan. 2011
    (re.compile(rf"\b(\d{{1,2}}){_ORDINAL}\s+([a-z]{{3,9}})\.?\s*,?\s+(\d{{4}})\b", re.IGNORECASE),
     (3, 2, 1)),
)


def _month_number(token: str) -> int | None:
    """1-12 for a month token (digits or an accepted month word), else None."""
    return int(token) if token.isdigit() else _MONTHS.get(token.lower())


def parse_dates(s: str | None) -> tuple[list[tuple[int, int, int]], str]:
    """Dates found in `s` as distinct (year, month, day) in order found, plus the remaining text.

    Distinct because the release collects dates in a set: a target stating one date twice still
    counts as a bare single date. A candidate with an invalid month/day is left in the text.
    """
    found: list[tuple[int, int, int]] = []
    rest = s or ""
    for pattern, (y_group, m_group, d_group) in _DATE_FORMS:

        def _take(m: re.Match[str], y_group: int = y_group, m_group: int = m_group,
                  d_group: int = d_group) -> str:
            year, month, day = int(m.group(y_group)), _month_number(m.group(m_group)), int(m.group(d_group))
            if month is None or not (1 <= month <= 12 and 1 <= day <= 31):
                return m.group(0)  # not a date: keep the text
            if (year, month, day) not in found:
                found.append((year, month, day))
            return " "

        rest = pattern.sub(_take, rest)
    return found, rest


# --- 2.3 the v1 matcher --------------------------------------------------------------------------

_PAREN_RE = re.compile(r"\(([^()]*)\)")  # innermost brackets only
_PAREN_ALIAS_PREFIX_RE = re.compile(
    r"^(?:n[ée]e|born|formerly|a\.?k\.?a\.?|also\s+known\s+as)\s+", re.IGNORECASE)


def _contains_either_way(a: str, b: str) -> bool:
    """Plain character containment in either direction (not token-aligned: `12` is in `2012`)."""
    return a in b or b in a


def _paren_alias_match(answer: str, target_canon: str) -> bool:
    """Rule 2: a bracketed alias in the answer, e.g. `X (née Elizabeth Hamilton)`."""
    for inner in _PAREN_RE.findall(answer):
        alias = canonical(_PAREN_ALIAS_PREFIX_RE.sub("", inner.strip()))
        if alias and _contains_either_way(alias, target_canon):
            return True
    return False


def _comma_head_match(answer_canon: str, target: str) -> bool:
    """Rule 3: the `Name` of a `Name, Title` target, when it has at least two tokens."""
    if "," not in target:
        return False
    head = canonical(target.split(",", 1)[0])
    # The two-token guard keeps `Paris, France` from matching on the bare head rule.
    return len(head.split()) >= 2 and bool(answer_canon) and _contains_either_way(answer_canon, head)


def _bare_date_match(answer: str, target: str) -> bool:
    """Rule 4: a target that is exactly one date matches any answer stating that date."""
    target_dates, remainder = parse_dates(target)
    if len(target_dates) != 1 or canonical(remainder):
        return False
    answer_dates, _ = parse_dates(answer)
    return target_dates[0] in answer_dates


def match(answer: str | None, target: str | None) -> bool:
    """The primary v1 matcher: True if any of the four rules fires; an empty target never matches."""
    answer, target = answer or "", target or ""
    a, t = canonical(answer), canonical(target)
    if a and t and _contains_either_way(a, t):
        return True
    if not t:
        return False
    return (_paren_alias_match(answer, t)
            or _comma_head_match(a, target)
            or _bare_date_match(answer, target))


def match_any(answer: str | None, targets: Sequence[str | None]) -> bool:
    """True if the answer matches any non-empty target (gold plus its aliases)."""
    return any(match(answer, target) for target in targets if target)


# --- 2.6 legacy v0 matcher -----------------------------------------------------------------------


def match_v0(answer: str | None, target: str | None) -> bool:
    """One-directional v0 match: the normalised target is contained in (or equals) the answer.

    Kept only as the release's matcher-sensitivity check; v1 numbers never use it.
    """
    a, t = normalize(answer), normalize(target)
    return bool(t) and (t in a or a == t)


# --- 9 trivial hops ------------------------------------------------------------------------------


def is_trivial_hop(gold: str | None, question: str | None) -> bool:
    """Q- filter: the gold appears literally in the question (base normaliser, articles kept).

    As in the release, an empty normalised gold counts as trivial (the empty string is a substring).
    """
    return normalize(gold) in normalize(question)
