"""Numeric tokens in text, and the one rounding rule of this benchmark family.

The corruption of a tool's stdout (:mod:`memtoc.tasks.codeexec.conditions`) and the answer grader
(:mod:`memtoc.tasks.codeexec.grader`) share these definitions, so "a number" means the same thing when it is
corrupted and when it is looked for in the model's answer.

A numeric token (:data:`NUMBER_RE`) is ASCII digits with an optional fractional part (``12``, ``12.5``, ``.5``)
and an optional exponent (``1e-05``), not glued to a word or another number on either side (``x1``, ``3rd``,
``1.5.3`` and hex ``0x1F`` hold none), with a leading sign only where it cannot be a binary operator (``-3``,
``[-1, -2]``, ``x=-3`` keep it; in ``3-2`` both are unsigned); a sentence's final ``.`` is not part of it.
``nan``, ``inf``, thousands separators and non-ASCII digits are not tokens; the grader adds thousands separators
and the Unicode minus for the model's answer (:data:`ANSWER_NUMBER_RE`).

Rounding is half-up in Decimal's sense (``ROUND_HALF_UP``, halves away from zero: 2.0005 -> 2.001,
-2.0005 -> -2.001), as the prompts state with the same examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

__all__ = [
    "NUMBER_RE",
    "ANSWER_NUMBER_RE",
    "NumberToken",
    "find_numbers",
    "to_decimal",
    "round_half_up",
]

#: Numeric tokens in program output (see the module docstring for the exact rules).
NUMBER_RE = re.compile(
    r"""
    (?P<sign>(?<![A-Za-z0-9_.)\]}])[-+])?     # a sign only where it cannot be a binary operator
    (?<![A-Za-z0-9_.])                         # not glued to an identifier or a number on the left
    (?P<mantissa>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
    (?P<exponent>[eE](?P<exp_sign>[-+]?)(?P<exp_digits>[0-9]+))?
    (?![A-Za-z0-9_])(?!\.[0-9])                # not glued on the right either
    """,
    re.VERBOSE | re.ASCII,
)

#: Numbers in a model's answer: like :data:`NUMBER_RE`, plus thousands separators (``1,234,567.5``) and the
#: Unicode minus sign (U+2212). A comma group must have exactly three digits.
ANSWER_NUMBER_RE = re.compile(
    r"""
    (?P<sign>(?<![A-Za-z0-9_.)\]}])[-+\u2212])?
    (?<![A-Za-z0-9_.])
    (?P<mantissa>[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
    (?P<exponent>[eE][-+]?[0-9]+)?
    (?![A-Za-z0-9_])(?!\.[0-9])
    """,
    re.VERBOSE,
)

# Values this large are never rounded: the gold answers are at most 1e9, and quantizing to 0.001 would need
# a precision as long as the number.
_ROUNDING_LIMIT_ADJUSTED = 40


@dataclass(frozen=True)
class NumberToken:
    """One numeric token: where it is, its text, and its exact value."""

    start: int
    end: int
    text: str
    value: Decimal
    #: Digits after the decimal point in the mantissa (0 for integers).
    decimals: int
    has_plus: bool
    #: The exponent part as written (``"e-05"``) or "" for plain notation.
    exponent: str


def to_decimal(text: str) -> Decimal:
    """Exact value of a token's text: commas dropped, Unicode minus read as ``-``."""
    return Decimal(text.replace(",", "").replace("\u2212", "-"))


def find_numbers(text: str) -> list[NumberToken]:
    """Every numeric token of ``text`` (:data:`NUMBER_RE`), left to right, non-overlapping."""
    out = []
    for m in NUMBER_RE.finditer(text):
        mantissa = m.group("mantissa")
        decimals = len(mantissa.split(".", 1)[1]) if "." in mantissa else 0
        out.append(NumberToken(start=m.start(), end=m.end(), text=m.group(0), value=Decimal(m.group(0)),
                               decimals=decimals, has_plus=m.group("sign") == "+",
                               exponent=m.group("exponent") or ""))
    return out


def round_half_up(value: Decimal | str | int, places: int = 3) -> Decimal:
    """``value`` rounded to ``places`` decimals, halves away from zero, computed exactly.

    Values of 1e40 or more in magnitude are returned unchanged (they have no fractional digits to round at any
    precision a reader would print). Raises :class:`ValueError` for NaN or infinity.
    """
    d = value if isinstance(value, Decimal) else Decimal(str(value))
    if not d.is_finite():
        raise ValueError(f"cannot round {d}")
    if d.is_zero():
        return Decimal(0).scaleb(-places)
    if d.adjusted() >= _ROUNDING_LIMIT_ADJUSTED:
        return d
    ctx = Context(prec=max(60, d.adjusted() + places + 10), rounding=ROUND_HALF_UP)
    try:
        return ctx.quantize(d, Decimal(1).scaleb(-places))
    except InvalidOperation as exc:  # pragma: no cover - precision above rules this out
        raise ValueError(f"cannot round {d}") from exc
