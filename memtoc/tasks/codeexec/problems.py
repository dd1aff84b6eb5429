"""The 300 arithmetic problems of the corrupted code-executor family, generated from a seed (docs/codeexec.md).

Six operations, 50 problems each (:data:`OPS`), ids ``"<op>-NNN"``. Operands have exactly three decimals, drawn
(:mod:`memtoc.tasks.codeexec.seeding`, stream ``operands/<op>``: |a|'s grid index, then |b|'s, then for
add/mul/div a's sign, then b's) on the 0.001 grid of [0.001, 1000] (pow: [0.001, 10]; mod, log and pow positive).
An attempt is redrawn when it leaves its operation's domain, when the exact result is outside
0.001 <= |result| <= 10^9, when a transcendental result is within 1e-20 thousandths of a rounding tie (it would
not be decided at 50 digits; no seed-0 problem is affected), or when it repeats an (a, b) pair.

Gold answers: exact Decimal arithmetic at 50 significant digits (:func:`exact_value`), rounded half-up to three
decimals. Split: 200 ``dev`` and 100 ``heldout``, stratified by operation (four operations put 17 problems in
held-out, two put 16), drawn from ``split_seed`` independently of the problem seed. :func:`problems_to_jsonl` is
the canonical serialization; its SHA-256 for seed 0 is pinned by the tests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import (
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
)
from pathlib import Path
from typing import Any, Iterable

from memtoc.tasks.codeexec.conditions import CorruptionConfig, CorruptionFactors, draw_factors
from memtoc.tasks.codeexec.numtokens import round_half_up
from memtoc.tasks.codeexec.resources import load_data
from memtoc.tasks.codeexec.seeding import SeededStream
from memtoc.core.errors import BenchmarkDataError
from memtoc.core.vocab import CODEEXEC_SPLITS as SPLITS

__all__ = [
    "OPS",
    "PER_OP",
    "N_HELDOUT",
    "SPLITS",
    "Problem",
    "exact_value",
    "gold_answer",
    "generate_problems",
    "heldout_counts",
    "problems_to_jsonl",
    "problems_from_jsonl",
    "problems_sha256",
]

OPS: tuple[str, ...] = ("add", "mul", "div", "mod", "log", "pow")
PER_OP = 50
N_HELDOUT = 100

_SIGNED_OPS = frozenset({"add", "mul", "div"})
#: Largest operand grid index (operand = index / 1000) per operation; the smallest is 1 (0.001).
_MAX_INDEX = {"add": 1_000_000, "mul": 1_000_000, "div": 1_000_000, "mod": 1_000_000, "log": 1_000_000,
              "pow": 10_000}
_RESULT_MIN = Decimal("0.001")
_RESULT_MAX = Decimal(10) ** 9
_TIE_GUARD = Decimal("1e-20")
_MAX_ATTEMPTS = 10_000

_EXACT = Context(prec=50, rounding=ROUND_HALF_EVEN, traps=[Inexact, InvalidOperation, DivisionByZero, Overflow])
_ROUNDED = Context(prec=50, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero, Overflow])

_TEMPLATES = "templates.json"


@dataclass(frozen=True)
class Problem:
    """One problem: operands and gold as strings on the 0.001 grid, question text, split, corruption factors."""

    id: str
    op: str
    a: str
    b: str
    gold: str
    question: str
    split: str
    factors: CorruptionFactors

    def to_dict(self, *, mix_sign: bool = True) -> dict[str, Any]:
        """The row; ``mix_sign=False`` leaves out the mixed conditions' sign (the hashed form, see
        :func:`problems_sha256`)."""
        row = {"id": self.id, "op": self.op, "a": self.a, "b": self.b, "gold": self.gold,
               "question": self.question, "split": self.split, "factors": self.factors.as_dict()}
        if mix_sign:
            row["mix_sign"] = self.factors.mix_sign
        return row


class _OutsideDomain(ValueError):
    """The operands are outside the operation's domain."""


def _is_transcendental(op: str, b: Decimal) -> bool:
    return op == "log" or (op == "pow" and b != b.to_integral_value())


