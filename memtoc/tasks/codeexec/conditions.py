"""Conditions of the corrupted code-executor family, and how a tool's stdout is corrupted in each.

Conditions (:data:`CONDITIONS`, table in docs/codeexec.md): ``no_tool``, ``P0`` (the true stdout), ``P1+``/``P1-``
and ``P2+``/``P2-`` (every number times the problem's P1 or P2 factor, ``-`` reversing the sign) and the mixed
``P1``/``P2`` of the overreliance paper, whose sign per problem (:attr:`CorruptionFactors.mix_sign`) is one draw
from its own stream ``corruption-sign/<problem id>``, so a ``P1`` trial is exactly that problem's ``P1+`` or ``P1-``
trial, and the stored factor table and the problem set's SHA-256 are those of runs made before the mix.

Factors (:class:`CorruptionFactors`, :func:`draw_factors` under a :class:`CorruptionConfig`) are fixed per problem
by the benchmark seed, from the stream ``corruption/<problem id>`` (:mod:`memtoc.tasks.codeexec.seeding`), so they
depend on no operand and no other problem. By default, in this order of draws: the P1 magnitude, uniform on the
0.001 grid of [1.100, 1.500]; its direction, up or down with probability 1/2 (down: the reciprocal rounded half-up
to 6 decimals, so P1 lies in [1.1, 1.5] or [0.666667, 0.909091]); the P2 magnitude on [5.000, 50.000], always up.
The stored factor string is the factor applied, exactly; ``+`` and ``-`` variants of a level share one magnitude.

Corrupting stdout (:func:`corrupt_stdout`): the numeric tokens are those of
:data:`memtoc.tasks.codeexec.numtokens.NUMBER_RE` (integers, decimals, scientific notation, with a sign where it is
not a binary operator). Each token's exact value ``v`` becomes ``v x factor`` (exact Decimal product), written:

- plain tokens: rounded half-up to the token's own number of decimals (``12.3456`` -> 4 decimals, ``7`` -> 0);
- scientific tokens: mantissa normalised to 1 <= |m| < 10, rounded half-up to the original mantissa's
  decimals, exponent written with the original marker (``e``/``E``), an explicit ``+`` only if the original
  had one, and zero-padded to the original exponent's digit count (``1.5e-05`` -> ``3.0e-04``);
- a leading ``+`` is kept on positive results; a token written ``.5`` comes back as ``0.x``.
- If rounding would give back the original value, or zero, the result is moved one unit in the last place
  from the original value in the factor's direction (away from zero if |factor| > 1, towards it otherwise; away
  if towards would reach zero), so every non-zero token changes (``2`` x 1.2 -> ``3``).
- Zero tokens stay as they are: no factor can move zero.

Everything between tokens is left byte-identical. Failed executions (non-zero exit, exception, limit hit)
return the real traceback, uncorrupted, in every condition (:func:`tool_return`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import TYPE_CHECKING, Iterable, Protocol

from memtoc.tasks.codeexec.numtokens import NumberToken, find_numbers, round_half_up
from memtoc.tasks.codeexec.seeding import SeededStream
from memtoc.core.errors import MemtocError
from memtoc.core.vocab import CODEEXEC_CONDITIONS as CONDITIONS
from memtoc.core.vocab import CODEEXEC_CORRUPTED_CONDITIONS as CORRUPTED_CONDITIONS
from memtoc.core.vocab import CODEEXEC_MIXED_CONDITIONS as MIXED_CONDITIONS
from memtoc.core.vocab import CODEEXEC_SIGNED_CONDITIONS as SIGNED_CONDITIONS
from memtoc.core.vocab import CODEEXEC_TOOL_CONDITIONS as TOOL_CONDITIONS

if TYPE_CHECKING:  # pragma: no cover
    from memtoc.tasks.codeexec.sandbox import ExecutionResult

__all__ = [
    "CONDITIONS",
    "TOOL_CONDITIONS",
    "CORRUPTED_CONDITIONS",
    "MIXED_CONDITIONS",
    "SIGNED_CONDITIONS",
    "draw_mix_sign",
    "check_condition",
    "CorruptionConfig",
    "CorruptionFactors",
    "draw_factors",
    "Replacement",
    "CorruptedText",
    "corrupt_stdout",
    "ToolReturn",
    "tool_return",
    "failure_text",
    "corrupted_gold",
    "corruption_visible",
    "corrupted_numbers",
]


def check_condition(condition: str) -> str:
    if condition not in CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}; expected one of {list(CONDITIONS)}")
    return condition


# ---------------------------------------------------------------------------------------------------------
# factors


@dataclass(frozen=True)
class CorruptionConfig:
    """Ranges of the per-problem corruption factors (decimal strings, so draws are exact)."""

    p1_low: str = "1.1"
    p1_high: str = "1.5"
    p1_reciprocal: bool = True
    p2_low: str = "5"
    p2_high: str = "50"
    p2_reciprocal: bool = False
    #: Magnitudes are drawn on this grid.
    grid: str = "0.001"
    #: Decimals kept (half-up) when a reciprocal factor is stored.
    reciprocal_places: int = 6

    def __post_init__(self) -> None:
        grid = Decimal(self.grid)
        if not grid > 0:
            raise ValueError("grid must be positive")
        for name in ("p1", "p2"):
            low, high = Decimal(getattr(self, f"{name}_low")), Decimal(getattr(self, f"{name}_high"))
            if not (Decimal(1) < low <= high):
                raise ValueError(f"{name} range must satisfy 1 < low <= high, got [{low}, {high}]")
            if (low / grid) % 1 or (high / grid) % 1:
                raise ValueError(f"{name} range ends must lie on the {grid} grid")
        if self.reciprocal_places < 1:
            raise ValueError("reciprocal_places must be at least 1")


@dataclass(frozen=True)
class CorruptionFactors:
    """One problem's factor magnitudes as stored (positive; below 1 when the reciprocal was drawn)."""

    p1: str
    p2: str
    #: Sign of the mixed conditions P1 / P2 on this problem: "+" keeps the output's sign, "-" reverses it.
    mix_sign: str = "+"

    def __post_init__(self) -> None:
        if self.mix_sign not in ("+", "-"):
            raise ValueError(f"mix_sign must be '+' or '-', got {self.mix_sign!r}")

    def factor(self, condition: str) -> Decimal:
        """The signed factor a corrupted condition applies."""
        if condition not in CORRUPTED_CONDITIONS:
            raise ValueError(f"condition {condition!r} applies no corruption factor")
        if condition in MIXED_CONDITIONS:          # on this problem, P1 is P1+ or P1-
            condition += self.mix_sign
        magnitude = Decimal(self.p1 if condition.startswith("P1") else self.p2)
        return magnitude if condition.endswith("+") else -magnitude

    def as_dict(self) -> dict[str, str]:
        """Fixed-sign condition -> signed factor string, e.g. ``{"P1+": "1.237", "P1-": "-1.237", ...}`` (the
        stored table; the mixed conditions follow from it and :attr:`mix_sign`)."""
        return {c: format(self.factor(c), "f") for c in SIGNED_CONDITIONS}

    @classmethod
    def from_dict(cls, table: dict[str, str], *, mix_sign: str = "+") -> "CorruptionFactors":
        """Inverse of :meth:`as_dict`; raises ValueError when the four entries are not two sign pairs."""
        if set(table) != set(SIGNED_CONDITIONS):
            raise ValueError(f"expected keys {list(SIGNED_CONDITIONS)}, found {sorted(table)}")
        out = cls(p1=str(table["P1+"]), p2=str(table["P2+"]), mix_sign=mix_sign)
        for c in SIGNED_CONDITIONS:
            if Decimal(str(table[c])) != out.factor(c) or not Decimal(out.p1) > 0 or not Decimal(out.p2) > 0:
                raise ValueError(f"factor {c}={table[c]!r} does not match its positive/negative pair")
        return out


