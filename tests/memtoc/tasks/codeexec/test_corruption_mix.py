"""The overreliance paper's corruption mix: P1 / P2 reverse the output's sign on about half the problems (seeded).

Tolerances are binomial: with n problems and a fair sign draw, the share of reversed signs has sd
sqrt(0.25 / n) (0.029 for the 300 problems of one seed), and every check allows 3.5 sd (a fair draw lands outside
with probability 5e-4). The old recipe's always sign-preserving P1+ (share 0) fails every one of them.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from memtoc.tasks.codeexec.conditions import (MIXED_CONDITIONS, CorruptionFactors, corrupt_stdout, draw_factors,
                                        draw_mix_sign, tool_return)
from memtoc.tasks.codeexec.problems import OPS, generate_problems, problems_sha256
from memtoc.tasks.codeexec.sandbox import ExecutionResult

K_SD = 3.5


def _tolerance(n: int) -> float:
    return K_SD * math.sqrt(0.25 / n)


def sign_reversed(factors: CorruptionFactors, condition: str) -> bool:
    """True when ``condition`` reverses the output's sign on the problem with these factors."""
    return factors.factor(condition) < 0


def _share(problems, condition: str) -> float:
    return sum(sign_reversed(p.factors, condition) for p in problems) / len(problems)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("condition", MIXED_CONDITIONS)
def test_sign_reversal_share_is_about_one_half(seed, condition):
    problems = generate_problems(seed)
    assert len(problems) == 300
    assert abs(_share(problems, condition) - 0.5) <= _tolerance(300)


def test_share_pooled_over_seeds_and_per_operation():
    """Pooled over 10 seeds (3000 problems, sd 0.009) the share is tight around 1/2, and every operation gets
    both signs (50 problems per seed: sd 0.071)."""
    shares, per_op = [], {op: [] for op in OPS}
    for seed in range(10):
        for p in generate_problems(seed):
            r = sign_reversed(p.factors, "P1")
            shares.append(r)
            per_op[p.op].append(r)
    assert abs(sum(shares) / len(shares) - 0.5) <= _tolerance(len(shares))
    for op, vals in per_op.items():
        assert abs(sum(vals) / len(vals) - 0.5) <= _tolerance(len(vals)), op


def test_mixed_sign_is_seeded_and_independent_of_the_magnitudes():
    a, b = generate_problems(0), generate_problems(0)
    assert [p.factors for p in a] == [p.factors for p in b]
    other = generate_problems(1)
    assert [p.factors.mix_sign for p in a] != [p.factors.mix_sign for p in other]
    # the sign has its own stream: the stored factor table (and so the problem set's hash) is what it was
    for p in a[:20]:
        assert draw_mix_sign(0, p.id) == p.factors.mix_sign
        assert p.factors.as_dict() == {k: v for k, v in draw_factors(0, p.id).as_dict().items()}
        assert set(p.factors.as_dict()) == {"P1+", "P1-", "P2+", "P2-"}
    assert problems_sha256(a) == problems_sha256(b)


def test_mixed_condition_is_the_problems_signed_condition():
    """P1 on a problem is exactly its P1+ or P1- (same factor, same corrupted stdout); P2 shares the sign."""
    problems = generate_problems(0)
    ok = ExecutionResult(stdout="1250.352\n", stderr="", exit_code=0, timed_out=False, killed_reason=None, ok=True)
    seen = set()
    for p in problems[:40]:
        f = p.factors
        for level in ("P1", "P2"):
            signed = f"{level}{f.mix_sign}"
            assert f.factor(level) == f.factor(signed)
            mixed, fixed = tool_return(p, level, ok), tool_return(p, signed, ok)
            assert mixed.text == fixed.text == corrupt_stdout("1250.352\n", f.factor(signed)).text
            assert (Decimal(mixed.text) < 0) == (f.mix_sign == "-")
        assert sign_reversed(f, "P1") == sign_reversed(f, "P2")
        seen.add(f.mix_sign)
    assert seen == {"+", "-"}


def test_factor_table_round_trip_keeps_the_sign():
    f = CorruptionFactors(p1="1.2", p2="7", mix_sign="-")
    assert CorruptionFactors.from_dict(f.as_dict(), mix_sign="-") == f
    with pytest.raises(ValueError):
        CorruptionFactors(p1="1.2", p2="7", mix_sign="x")