def exact_value(op: str, a: str | Decimal, b: str | Decimal) -> Decimal:
    """The result at 50 significant digits (exact where the module docstring says so).

    Raises ValueError outside the operation's domain (division or mod by zero, log base <= 0 or 1, argument
    <= 0, negative base of a power).
    """
    a, b = Decimal(a), Decimal(b)
    if op == "add":
        return _EXACT.add(a, b)
    if op == "mul":
        return _EXACT.multiply(a, b)
    if op == "div":
        if b.is_zero():
            raise _OutsideDomain("division by zero")
        return _ROUNDED.divide(a, b)
    if op == "mod":
        if not (a > 0 and b > 0):
            raise _OutsideDomain("mod needs positive operands")
        return _EXACT.remainder(a, b)
    if op == "log":
        if not (a > 0 and b > 0) or a == 1:
            raise _OutsideDomain("log needs base > 0, base != 1 and argument > 0")
        return _ROUNDED.divide(_ROUNDED.ln(b), _ROUNDED.ln(a))
    if op == "pow":
        if not a > 0:
            raise _OutsideDomain("pow needs a positive base")
        if b == b.to_integral_value():
            return _EXACT.power(a, int(b))
        return _ROUNDED.exp(_ROUNDED.multiply(b, _ROUNDED.ln(a)))
    raise ValueError(f"unknown operation {op!r}; expected one of {list(OPS)}")


def _near_tie(value: Decimal) -> bool:
    """True when |value| in thousandths is within 1e-20 of a half-integer (undecidable rounding)."""
    scaled = abs(value).scaleb(3)
    return abs(scaled - scaled.to_integral_value(rounding="ROUND_FLOOR") - Decimal("0.5")) < _TIE_GUARD


def _admissible(op: str, a: str, b: str) -> Decimal | None:
    """The 50-digit result when (a, b) is a valid problem, else None (see the redraw rules)."""
    try:
        value = exact_value(op, a, b)
    except _OutsideDomain:
        return None
    if not (_RESULT_MIN <= abs(value) <= _RESULT_MAX):
        return None
    if _is_transcendental(op, Decimal(b)) and _near_tie(value):
        return None
    return value


def gold_answer(op: str, a: str, b: str) -> str:
    """Gold answer string: the 50-digit result rounded half-up to three decimals."""
    return format(round_half_up(exact_value(op, a, b)), "f")


def _grid(index: int, negative: bool) -> str:
    text = f"{index // 1000}.{index % 1000:03d}"
    return f"-{text}" if negative else text


def _load_templates() -> tuple[dict[str, str], str]:
    obj = load_data(_TEMPLATES, schema_version="memtoc-codeexec-templates-v1", required=("templates", "suffix"))
    templates = obj["templates"]
    for op in OPS:
        if op not in templates:
            raise BenchmarkDataError("operation has no template", path=_TEMPLATES, field=f"templates.{op}")
        if "{a}" not in templates[op] or "{b}" not in templates[op]:
            raise BenchmarkDataError("template must use {a} and {b}", path=_TEMPLATES, field=f"templates.{op}")
    return templates, obj["suffix"]


def _draw_operands(seed: int, op: str) -> list[tuple[str, str]]:
    stream = SeededStream(seed, f"operands/{op}")
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    hi = _MAX_INDEX[op]
    for _ in range(PER_OP):
        for _attempt in range(_MAX_ATTEMPTS):
            ka, kb = stream.randint(1, hi), stream.randint(1, hi)
            neg_a = neg_b = False
            if op in _SIGNED_OPS:
                neg_a, neg_b = stream.randint(0, 1) == 1, stream.randint(0, 1) == 1
            pair = (_grid(ka, neg_a), _grid(kb, neg_b))
            if pair not in seen and _admissible(op, *pair) is not None:
                seen.add(pair)
                out.append(pair)
                break
        else:  # pragma: no cover - the valid fraction of every operation is far above 1e-4
            raise RuntimeError(f"no admissible {op} problem in {_MAX_ATTEMPTS} draws")
    return out


def heldout_counts(split_seed: int = 0) -> dict[str, int]:
    """Held-out problems per operation: 17 for four operations, 16 for two (drawn from ``split_seed``)."""
    base, extra = divmod(N_HELDOUT, len(OPS))
    order = list(OPS)
    SeededStream(split_seed, "split/ops").shuffle(order)
    return {op: base + (1 if op in order[:extra] else 0) for op in OPS}


def _heldout_indices(split_seed: int, op: str, count: int) -> set[int]:
    indices = list(range(PER_OP))
    SeededStream(split_seed, f"split/{op}").shuffle(indices)
    return set(indices[:count])