def _draw_magnitude(stream: SeededStream, low: str, high: str, reciprocal: bool, cfg: CorruptionConfig) -> str:
    grid = Decimal(cfg.grid)
    k = stream.randint(int(Decimal(low) / grid), int(Decimal(high) / grid))
    magnitude = k * grid
    if reciprocal and stream.randint(0, 1) == 1:
        ctx = Context(prec=50, rounding=ROUND_HALF_UP)
        magnitude = ctx.quantize(ctx.divide(Decimal(1), magnitude), Decimal(1).scaleb(-cfg.reciprocal_places))
    return format(magnitude, "f")


def draw_mix_sign(seed: int, problem_id: str) -> str:
    """The sign of the mixed conditions on one problem: "-" (reversed) with probability 1/2, from the stream
    ``corruption-sign/<problem id>`` (its own stream, so the magnitude draws are unchanged)."""
    return "-" if SeededStream(seed, f"corruption-sign/{problem_id}").randint(0, 1) == 1 else "+"


def draw_factors(seed: int, problem_id: str, config: CorruptionConfig | None = None) -> CorruptionFactors:
    """The factors of one problem (order and ranges in the module docstring)."""
    cfg = config or CorruptionConfig()
    stream = SeededStream(seed, f"corruption/{problem_id}")
    p1 = _draw_magnitude(stream, cfg.p1_low, cfg.p1_high, cfg.p1_reciprocal, cfg)
    p2 = _draw_magnitude(stream, cfg.p2_low, cfg.p2_high, cfg.p2_reciprocal, cfg)
    return CorruptionFactors(p1=p1, p2=p2, mix_sign=draw_mix_sign(seed, problem_id))


