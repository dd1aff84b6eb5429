"""Conditions: factors, stdout corruption (every numeric token changes, nothing else does), tool returns."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pytest

from memtoc.tasks.codeexec.conditions import (
    CONDITIONS,
    CORRUPTED_CONDITIONS,
    CorruptionFactors,
    corrupt_stdout,
    corrupted_gold,
    corrupted_numbers,
    corruption_visible,
    draw_factors,
    tool_return,
)
from memtoc.tasks.codeexec.numtokens import find_numbers
from memtoc.tasks.codeexec.problems import generate_problems
from memtoc.tasks.codeexec.sandbox import ExecutionResult, run_python
from memtoc.core.errors import MemtocError

SAMPLE = ("result = 556.307\n"
          "values: [1, -2, 3.25, -0.5e-3, 1.5E+10]\n"
          "x1 = float64(7) ; version 1.5.3 ; hex 0x1F ; nan inf\n"
          "3-2 gives +12 and .5 and 0 and 0.000; done at 12.\n"
          "sci 6.02e23 and 1e-05 ok\n")


@pytest.fixture(scope="module")
def problem():
    return generate_problems(0)[0]


def _ok(stdout: str) -> ExecutionResult:
    return ExecutionResult(stdout=stdout, stderr="", exit_code=0, timed_out=False, killed_reason=None, ok=True)


def _between(text: str) -> list[str]:
    """The text outside the numeric tokens, as the list of gaps."""
    gaps, pos = [], 0
    for tok in find_numbers(text):
        gaps.append(text[pos:tok.start])
        pos = tok.end
    gaps.append(text[pos:])
    return gaps


def test_token_rules():
    texts = [t.text for t in find_numbers(SAMPLE)]
    assert texts == ["556.307", "1", "-2", "3.25", "-0.5e-3", "1.5E+10", "7", "3", "2", "+12", ".5", "0",
                     "0.000", "12", "6.02e23", "1e-05"]


@pytest.mark.parametrize("factor", ["1.237", "0.808407", "-1.237", "23.41", "-23.41", "-0.7"])
def test_every_nonzero_token_changes_and_nothing_else(factor):
    f = Decimal(factor)
    out = corrupt_stdout(SAMPLE, f)
    orig, new = find_numbers(SAMPLE), find_numbers(out.text)
    assert len(orig) == len(new)
    assert _between(out.text) == _between(SAMPLE)          # everything but the numbers is byte-identical
    assert len(out.replacements) == sum(not t.value.is_zero() for t in orig)
    for a, b in zip(orig, new):
        if a.value.is_zero():
            assert b.text == a.text                         # zero cannot be moved by a factor
            continue
        assert b.value != a.value, (a.text, b.text)
        assert b.decimals == a.decimals                     # same number of decimals (mantissa for sci)
        assert bool(b.exponent) == bool(a.exponent)
        assert (b.value < 0) == ((a.value < 0) != (f < 0))  # sign preserved or reversed with the factor
        if not a.exponent:
            ulp = Decimal(1).scaleb(-a.decimals)
            # rounded product, or the one-unit nudge when rounding gave the value back
            assert abs(b.value - a.value * f) <= ulp / 2 or abs(abs(b.value) - abs(a.value)) == ulp


def test_corruption_formats_exactly():
    assert corrupt_stdout("12.3456", "1.1").text == "13.5802"
    assert corrupt_stdout("x = 12.3456\n", "-1.1").text == "x = -13.5802\n"
    assert corrupt_stdout("x=-3", "-1.2").text == "x=4"                 # -3 x -1.2 = 3.6 -> 4
    assert corrupt_stdout("2", "1.2").text == "3"                       # 2.4 rounds back to 2: nudged up
    assert corrupt_stdout("1", "0.8").text == "2"                       # 0.8 rounds to 1, down would be 0
    assert corrupt_stdout("5", "0.8").text == "4"
    assert corrupt_stdout("+5", "1.5").text == "+8"                     # 7.5 -> 8 half-up, plus kept
    assert corrupt_stdout("1.5e-05", "20").text == "3.0e-04"            # renormalised, exponent width kept
    assert corrupt_stdout("2.5E+10", "5").text == "1.3E+11"             # 12.5 -> 1.25 -> 1.3
    assert corrupt_stdout("1e5", "1.1").text == "2e5"                   # 1.1e5 -> 1e5 is a collapse: nudged
    assert corrupt_stdout(".5", "3").text == "1.5"
    assert corrupt_stdout("0 and 0.000", "7").text == "0 and 0.000"
    assert corrupt_stdout("x1 float64 1.5.3 0x1F nan", "7").text == "x1 float64 1.5.3 0x1F nan"
    with pytest.raises(ValueError):
        corrupt_stdout("1", "1")


def test_corruption_fuzz_keeps_structure():
    rng = random.Random(0)
    pieces = [" ", ", ", "\n", "[", "]", "(", ")", "=", ": ", "abc", "x_", " - ", "\t"]
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.5:
                kind = rng.choice(["int", "{:.1f}", "{:.3f}", "{:.6f}", "{:.2e}", "{!r}"])
                number = str(rng.randint(0, 10**6)) if kind == "int" else kind.format(rng.random() * 1000)
                parts.append(rng.choice(["", "-"]) + number)
            parts.append(rng.choice(pieces))
        text = "".join(parts)
        factor = rng.choice(["1.1", "1.5", "0.7", "-1.3", "17.5", "-45.123"])
        out = corrupt_stdout(text, factor)
        tokens = [t for t in find_numbers(text) if not t.value.is_zero()]
        assert [(r.start, r.end, r.original) for r in out.replacements] == [(t.start, t.end, t.text) for t in tokens]
        # rebuild the corrupted text from the original's gaps and the replacements: nothing else may differ
        rebuilt, pos = [], 0
        for r in out.replacements:
            rebuilt += [text[pos:r.start], r.corrupted]
            pos = r.end
            assert Decimal(r.corrupted) != Decimal(r.original)
        assert "".join(rebuilt) + text[pos:] == out.text


def test_tool_returns_per_condition(problem):
    stdout = "556.307\n"
    execution = _ok(stdout)
    assert tool_return(problem, "P0", execution).text == stdout
    with pytest.raises(MemtocError):
        tool_return(problem, "no_tool", execution)
    texts = set()
    for cond in CORRUPTED_CONDITIONS:
        r = tool_return(problem, cond, execution)
        assert r.corrupted and r.factor == format(problem.factors.factor(cond), "f")
        assert Decimal(r.text) == corrupted_gold(problem, cond)   # printed at 3 decimals: the injected value
        assert corrupted_numbers([r]) == (corrupted_gold(problem, cond),)
        texts.add(r.text)
    assert len(texts) == 4


def test_failed_execution_passes_the_real_traceback_uncorrupted(problem):
    execution = run_python("print(556.307)\nx = 12.5\nraise ValueError(f'bad value {x} at 3.25')\n")
    assert not execution.ok and "ValueError: bad value 12.5 at 3.25" in execution.stderr
    returns = [tool_return(problem, c, execution) for c in CONDITIONS[1:]]
    for r in returns:
        assert r.text == execution.stderr and not r.corrupted and r.factor is None and not r.execution_ok
        assert "Traceback (most recent call last)" in r.text and 'File "main.py", line 3' in r.text
        assert "556.307" not in r.text                             # partial stdout of a failed run is withheld
    killed = ExecutionResult(stdout="1\n", stderr="", exit_code=-9, timed_out=True, killed_reason="timeout",
                             ok=False, detail="wall-clock limit of 5 s")
    r = tool_return(problem, "P2-", killed)
    assert r.text == "[execution stopped: timeout: wall-clock limit of 5 s]\n" and not r.corrupted


def test_factors_are_fixed_per_problem_and_seed():
    a = draw_factors(0, "add-000")
    assert a == draw_factors(0, "add-000")
    assert a != draw_factors(1, "add-000") or a != draw_factors(0, "add-001")
    assert CorruptionFactors.from_dict(a.as_dict(), mix_sign=a.mix_sign) == a
    with pytest.raises(ValueError):
        CorruptionFactors.from_dict({"P1+": "1.2", "P1-": "-1.3", "P2+": "7", "P2-": "-7"})


def test_corrupted_gold_is_visible_for_every_seed0_item():
    problems = generate_problems(0)
    for p in problems:
        for cond in CORRUPTED_CONDITIONS:
            assert corruption_visible(p, cond), (p.id, cond)
            assert corrupted_gold(p, cond) != Decimal(p.gold)
    tiny = next(p for p in problems if p.id == "add-000")
    fake = type(tiny)(**{**tiny.__dict__, "gold": "0.001", "factors": CorruptionFactors("1.1", "7")})
    assert not corruption_visible(fake, "P1+") and corruption_visible(fake, "P1-")


def test_sign_variants_share_magnitude(problem):
    assert re.sub("^-", "", format(problem.factors.factor("P1-"), "f")) == format(problem.factors.factor("P1+"), "f")