def generate_problems(seed: int = 0, *, config: CorruptionConfig | None = None,
                      split_seed: int = 0) -> list[Problem]:
    """All 300 problems, ordered by operation (:data:`OPS`) and then index; deterministic in the arguments."""
    cfg = config or CorruptionConfig()
    templates, suffix = _load_templates()
    counts = heldout_counts(split_seed)
    problems: list[Problem] = []
    for op in OPS:
        heldout = _heldout_indices(split_seed, op, counts[op])
        for i, (a, b) in enumerate(_draw_operands(seed, op)):
            pid = f"{op}-{i:03d}"
            problems.append(Problem(
                id=pid, op=op, a=a, b=b, gold=gold_answer(op, a, b),
                question=f"{templates[op].format(a=a, b=b)} {suffix}",
                split="heldout" if i in heldout else "dev",
                factors=draw_factors(seed, pid, cfg),
            ))
    return problems


# ---------------------------------------------------------------------------------------------------------
# serialization


def problems_to_jsonl(problems: Iterable[Problem], *, mix_sign: bool = True) -> str:
    """Canonical JSONL: one object per line, keys sorted, no spaces, UTF-8 text, "\\n" after every line."""
    return "".join(json.dumps(p.to_dict(mix_sign=mix_sign), sort_keys=True, ensure_ascii=False,
                              separators=(",", ":")) + "\n" for p in problems)


def problems_sha256(problems: Iterable[Problem]) -> str:
    """SHA-256 of :func:`problems_to_jsonl` without the mixed conditions' sign, encoded as UTF-8.

    The sign (P1 / P2) is a function of the seed and the id alone, and every run identity records the seed, so
    leaving it out keeps the hash -- and so the resumability -- of runs written before the mixed conditions.
    """
    return hashlib.sha256(problems_to_jsonl(problems, mix_sign=False).encode("utf-8")).hexdigest()


_FIELDS = ("id", "op", "a", "b", "gold", "question", "split", "factors")


def problems_from_jsonl(text: str, *, path: str | Path | None = None) -> list[Problem]:
    """Read :func:`problems_to_jsonl` output back, checking every row (each gold answer is recomputed from the
    operands and must match); errors name the file (``path``, when given), the 1-based line and the field."""
    out: list[Problem] = []
    ids: set[str] = set()
    for row, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchmarkDataError(f"not valid JSON ({exc})", path=path, row=row) from exc
        if not isinstance(obj, dict):
            raise BenchmarkDataError("a row must be a JSON object", path=path, row=row)
        for key in _FIELDS:
            if key not in obj:
                raise BenchmarkDataError("required field is missing", path=path, row=row, field=key)
        if obj["op"] not in OPS:
            raise BenchmarkDataError(f"unknown operation {obj['op']!r}", path=path, row=row, field="op")
        if obj["split"] not in SPLITS:
            raise BenchmarkDataError(f"unknown split {obj['split']!r}", path=path, row=row, field="split")
        if obj["id"] in ids:
            raise BenchmarkDataError(f"duplicate id {obj['id']!r}", path=path, row=row, field="id")
        for key in ("a", "b", "gold"):
            try:
                Decimal(str(obj[key]))
            except InvalidOperation as exc:
                raise BenchmarkDataError(f"not a number: {obj[key]!r}", path=path, row=row, field=key) from exc
        try:
            # The mixed conditions' sign is derived from (seed, id) and not part of the hashed row; a file may
            # carry it as the optional field ``mix_sign`` (default "+": sign kept).
            factors = CorruptionFactors.from_dict(obj["factors"], mix_sign=str(obj.get("mix_sign", "+")))
        except (ValueError, TypeError, InvalidOperation) as exc:
            raise BenchmarkDataError(str(exc), path=path, row=row, field="factors") from exc
        try:
            expected = gold_answer(obj["op"], obj["a"], obj["b"])
        except ValueError as exc:
            raise BenchmarkDataError(str(exc), path=path, row=row, field="a") from exc
        if expected != obj["gold"]:
            raise BenchmarkDataError(f"gold {obj['gold']!r} does not match the recomputed {expected!r}",
                                     path=path, row=row, field="gold")
        ids.add(obj["id"])
        out.append(Problem(id=obj["id"], op=obj["op"], a=obj["a"], b=obj["b"], gold=obj["gold"],
                           question=obj["question"], split=obj["split"], factors=factors))
    return out