# ---------------------------------------------------------------------------------------------------------
# corrupting text


@dataclass(frozen=True)
class Replacement:
    """One corrupted token: its span in the original text and both spellings."""

    start: int
    end: int
    original: str
    corrupted: str

    @property
    def corrupted_value(self) -> Decimal:
        return Decimal(self.corrupted)


@dataclass(frozen=True)
class CorruptedText:
    """Corrupted text and the replacements made (zero tokens are not replacements: they stay)."""

    text: str
    replacements: tuple[Replacement, ...]

    @property
    def corrupted_values(self) -> tuple[Decimal, ...]:
        return tuple(r.corrupted_value for r in self.replacements)


def _nudge(value: Decimal, factor: Decimal, ulp: Decimal) -> Decimal:
    """One unit in the last place away from ``value``, in the direction the factor moves magnitudes."""
    magnitude = abs(value)
    new = magnitude + ulp if abs(factor) > 1 else magnitude - ulp
    if new <= 0:
        new = magnitude + ulp
    negative = (value < 0) != (factor < 0)
    return -new if negative else new


def _corrupt_plain(tok: NumberToken, factor: Decimal, ctx: Context) -> str:
    ulp = Decimal(1).scaleb(-tok.decimals)
    q = ctx.quantize(ctx.multiply(tok.value, factor), ulp)
    if q == tok.value or q.is_zero():
        q = ctx.quantize(_nudge(tok.value, factor, ulp), ulp)
    text = format(q, "f")
    return f"+{text}" if tok.has_plus and q > 0 else text


def _sci_parts(value: Decimal, decimals: int, ctx: Context) -> tuple[Decimal, int]:
    exp = value.adjusted()
    mantissa = ctx.quantize(value.scaleb(-exp), Decimal(1).scaleb(-decimals))
    if abs(mantissa) >= 10:
        exp += 1
        mantissa = ctx.quantize(value.scaleb(-exp), Decimal(1).scaleb(-decimals))
    return mantissa, exp


def _corrupt_sci(tok: NumberToken, factor: Decimal, ctx: Context) -> str:
    new = ctx.multiply(tok.value, factor)
    mantissa, exp = _sci_parts(new, tok.decimals, ctx)
    if mantissa.scaleb(exp) == tok.value or mantissa.is_zero():
        ulp = Decimal(1).scaleb(exp - tok.decimals)
        mantissa, exp = _sci_parts(_nudge(tok.value, factor, ulp), tok.decimals, ctx)
    marker, rest = tok.exponent[0], tok.exponent[1:]
    explicit_plus = rest.startswith("+")
    width = len(rest.lstrip("+-"))
    exp_sign = "-" if exp < 0 else ("+" if explicit_plus else "")
    text = f"{format(mantissa, 'f')}{marker}{exp_sign}{abs(exp):0{width}d}"
    return f"+{text}" if tok.has_plus and mantissa > 0 else text


def _corrupt_token(tok: NumberToken, factor: Decimal) -> str | None:
    if tok.value.is_zero():
        return None
    ctx = Context(prec=len(tok.text) + 60, rounding=ROUND_HALF_UP, Emax=10**9, Emin=-10**9)
    return _corrupt_sci(tok, factor, ctx) if tok.exponent else _corrupt_plain(tok, factor, ctx)


