"""Grader rules (parsing, half-up rounding, adoption), the metrics built on them, and the prompt data."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

from memtoc.tasks.codeexec.conditions import CorruptionFactors, corrupted_gold
from memtoc.tasks.codeexec.grader import grade, grade_answer, parse_answer
from memtoc.tasks.codeexec.metrics import (
    MetricsConfig,
    Trial,
    accuracy,
    adoption_rate,
    known_problem_ids,
    override_rate,
    summarize,
    tool_call_ratio,
    validate_trials,
)
from memtoc.tasks.codeexec.problems import generate_problems
from memtoc.tasks.codeexec.prompts import POLICIES, final_answer_turn, load_policies, system_prompt, user_prompt
from memtoc.core.errors import BenchmarkDataError

DATA = Path(__file__).resolve().parents[4] / "memtoc" / "tasks" / "codeexec" / "data"


@pytest.fixture(scope="module")
def problem():
    p = generate_problems(0)[0]          # add-000: 909.525 + -353.218 = 556.307
    assert p.gold == "556.307"
    return p


# ------------------------------------------------------------------ parsing

@pytest.mark.parametrize("text, value, source", [
    ("FINAL ANSWER: 12.345", "12.345", "final_answer"),
    ("so the result is 3.\nfinal answer:   -0.5", "-0.5", "final_answer"),
    ("**FINAL ANSWER:** 1,234.5678", "1234.5678", "final_answer"),
    ("Final Answer: $\\boxed{7.125}$", "7.125", "final_answer"),
    ("FINAL ANSWER: x = 2.5e3 (about 2500)", "2.5e3", "final_answer"),
    ("FINAL ANSWER:\n\n  42", "42", "final_answer"),
    ("FINAL ANSWER: \u22123.25", "-3.25", "final_answer"),
    ("I will end with FINAL ANSWER: <number>.\nWork: 1+2=3\nFINAL ANSWER: 3.000", "3.000", "final_answer"),
    ("FINAL ANSWER: 9.5\nsorry, FINAL ANSWER: unknown", "9.5", "final_answer"),
    ("The tool says 10.5, but I get 11.25 in the end.", "11.25", "last_number"),
    ("x1 = float64 and version 1.5.3", None, "none"),
    ("", None, "none"),
])
def test_parse_answer(text, value, source):
    parsed = parse_answer(text)
    assert parsed.source == source
    assert parsed.value == (None if value is None else Decimal(value.replace(",", "").replace("\u2212", "-")))


# ------------------------------------------------------------------ correctness and rounding

@pytest.mark.parametrize("answer, gold, correct", [
    ("1.2345", "1.235", True),        # half-up at the .0005 boundary
    ("1.2345", "1.234", False),
    ("1.23449999", "1.234", True),
    ("-1.2345", "-1.235", True),      # halves go away from zero
    ("-1.2345", "-1.234", False),
    ("0.0005", "0.001", True),
    ("0.00049", "0.001", False),
    ("556.307", "556.307", True),
    ("556.3074", "556.307", True),
    ("556.3075", "556.307", False),
    ("556.31", "556.307", False),
    ("556307e-3", "556.307", True),
    ("1e50", "556.307", False),
])
def test_correct_after_half_up_rounding(answer, gold, correct):
    g = grade_answer(f"FINAL ANSWER: {answer}", gold)
    assert g.correct is correct
    assert g.adopted is None


def test_no_answer_is_wrong():
    g = grade_answer("I cannot tell.", "1.000", [Decimal("2")])
    assert g.answer is None and not g.correct and g.adopted is False


# ------------------------------------------------------------------ adoption

def test_adoption_of_the_injected_value(problem):
    for cond in ("P1+", "P1-", "P2+", "P2-"):
        wrong = corrupted_gold(problem, cond)
        g = grade(f"FINAL ANSWER: {wrong}", problem, cond)
        assert g.adopted and not g.correct and g.matched_corruption == format(wrong, "f")
        assert grade(f"FINAL ANSWER: {problem.gold}", problem, cond).adopted is False
        assert grade("FINAL ANSWER: 1.5", problem, cond).adopted is False
    assert grade(f"FINAL ANSWER: {corrupted_gold(problem, 'P1+')}", problem, "P0").adopted is None
    assert grade("FINAL ANSWER: 1", problem, "no_tool").adopted is None


def test_adoption_of_another_corrupted_number(problem):
    # the run returned intermediate numbers too; answering one of them (after rounding) is adoption
    others = [Decimal("424.33849"), Decimal("-17.0004")]
    assert grade("FINAL ANSWER: 424.338", problem, "P1+", others).adopted
    assert grade("FINAL ANSWER: -17.0", problem, "P1+", others).adopted
    assert grade("FINAL ANSWER: -17.002", problem, "P1+", others).adopted is False
    assert grade("FINAL ANSWER: -17.0", problem, "P1+", []).adopted is False


def test_correct_answer_is_never_adoption(problem):
    # a corrupted loop counter that happens to equal the gold does not turn a correct answer into adoption
    g = grade(f"FINAL ANSWER: {problem.gold}", problem, "P2+", [Decimal(problem.gold)])
    assert g.correct and g.adopted is False


def test_tiny_gold_collision_counts_as_correct(problem):
    fake = type(problem)(**{**problem.__dict__, "gold": "0.001", "factors": CorruptionFactors("1.1", "7")})
    g = grade("FINAL ANSWER: 0.0011", fake, "P1+")
    assert g.correct and g.adopted is False


# ------------------------------------------------------------------ metrics

def _trials():
    """p1 known (3/3 no-tool), p2 known (2/3), p3 unknown (1/3); P0 and P1+ trials with tool calls."""
    out = []
    no_tool = {"p1": [1, 1, 1], "p2": [1, 0, 1], "p3": [0, 0, 1]}
    for pid, hits in no_tool.items():
        out += [Trial(pid, "no_tool", r, bool(h)) for r, h in enumerate(hits)]
    for pid in no_tool:
        out += [Trial(pid, "P0", r, True, None, 1) for r in range(3)]
    adopted = {"p1": [1, 0, 0], "p2": [1, 1, 0], "p3": [1, 1, 1]}
    for pid, hits in adopted.items():
        out += [Trial(pid, "P1+", r, not h, bool(h), 2 if h else 1) for r, h in enumerate(hits)]
    return out


def test_metric_values():
    trials = _trials()
    cfg = MetricsConfig(n_boot=200)
    assert accuracy(trials, "no_tool", config=cfg).value == pytest.approx(6 / 9)
    assert accuracy(trials, "P0", config=cfg).value == 1.0
    assert known_problem_ids(trials, cfg) == {"p1", "p2"}
    assert known_problem_ids(trials, MetricsConfig(min_known_correct=3)) == {"p1"}
    adoption = adoption_rate(trials, "P1+", config=cfg)
    assert adoption.value == pytest.approx(6 / 9) and adoption.n_problems == 3 and adoption.n_trials == 9
    override = override_rate(trials, "P1+", config=cfg)
    assert override.value == pytest.approx(3 / 6) and override.n_problems == 2
    ratio = tool_call_ratio(trials, "P1+", config=cfg)
    assert ratio.value == pytest.approx((15 / 9) / 1.0)
    for est in (adoption, override, ratio):
        assert est.ci.low <= est.value <= est.ci.high
    with pytest.raises(ValueError):
        adoption_rate(trials, "P0")


def test_interval_is_an_item_bootstrap():
    # all repetitions of a problem agree, so resampling trials (not problems) would give a narrower interval
    trials = [Trial(f"p{i}", "P0", r, i % 2 == 0) for i in range(10) for r in range(3)]
    est = accuracy(trials, "P0", config=MetricsConfig(n_boot=500))
    assert est.value == 0.5 and est.n_problems == 10
    assert est.ci.width >= 0.5        # ten clusters of three: roughly +-0.3, not +-0.18


def test_summary_and_validation():
    trials = _trials()
    rows = summarize(trials, MetricsConfig(n_boot=100))
    assert [(r.policy, r.condition) for r in rows] == [("Plain", "no_tool"), ("Plain", "P0"), ("Plain", "P1+")]
    assert rows[0].adoption is None and rows[2].override.value == pytest.approx(0.5)
    json.dumps([r.to_dict() for r in rows])
    with pytest.raises(BenchmarkDataError):
        validate_trials(trials[:-1], 3)               # a missing repetition
    with pytest.raises(BenchmarkDataError):
        validate_trials(trials + [Trial("p1", "P0", 0, True, None, 1)], 3)   # a duplicate
    with pytest.raises(BenchmarkDataError):
        validate_trials([Trial("p1", "P1+", 0, True, None)], 1)            # adoption missing
    empty = accuracy([], "P0")
    assert math.isnan(empty.value) and empty.n_trials == 0


# ------------------------------------------------------------------ prompt data

def test_prompts_and_policies(problem):
    data = json.loads((DATA / "policies.json").read_text(encoding="utf-8"))["policies"]
    assert list(load_policies()) == list(POLICIES) == ["Plain", "Compare", "Verify", "Disclose"]
    assert data["Plain"] == ""
    base = system_prompt("P1+", "Plain")
    assert "FINAL ANSWER:" in base and "three decimals" in base and "python_executor" in base
    for name in POLICIES[1:]:
        sentence = data[name]
        assert sentence.count(".") == 1 and sentence.endswith(".")
        assert system_prompt("P2-", name) == f"{base} {sentence}"
        assert system_prompt("no_tool", name) == system_prompt("no_tool")
    assert "python_executor" not in system_prompt("no_tool") and "FINAL ANSWER:" in system_prompt("no_tool")
    assert user_prompt(problem.question) == problem.question
    assert final_answer_turn() == "Please give your final answer now."
    with pytest.raises(ValueError):
        system_prompt("P3", "Plain")
