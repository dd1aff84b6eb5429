"""The seeded problem set: reproducibility, counts, split, domain/range rules, and independent gold checks."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter
from decimal import Context, Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from memtoc.tasks.codeexec.conditions import CorruptionConfig
from memtoc.tasks.codeexec.problems import (
    N_HELDOUT,
    OPS,
    PER_OP,
    generate_problems,
    heldout_counts,
    problems_from_jsonl,
    problems_sha256,
    problems_to_jsonl,
)
from memtoc.core.errors import BenchmarkDataError

#: SHA-256 of problems_to_jsonl(generate_problems(0)), checked in two separate interpreter processes (with
#: different PYTHONHASHSEED values) before it was pinned.
SEED0_SHA256 = "d05b23ee5576e8785c0ec47729ff5b82a2528d26c1f56689ffd142e80ceac439"

GRID = re.compile(r"^-?(0|[1-9][0-9]*)\.[0-9]{3}$")
DATA = Path(__file__).resolve().parents[4] / "memtoc" / "tasks" / "codeexec" / "data"


@pytest.fixture(scope="module")
def problems():
    return generate_problems(0)


def test_seed0_bytes_are_pinned(problems):
    assert problems_sha256(problems) == SEED0_SHA256


def test_same_seed_twice_is_byte_identical(problems):
    assert problems_to_jsonl(generate_problems(0)).encode() == problems_to_jsonl(problems).encode()


def test_same_bytes_in_a_separate_process(problems):
    code = ("from memtoc.tasks.codeexec.problems import generate_problems, problems_sha256; "
            "print(problems_sha256(generate_problems(0)))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True)
    assert out.stdout.strip() == problems_sha256(problems) == SEED0_SHA256


def test_other_seed_gives_other_problems(problems):
    other = generate_problems(1)
    assert problems_sha256(other) != SEED0_SHA256
    assert [p.id for p in other] == [p.id for p in problems]
    assert sum(p.a != q.a for p, q in zip(other, problems)) > 250


def test_counts_ids_and_split(problems):
    assert len(problems) == 300
    assert Counter(p.op for p in problems) == {op: PER_OP for op in OPS}
    assert [p.id for p in problems] == [f"{op}-{i:03d}" for op in OPS for i in range(PER_OP)]
    assert Counter(p.split for p in problems) == {"dev": 200, "heldout": N_HELDOUT}
    per_op = Counter(p.op for p in problems if p.split == "heldout")
    assert sorted(per_op.values()) == [16, 16, 17, 17, 17, 17]
    assert per_op == heldout_counts(0)


def test_split_is_a_function_of_ids_only(problems):
    other = generate_problems(7)
    assert [(p.id, p.split) for p in other] == [(p.id, p.split) for p in problems]


def _exact(op: str, a: str, b: str) -> Fraction | float:
    fa, fb = Fraction(a), Fraction(b)
    if op == "add":
        return fa + fb
    if op == "mul":
        return fa * fb
    if op == "div":
        return fa / fb
    if op == "mod":
        return fa - fb * math.floor(fa / fb)
    if op == "log":
        return math.log(float(fb)) / math.log(float(fa))
    return float(fa) ** float(fb)


def test_operands_domain_and_range(problems):
    seen = set()
    for p in problems:
        assert GRID.match(p.a) and GRID.match(p.b), p.id
        a, b = Decimal(p.a), Decimal(p.b)
        hi = Decimal(10) if p.op == "pow" else Decimal(1000)
        assert Decimal("0.001") <= abs(a) <= hi and Decimal("0.001") <= abs(b) <= hi, p.id
        if p.op in ("mod", "log", "pow"):
            assert a > 0 and b > 0, p.id
        if p.op == "log":
            assert a != 1, p.id
        value = _exact(p.op, p.a, p.b)
        assert math.isfinite(float(value)), p.id
        assert 0.001 <= abs(value) <= 1e9, p.id
        assert (p.op, p.a, p.b) not in seen
        seen.add((p.op, p.a, p.b))
    # every sign combination occurs where signs are drawn, never elsewhere
    for op in ("add", "mul", "div"):
        signs = {(p.a.startswith("-"), p.b.startswith("-")) for p in problems if p.op == op}
        assert len(signs) == 4, op


def _half_up(x: Fraction) -> Fraction:
    """Round half away from zero to 0.001, exactly."""
    n = math.floor(abs(x) * 1000 + Fraction(1, 2))
    return Fraction(n if x >= 0 else -n, 1000)


def test_gold_of_rational_ops_matches_fractions(problems):
    checked = 0
    for p in problems:
        if p.op in ("add", "mul", "div", "mod"):
            assert Fraction(p.gold) == _half_up(_exact(p.op, p.a, p.b)), p.id
            assert GRID.match(p.gold), p.id
            checked += 1
    assert checked == 200


def test_gold_of_transcendental_ops_matches_floats_away_from_ties(problems):
    checked = 0
    for p in problems:
        if p.op not in ("log", "pow"):
            continue
        value = _exact(p.op, p.a, p.b)
        scaled = abs(value) * 1000
        if abs(scaled - math.floor(scaled) - 0.5) < 1e-9 + 1e-12 * scaled:
            continue  # too close to a tie for a float to decide
        expected = math.copysign(math.floor(scaled + 0.5) / 1000, value)
        assert Decimal(p.gold) == Decimal(repr(expected)).quantize(Decimal("0.001")), p.id
        checked += 1
    assert checked >= 90


def test_gold_of_transcendental_ops_matches_80_digit_decimal_other_path(problems):
    ctx = Context(prec=80, rounding="ROUND_HALF_UP")
    for p in problems:
        if p.op == "log":  # log10 quotient instead of ln quotient
            value = ctx.divide(ctx.log10(Decimal(p.b)), ctx.log10(Decimal(p.a)))
        elif p.op == "pow":  # Decimal's own power instead of exp(b ln a)
            value = ctx.power(Decimal(p.a), Decimal(p.b))
        else:
            continue
        assert format(ctx.quantize(value, Decimal("0.001")), "f") == p.gold, p.id


def test_questions_come_from_the_template_file(problems):
    data = json.loads((DATA / "templates.json").read_text(encoding="utf-8"))
    for p in problems:
        expected = data["templates"][p.op].format(a=p.a, b=p.b) + " " + data["suffix"]
        assert p.question == expected
        assert p.a in p.question and p.b in p.question
    assert problems[0].question.endswith("Round to three decimals.")


def test_factors_are_in_their_ranges_and_paired(problems):
    directions = Counter()
    for p in problems:
        f = p.factors.as_dict()
        assert Decimal(f["P1-"]) == -Decimal(f["P1+"]) and Decimal(f["P2-"]) == -Decimal(f["P2+"])
        p1, p2 = Decimal(f["P1+"]), Decimal(f["P2+"])
        up = Decimal("1.1") <= p1 <= Decimal("1.5")
        down = Decimal(1) / Decimal("1.5") - Decimal("1e-6") <= p1 <= Decimal(1) / Decimal("1.1") + Decimal("1e-6")
        assert up or down, p.id
        directions[up] += 1
        assert Decimal(5) <= p2 <= Decimal(50), p.id
    assert directions[True] > 100 and directions[False] > 100


def test_corruption_config_changes_factors_not_problems(problems):
    cfg = CorruptionConfig(p2_low="2", p2_high="3")
    other = generate_problems(0, config=cfg)
    assert [(p.a, p.b, p.gold, p.split) for p in other] == [(p.a, p.b, p.gold, p.split) for p in problems]
    assert all(Decimal(2) <= Decimal(p.factors.p2) <= Decimal(3) for p in other)
    with pytest.raises(ValueError):
        CorruptionConfig(p1_low="0.9")


def test_jsonl_round_trip_and_errors(problems):
    text = problems_to_jsonl(problems)
    assert text.count("\n") == 300 and text.endswith("\n")
    assert problems_from_jsonl(text) == problems
    lines = text.splitlines()
    bad = json.loads(lines[4])
    bad["gold"] = "1.000"
    lines[4] = json.dumps(bad)
    with pytest.raises(BenchmarkDataError) as info:
        problems_from_jsonl("\n".join(lines), path="p.jsonl")
    assert info.value.row == 5 and info.value.field == "gold" and "p.jsonl" in str(info.value)
    missing = json.loads(text.splitlines()[0])
    del missing["factors"]
    with pytest.raises(BenchmarkDataError) as info:
        problems_from_jsonl(json.dumps(missing))
    assert info.value.field == "factors"