def corrupt_stdout(text: str, factor: Decimal | str) -> CorruptedText:
    """Multiply every numeric token of ``text`` by ``factor`` (rules in the module docstring)."""
    f = factor if isinstance(factor, Decimal) else Decimal(str(factor))
    if not f.is_finite() or f.is_zero() or abs(f) == 1:
        raise ValueError(f"a corruption factor must be finite, non-zero and not +-1, got {f}")
    pieces: list[str] = []
    replacements: list[Replacement] = []
    pos = 0
    for tok in find_numbers(text):
        new = _corrupt_token(tok, f)
        if new is None:
            continue
        pieces.append(text[pos:tok.start])
        pieces.append(new)
        replacements.append(Replacement(tok.start, tok.end, tok.text, new))
        pos = tok.end
    pieces.append(text[pos:])
    return CorruptedText("".join(pieces), tuple(replacements))


# ---------------------------------------------------------------------------------------------------------
# what the tool returns


@dataclass(frozen=True)
class ToolReturn:
    """The text the model sees for one execution in one condition, and what was done to it."""

    condition: str
    text: str
    #: True when numbers were changed (a successful run in a corrupted condition with non-zero tokens).
    corrupted: bool
    #: The signed factor applied, or None (P0, failed runs).
    factor: str | None
    replacements: tuple[Replacement, ...] = ()
    execution_ok: bool = True

    @property
    def corrupted_values(self) -> tuple[Decimal, ...]:
        return tuple(r.corrupted_value for r in self.replacements)


def failure_text(execution: "ExecutionResult") -> str:
    """What a failed run returns: its real stderr (the traceback) and, if a limit stopped it, one note line.

    The partial stdout of a failed run is not shown, in any condition, so a failure reads the same in P0 and in
    the corrupted conditions (and cannot leak an uncorrupted number).
    """
    text = execution.stderr
    if execution.killed_reason:
        note = execution.killed_reason + (f": {execution.detail}" if execution.detail else "")
        text = f"{text}{'' if not text or text.endswith(chr(10)) else chr(10)}[execution stopped: {note}]\n"
    return text


class CorruptibleProblem(Protocol):
    """What corruption needs of a problem (``memtoc.tasks.codeexec.problems.Problem``, which builds on this module)."""

    gold: str
    factors: CorruptionFactors


def tool_return(problem: CorruptibleProblem, condition: str, execution: "ExecutionResult") -> ToolReturn:
    """The tool return of ``execution`` for ``problem`` in ``condition``.

    Successful runs return stdout (stderr warnings of a successful run are not shown), corrupted in P1/P2.
    Failed runs return :func:`failure_text`, uncorrupted. ``no_tool`` has no tool, so asking is an error.
    """
    check_condition(condition)
    if condition == "no_tool":
        raise MemtocError("the no_tool condition offers no tool, so there is no tool return")
    if not execution.ok:
        return ToolReturn(condition, failure_text(execution), corrupted=False, factor=None, execution_ok=False)
    if condition == "P0":
        return ToolReturn(condition, execution.stdout, corrupted=False, factor=None)
    factor = problem.factors.factor(condition)
    out = corrupt_stdout(execution.stdout, factor)
    return ToolReturn(condition, out.text, corrupted=bool(out.replacements), factor=format(factor, "f"),
                      replacements=out.replacements)


def corrupted_gold(problem: CorruptibleProblem, condition: str) -> Decimal:
    """The injected wrong answer: the gold times the condition's factor, rounded half-up to 3 decimals."""
    return round_half_up(Decimal(problem.gold) * problem.factors.factor(condition))


def corruption_visible(problem: CorruptibleProblem, condition: str) -> bool:
    """False when the corrupted gold rounds back to the gold (possible only for golds of a few thousandths
    under a sign-preserving P1), so adoption cannot be told apart from a correct answer on that item."""
    return corrupted_gold(problem, condition) != Decimal(problem.gold)


def corrupted_numbers(returns: Iterable[ToolReturn]) -> tuple[Decimal, ...]:
    """All corrupted values over a run's tool returns, in order (the grader's adoption candidates)."""
    return tuple(v for r in returns for v in r.corrupted_values)
