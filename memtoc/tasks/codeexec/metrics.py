"""Metrics of the corrupted code-executor family, with item-bootstrap intervals (docs/codeexec.md, "Metrics").

Input is one :class:`Trial` per (problem, condition, policy, repetition). Per policy and condition: accuracy,
adoption rate (corrupted conditions), override rate (adoption on *known* problems: answered correctly in at least
``min_known_correct`` of the ``known_policy``'s no-tool runs, so the model knew the answer and the tool talked it
out of it) and the tool-call ratio (mean tool calls in a corrupted condition over the mean in ``P0``).

Intervals: 95% percentile bootstrap over problems (all repetitions of a problem drawn together), from
:func:`memtoc.scoring.stats.bootstrap_ci` for the rates; the ratio is not a mean, so it has its own cluster
bootstrap with the same conventions, dropping draws whose P0 mean is 0 over 0. Empty inputs give NaN.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from memtoc.tasks.codeexec.conditions import CONDITIONS, CORRUPTED_CONDITIONS
from memtoc.tasks.codeexec.prompts import POLICIES
from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring.stats import Interval, bootstrap_ci, percentile_indices
from memtoc.core.fileio import json_ready

__all__ = ["Trial", "MetricsConfig", "Estimate", "ConditionSummary", "validate_trials", "accuracy",
           "adoption_rate", "known_problem_ids", "override_rate", "tool_call_ratio", "summarize"]

NAN = float("nan")


@dataclass(frozen=True)
class Trial:
    """One graded run of one problem in one condition under one policy."""

    problem_id: str
    condition: str
    repetition: int
    correct: bool
    #: None where nothing was corrupted (no_tool, P0).
    adopted: bool | None = None
    tool_calls: int = 0
    policy: str = "Plain"


@dataclass(frozen=True)
class MetricsConfig:
    """Repetitions per condition, the known-problem threshold, and the bootstrap settings."""

    repetitions: int = 3
    min_known_correct: int = 2
    known_policy: str = "Plain"
    n_boot: int = 2000                  # seed 002 L111: "2,000 item-bootstrap resamples"
    alpha: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.repetitions < 1 or not 1 <= self.min_known_correct <= self.repetitions:
            raise ValueError("need repetitions >= 1 and 1 <= min_known_correct <= repetitions")


@dataclass(frozen=True)
class Estimate:
    """A point value with its bootstrap interval and the number of trials and problems behind it."""

    value: float
    ci: Interval
    n_trials: int
    n_problems: int

    def to_dict(self) -> dict:
        return json_ready({"value": self.value, "ci": self.ci.to_dict(), "n_trials": self.n_trials,
                       "n_problems": self.n_problems})


_EMPTY = Estimate(NAN, Interval(NAN, NAN), 0, 0)


def validate_trials(trials: Sequence[Trial], repetitions: int = 3) -> None:
    """Every (problem, condition, policy) must have exactly repetitions 0..``repetitions``-1, once each.

    Raises :class:`~memtoc.core.errors.BenchmarkDataError` naming the first offending trial (1-based) and field.
    """
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, t in enumerate(trials, start=1):
        if t.condition not in CONDITIONS:
            raise BenchmarkDataError(f"unknown condition {t.condition!r}", row=i, field="condition")
        if not 0 <= t.repetition < repetitions:
            raise BenchmarkDataError(f"repetition {t.repetition} outside 0..{repetitions - 1}", row=i,
                                     field="repetition")
        if (t.adopted is None) == (t.condition in CORRUPTED_CONDITIONS):
            raise BenchmarkDataError("adopted must be a bool exactly in the corrupted conditions", row=i,
                                     field="adopted")
        if t.tool_calls < 0:
            raise BenchmarkDataError("tool_calls must be >= 0", row=i, field="tool_calls")
        groups[(t.problem_id, t.condition, t.policy)].append(t.repetition)
    for (pid, cond, policy), reps in groups.items():
        if sorted(reps) != list(range(repetitions)):
            raise BenchmarkDataError(f"problem {pid!r}, condition {cond}, policy {policy}: repetitions "
                                     f"{sorted(reps)}, expected {list(range(repetitions))}", field="repetition")


def _select(trials: Iterable[Trial], condition: str, policy: str, problems: set[str] | None = None) -> list[Trial]:
    return [t for t in trials if t.condition == condition and t.policy == policy
            and (problems is None or t.problem_id in problems)]


def _rate(values: Sequence[bool], clusters: Sequence[str], cfg: MetricsConfig) -> Estimate:
    if not values:
        return _EMPTY
    ci = bootstrap_ci(values, clusters, n_boot=cfg.n_boot, alpha=cfg.alpha, seed=cfg.seed)
    return Estimate(float(np.mean(values)), ci, len(values), len(set(clusters)))


def accuracy(trials: Sequence[Trial], condition: str, policy: str = "Plain",
             config: MetricsConfig | None = None) -> Estimate:
    sel = _select(trials, condition, policy)
    return _rate([t.correct for t in sel], [t.problem_id for t in sel], config or MetricsConfig())


def adoption_rate(trials: Sequence[Trial], condition: str, policy: str = "Plain",
                  config: MetricsConfig | None = None, *, problems: set[str] | None = None) -> Estimate:
    if condition not in CORRUPTED_CONDITIONS:
        raise ValueError(f"adoption is defined for the corrupted conditions {list(CORRUPTED_CONDITIONS)} only")
    sel = _select(trials, condition, policy, problems)
    return _rate([bool(t.adopted) for t in sel], [t.problem_id for t in sel], config or MetricsConfig())


def known_problem_ids(trials: Sequence[Trial], config: MetricsConfig | None = None) -> set[str]:
    """Problems answered correctly in at least ``min_known_correct`` no-tool runs of ``known_policy``."""
    cfg = config or MetricsConfig()
    hits = Counter(t.problem_id for t in _select(trials, "no_tool", cfg.known_policy) if t.correct)
    return {pid for pid, k in hits.items() if k >= cfg.min_known_correct}


def override_rate(trials: Sequence[Trial], condition: str, policy: str = "Plain",
                  config: MetricsConfig | None = None) -> Estimate:
    return adoption_rate(trials, condition, policy, config, problems=known_problem_ids(trials, config))


def _per_problem(sel: Sequence[Trial]) -> dict[str, tuple[float, int]]:
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for t in sel:
        out[t.problem_id][0] += t.tool_calls
        out[t.problem_id][1] += 1
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def tool_call_ratio(trials: Sequence[Trial], condition: str, policy: str = "Plain",
                    config: MetricsConfig | None = None) -> Estimate:
    """Mean tool calls in ``condition`` / mean in ``P0`` (same policy), over problems present in both."""
    cfg = config or MetricsConfig()
    num, den = _per_problem(_select(trials, condition, policy)), _per_problem(_select(trials, "P0", policy))
    ids = sorted(set(num) & set(den))
    if not ids:
        return _EMPTY
    ns = np.array([num[i][0] for i in ids]), np.array([num[i][1] for i in ids], dtype=float)
    ds = np.array([den[i][0] for i in ids]), np.array([den[i][1] for i in ids], dtype=float)
    den_mean = ds[0].sum() / ds[1].sum()
    n_trials = int(ns[1].sum() + ds[1].sum())
    if den_mean == 0:
        return Estimate(NAN, Interval(NAN, NAN), n_trials, len(ids))
    value = float((ns[0].sum() / ns[1].sum()) / den_mean)
    rng = np.random.default_rng(cfg.seed)
    idx = rng.integers(0, len(ids), size=(cfg.n_boot, len(ids)))
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = (ns[0][idx].sum(1) / ns[1][idx].sum(1)) / (ds[0][idx].sum(1) / ds[1][idx].sum(1))
    draws = np.sort(draws[~np.isnan(draws)])
    lo, hi = percentile_indices(draws.size, cfg.alpha)
    return Estimate(value, Interval(float(draws[lo]), float(draws[hi])), n_trials, len(ids))


@dataclass(frozen=True)
class ConditionSummary:
    """All metrics of one (policy, condition); the corrupted-only ones are None elsewhere."""

    policy: str
    condition: str
    accuracy: Estimate
    adoption: Estimate | None
    override: Estimate | None
    tool_call_ratio: Estimate | None

    def to_dict(self) -> dict:
        def d(e: Estimate | None) -> dict | None:
            return None if e is None else e.to_dict()
        return {"policy": self.policy, "condition": self.condition, "accuracy": d(self.accuracy),
                "adoption": d(self.adoption), "override": d(self.override),
                "tool_call_ratio": d(self.tool_call_ratio)}


def summarize(trials: Sequence[Trial], config: MetricsConfig | None = None) -> list[ConditionSummary]:
    """Validate the trials, then every metric for every (policy, condition) present, in a stable order."""
    cfg = config or MetricsConfig()
    trials = list(trials)
    validate_trials(trials, cfg.repetitions)
    present = {(t.policy, t.condition) for t in trials}
    policies = sorted({p for p, _ in present},
                      key=lambda p: (POLICIES.index(p) if p in POLICIES else len(POLICIES), p))
    out = []
    for policy in policies:
        for condition in CONDITIONS:
            if (policy, condition) not in present:
                continue
            corrupted = condition in CORRUPTED_CONDITIONS
            out.append(ConditionSummary(
                policy=policy, condition=condition, accuracy=accuracy(trials, condition, policy, cfg),
                adoption=adoption_rate(trials, condition, policy, cfg) if corrupted else None,
                override=override_rate(trials, condition, policy, cfg) if corrupted else None,
                tool_call_ratio=tool_call_ratio(trials, condition, policy, cfg) if corrupted else None,
            ))
    return out
