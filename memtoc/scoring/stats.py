"""Statistics of the MemToC release: bootstrap intervals, paired contrasts, Holm, the asymmetric criterion.

Everything here is a pure function of its inputs and a seed. Random draws come from numpy's
``default_rng(seed)``, and every function makes its own generator, so a call never depends on earlier calls.

Conventions (scoring.md section 11):

- Percentile intervals take the sorted bootstrap draws at positions ``int(alpha/2 * B)`` and
  ``min(B - 1, int((1 - alpha/2) * B))``. With B = 1000 and alpha = 0.05 these are 25 and 975. Values are not
  rounded here; rounding is for display only.
- A cluster bootstrap resamples whole clusters (questions) with replacement. Each draw's statistic is the sum
  of the drawn clusters' sums divided by the sum of their sizes. Clusters are put in sorted order of their ids
  before the draws. For the same seed this gives the same draws as the release's paired script
  (``rng.integers(0, C, size=(B, C))``, then ``rng.integers(0, 2, size=(P, C)) * 2 - 1`` for the sign flips).
- Empty input gives NaN results. It never raises.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Hashable, Iterable, Sequence

import numpy as np

from memtoc.core.fileio import json_ready

__all__ = [
    "Interval",
    "PairedResult",
    "CriterionVerdict",
    "ZTestResult",
    "percentile_indices",
    "cluster_arrays",
    "bootstrap_ci",
    "paired_difference",
    "holm",
    "asymmetric_criterion",
    "two_proportion_z",
    "normal_cdf",
    "pooled_cluster_bootstrap_ci",
]

NAN = float("nan")


@dataclass(frozen=True)
class Interval:
    """A two-sided interval. Both ends are NaN when it could not be computed (empty input)."""

    low: float
    high: float

    @property
    def is_nan(self) -> bool:
        return math.isnan(self.low) or math.isnan(self.high)

    @property
    def width(self) -> float:
        return self.high - self.low

    def to_dict(self) -> dict:
        return json_ready({"low": self.low, "high": self.high})


class _Record:
    """A result record: ``to_dict`` is its fields, JSON-ready (NaN becomes None)."""

    def to_dict(self) -> dict:
        return json_ready(asdict(self))


@dataclass(frozen=True)
class PairedResult(_Record):
    """A paired contrast b - a over matched units.

    ``delta`` is the mean of (b - a) over the units. ``ci_low``/``ci_high`` come from a cluster bootstrap.
    ``p_value`` is a two-sided sign-flip permutation p over clusters. Everything is NaN when there are no units.
    """

    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    n_units: int
    n_clusters: int

    @property
    def ci(self) -> Interval:
        return Interval(self.ci_low, self.ci_high)


@dataclass(frozen=True)
class CriterionVerdict(_Record):
    """Result of the asymmetric success criterion (see :func:`asymmetric_criterion`)."""

    success: bool
    retention_rises: bool
    tool_following_falls: bool
    retention_delta: float
    retention_p: float  # the p actually used (Holm-adjusted when one was given)
    tool_following_delta: float
    tool_following_p: float
    alpha: float
    reason: str


@dataclass(frozen=True)
class ZTestResult(_Record):
    """Two-proportion z test with pooled variance: z = (p1 - p2) / SE, two-sided p."""

    z: float
    p_value: float
    p1: float
    p2: float


# ---------------------------------------------------------------------------------------------------------
# helpers

def percentile_indices(n_draws: int, alpha: float = 0.05) -> tuple[int, int]:
    """Positions of the lower and upper percentile in ``n_draws`` sorted draws (release convention)."""
    if n_draws <= 0:
        raise ValueError("n_draws must be positive")
    lo = int(alpha / 2 * n_draws)
    hi = min(n_draws - 1, int((1 - alpha / 2) * n_draws))
    return lo, hi


def _percentile_interval(draws: np.ndarray, alpha: float) -> Interval:
    draws = np.asarray(draws, dtype=float)
    draws = np.sort(draws[np.isfinite(draws)])
    if draws.size == 0:
        return Interval(NAN, NAN)
    lo, hi = percentile_indices(draws.size, alpha)
    return Interval(float(draws[lo]), float(draws[hi]))


def _sorted_keys(keys: Iterable[Hashable]) -> list:
    keys = list(keys)
    try:
        return sorted(keys)
    except TypeError:  # mixed, unorderable ids
        return sorted(keys, key=lambda k: (type(k).__name__, repr(k)))


def cluster_arrays(values: Sequence[float], clusters: Sequence[Hashable]) -> tuple[list, np.ndarray, np.ndarray]:
    """Group ``values`` by ``clusters``.

    Returns (cluster ids in sorted order, the sum of each cluster's values, the size of each cluster).
    """
    if len(values) != len(clusters):
        raise ValueError(f"values ({len(values)}) and clusters ({len(clusters)}) differ in length")
    sums: dict = {}
    sizes: dict = {}
    for v, c in zip(values, clusters):
        sums[c] = sums.get(c, 0.0) + float(v)
        sizes[c] = sizes.get(c, 0) + 1
    keys = _sorted_keys(sums)
    return (keys, np.array([sums[k] for k in keys], dtype=float),
            np.array([sizes[k] for k in keys], dtype=float))


def _as_float_array(values: Iterable[Any]) -> np.ndarray:
    return np.asarray([float(v) for v in values], dtype=float)


# ---------------------------------------------------------------------------------------------------------
# single-arm interval

def bootstrap_ci(values: Iterable[Any], clusters: Sequence[Hashable] | None = None, *, n_boot: int = 1000,
                 alpha: float = 0.05, seed: int = 0) -> Interval:
    """Percentile bootstrap interval of the mean of ``values`` (0/1 or real); NaN on empty input.

    Without ``clusters`` each value is its own cluster, in input order; with them (one id per value, e.g. the
    question id) whole clusters are resampled (module docstring).
    """
    vals = _as_float_array(values)
    if vals.size == 0:
        return Interval(NAN, NAN)
    if n_boot <= 0:
        raise ValueError("n_boot must be positive")
    if clusters is None:
        sums, sizes = vals, np.ones_like(vals)
    else:
        _, sums, sizes = cluster_arrays(vals, list(clusters))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, sums.size, size=(n_boot, sums.size))
    draws = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    return _percentile_interval(draws, alpha)


# ---------------------------------------------------------------------------------------------------------
# paired contrast

def paired_difference(values_a: Sequence[Any], values_b: Sequence[Any], clusters: Sequence[Hashable], *,
                      n_boot: int = 1000, n_perm: int = 10000, alpha: float = 0.05,
                      seed: int = 0) -> PairedResult:
    """Paired contrast of arm b against arm a on their common support.

    ``values_a[i]``, ``values_b[i]`` and ``clusters[i]`` describe the same unit (e.g. one question x formulation,
    clustered by question); the caller aligns them. delta = mean(b - a), a cluster percentile bootstrap interval
    and a two-sided sign-flip permutation p over clusters, p = (#{|perm| >= |delta| - 1e-12} + 1) / (n_perm + 1);
    one ``default_rng(seed)`` gives the bootstrap draws first, then the signs (scoring.md section 11).
    """
    a = _as_float_array(values_a)
    b = _as_float_array(values_b)
    cl = list(clusters)
    if not (a.size == b.size == len(cl)):
        raise ValueError(f"values_a ({a.size}), values_b ({b.size}) and clusters ({len(cl)}) differ in length")
    if a.size == 0:
        return PairedResult(NAN, NAN, NAN, NAN, 0, 0)
    if n_boot <= 0 or n_perm <= 0:
        raise ValueError("n_boot and n_perm must be positive")
    _, csum, cnt = cluster_arrays(b - a, cl)
    n_units = int(cnt.sum())
    n_clusters = int(csum.size)
    delta = float(csum.sum()) / n_units

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    boots = csum[idx].sum(axis=1) / cnt[idx].sum(axis=1)
    ci = _percentile_interval(boots, alpha)

    signs = rng.integers(0, 2, size=(n_perm, n_clusters)) * 2 - 1
    perm = (signs @ csum) / n_units
    p = (int((np.abs(perm) >= abs(delta) - 1e-12).sum()) + 1) / (n_perm + 1)
    return PairedResult(delta=delta, ci_low=ci.low, ci_high=ci.high, p_value=float(p),
                        n_units=n_units, n_clusters=n_clusters)


# ---------------------------------------------------------------------------------------------------------
# multiplicity

def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order; a NaN p-value (an empty contrast) stays NaN and is
    not counted among the m."""
    ps = [float(p) for p in p_values]
    finite = [(p, i) for i, p in enumerate(ps) if not math.isnan(p)]
    out = [NAN] * len(ps)
    m = len(finite)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(finite)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


# ---------------------------------------------------------------------------------------------------------
# success criterion

def _pct(x: float) -> str:
    return "nan" if math.isnan(x) else f"{100 * x:+.1f} pp"


def asymmetric_criterion(retention: PairedResult, tool_following: PairedResult, alpha: float = 0.05, *,
                         retention_p_adjusted: float | None = None) -> CriterionVerdict:
    """The asymmetric success criterion of an intervention (arm b) against its baseline (arm a).

    It succeeds iff retention rises significantly (delta > 0 and p < alpha, the Holm-adjusted p when
    ``retention_p_adjusted`` is given) and correct-tool following does not fall significantly (delta < 0 and
    p < alpha on the raw p: adjusting it would make a fall harder to detect, so the criterion easier to pass).
    A NaN p or delta (no units) is "not significant": an empty retention contrast fails, an empty tool-following
    contrast does not block success; the reason string says which case applied.
    """
    p_ret = retention.p_value if retention_p_adjusted is None else float(retention_p_adjusted)
    d_ret = retention.delta
    rises = (not math.isnan(d_ret)) and (not math.isnan(p_ret)) and d_ret > 0 and p_ret < alpha
    d_tool, p_tool = tool_following.delta, tool_following.p_value
    falls = (not math.isnan(d_tool)) and (not math.isnan(p_tool)) and d_tool < 0 and p_tool < alpha
    success = rises and not falls

    p_name = "Holm-adjusted p" if retention_p_adjusted is not None else "p"
    if retention.n_units == 0:
        ret_txt = "retention has no paired units"
    elif rises:
        ret_txt = f"retention rises significantly ({_pct(d_ret)}, {p_name}={p_ret:.4g} < {alpha})"
    elif d_ret > 0:
        ret_txt = f"retention rises but not significantly ({_pct(d_ret)}, {p_name}={p_ret:.4g} >= {alpha})"
    else:
        ret_txt = f"retention does not rise ({_pct(d_ret)}, {p_name}={p_ret:.4g})"
    if tool_following.n_units == 0:
        tool_txt = "correct-tool following has no paired units (not checked)"
    elif falls:
        tool_txt = f"correct-tool following falls significantly ({_pct(d_tool)}, p={p_tool:.4g} < {alpha})"
    else:
        tool_txt = f"correct-tool following shows no significant fall ({_pct(d_tool)}, p={p_tool:.4g})"
    reason = ("SUCCESS: " if success else "FAIL: ") + ret_txt + "; " + tool_txt
    return CriterionVerdict(success=success, retention_rises=rises, tool_following_falls=falls,
                            retention_delta=d_ret, retention_p=p_ret, tool_following_delta=d_tool,
                            tool_following_p=p_tool, alpha=alpha, reason=reason)


# ---------------------------------------------------------------------------------------------------------
# cross-model test

def normal_cdf(x: float) -> float:
    """Standard normal CDF via ``math.erf``."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> ZTestResult:
    """Two-sided two-proportion z test with pooled variance (scoring.md section 11).

    Uses p = (k1 + k2) / (n1 + n2), SE = sqrt(p (1 - p) (1/n1 + 1/n2)), z = (k1/n1 - k2/n2) / SE and
    p_value = 2 (1 - Phi(|z|)). If SE is 0, z = 0 and p_value = 1. If n1 or n2 is 0, everything except the
    defined proportion is NaN.
    """
    for k, n in ((k1, n1), (k2, n2)):
        if n < 0 or k < 0 or k > n:
            raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p1 = k1 / n1 if n1 else NAN
    p2 = k2 / n2 if n2 else NAN
    if n1 == 0 or n2 == 0:
        return ZTestResult(NAN, NAN, p1, p2)
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return ZTestResult(0.0, 1.0, p1, p2)
    z = (p1 - p2) / se
    p = 2 * (1 - normal_cdf(abs(z)))
    return ZTestResult(z, min(1.0, max(0.0, p)), p1, p2)


# ---------------------------------------------------------------------------------------------------------
# pooled interval across formulations

def pooled_cluster_bootstrap_ci(groups: Sequence[tuple[Sequence[Any], Sequence[Hashable]]], *,
                                n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> Interval:
    """Bootstrap interval of the UNWEIGHTED mean of several groups' rates, resampling clusters jointly.

    ``groups``: (values, clusters) pairs, one per formulation (empty ones ignored). Each draw takes the union of
    the groups' cluster ids (sorted) with replacement, applies it to every group, and averages the groups' rates;
    a group with no units in a draw is left out of its mean, a draw with none at all is dropped. With a single
    group this is ``bootstrap_ci(values, clusters)`` for the same seed.
    """
    groups = [(list(v), list(c)) for v, c in groups if len(v) > 0]
    if not groups:
        return Interval(NAN, NAN)
    if n_boot <= 0:
        raise ValueError("n_boot must be positive")
    per_group = [cluster_arrays(_as_float_array(v), c) for v, c in groups]
    universe = _sorted_keys({k for keys, _, _ in per_group for k in keys})
    pos = {k: i for i, k in enumerate(universe)}
    S = np.zeros((len(groups), len(universe)))
    N = np.zeros((len(groups), len(universe)))
    for g, (keys, sums, sizes) in enumerate(per_group):
        cols = [pos[k] for k in keys]
        S[g, cols] = sums
        N[g, cols] = sizes
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(universe), size=(n_boot, len(universe)))
    num = S[:, idx].sum(axis=2)  # (groups, n_boot)
    den = N[:, idx].sum(axis=2)
    ok = den > 0
    rates = np.where(ok, num / np.where(ok, den, 1.0), 0.0)
    n_ok = ok.sum(axis=0)
    draws = np.where(n_ok > 0, rates.sum(axis=0) / np.maximum(n_ok, 1), NAN)
    return _percentile_interval(draws, alpha)
