"""Statistics of the MemToC release, checked against independent (hand or exact) computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from memtoc.scoring.stats import (
    Interval,
    PairedResult,
    asymmetric_criterion,
    bootstrap_ci,
    holm,
    normal_cdf,
    paired_difference,
    percentile_indices,
    pooled_cluster_bootstrap_ci,
    two_proportion_z,
)


def _bernoulli(k: int, n: int, seed: int = 7) -> list[int]:
    """Exactly k ones among n values, in a shuffled order."""
    vals = np.array([1] * k + [0] * (n - k))
    np.random.default_rng(seed).shuffle(vals)
    return vals.tolist()


# ------------------------------------------------------------------------------------------ bootstrap_ci

def test_percentile_indices_release_convention():
    assert percentile_indices(1000, 0.05) == (25, 975)
    assert percentile_indices(200, 0.05) == (5, 195)
    assert percentile_indices(10, 0.0) == (0, 9)


def test_bootstrap_known_proportion_covers_and_has_normal_width():
    p, n = 0.3, 300
    vals = _bernoulli(90, n)
    ci = bootstrap_ci(vals, n_boot=2000, seed=0)
    assert ci.low < p < ci.high
    expected_width = 2 * 1.96 * math.sqrt(p * (1 - p) / n)  # 0.1037
    assert ci.width == pytest.approx(expected_width, rel=0.12)
    # roughly symmetric around the point estimate
    assert (p - ci.low) == pytest.approx(ci.high - p, abs=0.02)


def test_bootstrap_accepts_booleans():
    vals = [True, False, True, True]
    assert bootstrap_ci(vals, n_boot=100, seed=3) == bootstrap_ci([1, 0, 1, 1], n_boot=100, seed=3)


def test_cluster_bootstrap_with_singleton_clusters_equals_plain():
    vals = _bernoulli(90, 300)
    plain = bootstrap_ci(vals, n_boot=500, seed=11)
    clustered = bootstrap_ci(vals, list(range(300)), n_boot=500, seed=11)
    assert clustered == plain


def test_cluster_bootstrap_of_duplicated_values_equals_plain_bootstrap_of_clusters():
    # 100 clusters of two identical values: ratio statistic = mean of the drawn clusters' values
    base = _bernoulli(40, 100, seed=3)
    vals = [v for v in base for _ in range(2)]
    clusters = [f"q{i:03d}" for i in range(100) for _ in range(2)]
    assert bootstrap_ci(vals, clusters, n_boot=400, seed=5) == bootstrap_ci(base, n_boot=400, seed=5)


def test_cluster_bootstrap_is_wider_for_correlated_clusters():
    # 60 clusters of 5 identical values: the effective sample size is 60, not 300
    base = _bernoulli(18, 60, seed=2)
    vals = [v for v in base for _ in range(5)]
    clusters = [i for i in range(60) for _ in range(5)]
    plain = bootstrap_ci(vals, n_boot=2000, seed=0)
    clustered = bootstrap_ci(vals, clusters, n_boot=2000, seed=0)
    assert clustered.width == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 60), rel=0.15)
    assert 1.8 < clustered.width / plain.width < 2.7  # sqrt(5) = 2.24


def test_bootstrap_seeded_reproducibility():
    vals = _bernoulli(30, 100)
    a = bootstrap_ci(vals, n_boot=300, seed=42)
    b = bootstrap_ci(vals, n_boot=300, seed=42)
    c = bootstrap_ci(vals, n_boot=300, seed=43)
    assert a == b
    assert a != c


def test_bootstrap_empty_and_constant():
    empty = bootstrap_ci([], n_boot=100)
    assert math.isnan(empty.low) and math.isnan(empty.high) and empty.is_nan
    assert bootstrap_ci([1, 1, 1], n_boot=100) == Interval(1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_ci([1, 0], ["a"])


def test_pooled_bootstrap_single_group_equals_cluster_bootstrap():
    vals = _bernoulli(12, 40)
    qs = [f"q{i // 2}" for i in range(40)]
    assert pooled_cluster_bootstrap_ci([(vals, qs)], n_boot=300, seed=1) == bootstrap_ci(vals, qs, n_boot=300,
                                                                                          seed=1)


def test_pooled_bootstrap_resamples_questions_jointly():
    # three groups with the SAME value per question: every joint draw gives three equal rates, so the
    # pooled interval equals the single-group one. Independent resampling would be ~sqrt(3) narrower.
    vals = _bernoulli(30, 100)
    qs = list(range(100))
    single = bootstrap_ci(vals, qs, n_boot=1000, seed=0)
    pooled = pooled_cluster_bootstrap_ci([(vals, qs)] * 3, n_boot=1000, seed=0)
    assert (pooled.low, pooled.high) == pytest.approx((single.low, single.high), abs=1e-12)
    assert pooled_cluster_bootstrap_ci([([], []), ([], [])]).is_nan


# ------------------------------------------------------------------------------------------ paired

def test_paired_delta_is_mean_of_b_minus_a():
    res = paired_difference([0, 0, 1, 1], [1, 1, 1, 0], ["q1", "q2", "q3", "q4"], n_boot=100, n_perm=100)
    assert res.delta == pytest.approx(0.25)  # (1 + 1 + 0 - 1) / 4
    assert (res.n_units, res.n_clusters) == (4, 4)
    assert res.ci_low <= res.delta <= res.ci_high


def test_paired_zero_effect_symmetric_data_gives_p_one():
    # per-cluster differences +1 and -1 in equal numbers: delta = 0, every permutation has |stat| >= 0
    a = [0, 1] * 20
    b = [1, 0] * 20
    res = paired_difference(a, b, list(range(40)), n_boot=200, n_perm=2000, seed=0)
    assert res.delta == 0.0
    assert res.p_value == pytest.approx(1.0)
    assert res.ci_low < 0 < res.ci_high


def test_paired_strong_shift_gives_minimal_p():
    n_perm = 2000
    res = paired_difference([0] * 40, [1] * 40, list(range(40)), n_boot=200, n_perm=n_perm, seed=0)
    assert res.delta == 1.0
    assert (res.ci_low, res.ci_high) == (1.0, 1.0)
    # |perm| >= 1 only when all 40 signs agree (probability 2^-39): p = 1 / (n_perm + 1)
    assert res.p_value == pytest.approx(1 / (n_perm + 1))


def test_paired_sign_flip_p_matches_exact_enumeration():
    # 6 clusters with unequal sizes; exact two-sided sign-flip p over all 2^6 sign vectors
    diffs = {"c1": [1, 1], "c2": [1], "c3": [1, 0, 1], "c4": [-1], "c5": [1], "c6": [0, 1]}
    a, b, cl = [], [], []
    for c, ds in diffs.items():
        for d in ds:
            a.append(0 if d >= 0 else 1)
            b.append(1 if d == 1 else 0)
            cl.append(c)
    sums = np.array([sum(ds) for ds in diffs.values()], dtype=float)
    n_units = sum(len(ds) for ds in diffs.values())
    delta = sums.sum() / n_units
    exact = np.mean([abs(np.dot(s, sums)) / n_units >= abs(delta) - 1e-12
                     for s in itertools.product([-1, 1], repeat=6)])
    res = paired_difference(a, b, cl, n_boot=200, n_perm=10000, seed=0)
    assert res.delta == pytest.approx(delta)
    assert (res.n_units, res.n_clusters) == (n_units, 6)
    assert res.p_value == pytest.approx(exact, abs=0.015)


def test_paired_draw_order_bootstrap_then_permutation_from_one_generator():
    # the release stream: clusters in sorted order, bootstrap indices drawn first, then the sign flips
    a = [0, 1, 0, 0, 1, 0, 0, 1]
    b = [1, 1, 0, 1, 1, 1, 0, 0]
    cl = ["q2", "q1", "q3", "q1", "q4", "q2", "q5", "q3"]
    res = paired_difference(a, b, cl, n_boot=300, n_perm=500, seed=9)
    keys = sorted(set(cl))
    csum = np.array([sum(bb - aa for aa, bb, c in zip(a, b, cl) if c == k) for k in keys], dtype=float)
    cnt = np.array([cl.count(k) for k in keys], dtype=float)
    rng = np.random.default_rng(9)
    idx = rng.integers(0, len(keys), size=(300, len(keys)))
    boots = np.sort(csum[idx].sum(axis=1) / cnt[idx].sum(axis=1))
    signs = rng.integers(0, 2, size=(500, len(keys))) * 2 - 1
    perm = signs @ csum / len(a)
    delta = csum.sum() / len(a)
    assert (res.ci_low, res.ci_high) == (boots[int(0.025 * 300)], boots[int(0.975 * 300)])
    assert res.p_value == ((np.abs(perm) >= abs(delta) - 1e-12).sum() + 1) / 501


def test_paired_reproducible_empty_and_mismatch():
    a, b, cl = [0, 1, 0, 1, 1], [1, 1, 1, 0, 1], [1, 2, 3, 4, 5]
    assert paired_difference(a, b, cl, n_boot=100, n_perm=100, seed=3) == \
        paired_difference(a, b, cl, n_boot=100, n_perm=100, seed=3)
    empty = paired_difference([], [], [])
    assert (empty.n_units, empty.n_clusters) == (0, 0)
    assert math.isnan(empty.delta) and math.isnan(empty.p_value) and math.isnan(empty.ci_low)
    assert empty.to_dict()["delta"] is None
    with pytest.raises(ValueError):
        paired_difference([0, 1], [1], [1, 2])


# ------------------------------------------------------------------------------------------ holm

def test_holm_hand_worked_family():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_holm_caps_at_one_and_handles_edge_cases():
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    assert holm([0.02]) == pytest.approx([0.02])
    out = holm([0.01, float("nan"), 0.04])  # NaN stays NaN and is not counted in m
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)


# ------------------------------------------------------------------------------------------ z test

def test_two_proportion_z_hand_calculation():
    # 30/100 vs 20/100: pooled p = 0.25, SE = sqrt(0.25 * 0.75 * 0.02) = 0.0612372
    res = two_proportion_z(30, 100, 20, 100)
    z = 0.1 / math.sqrt(0.25 * 0.75 * (2 / 100))
    assert res.z == pytest.approx(1.6329932, rel=1e-6)
    assert res.z == pytest.approx(z)
    assert res.p_value == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-9)
    assert res.p_value == pytest.approx(0.10247, abs=1e-4)
    assert (res.p1, res.p2) == (0.3, 0.2)
    assert two_proportion_z(20, 100, 30, 100).z == pytest.approx(-z)


def test_two_proportion_z_degenerate():
    res = two_proportion_z(0, 50, 0, 40)
    assert (res.z, res.p_value) == (0.0, 1.0)
    assert math.isnan(two_proportion_z(0, 0, 3, 10).p_value)
    with pytest.raises(ValueError):
        two_proportion_z(5, 4, 1, 2)
    assert normal_cdf(0.0) == 0.5
    assert normal_cdf(1.959963985) == pytest.approx(0.975, abs=1e-9)


# ------------------------------------------------------------------------------------------ criterion

def _pr(delta: float, p: float, n: int = 100) -> PairedResult:
    return PairedResult(delta, delta - 0.05, delta + 0.05, p, n, n)


@pytest.mark.parametrize("ret, tool, expected", [
    ((+0.10, 0.01), (-0.05, 0.50), True),    # retention up, tool-following fall not significant
    ((+0.10, 0.01), (+0.00, 1.00), True),
    ((+0.10, 0.01), (+0.05, 0.01), True),    # tool following rising significantly is fine
    ((+0.10, 0.01), (-0.05, 0.01), False),   # significant fall of correct-tool following
    ((+0.10, 0.20), (+0.00, 1.00), False),   # retention up but not significant
    ((-0.10, 0.01), (+0.00, 1.00), False),   # retention falls significantly
    ((+0.00, 1.00), (+0.00, 1.00), False),
    ((+0.10, 0.05), (+0.00, 1.00), False),   # p == alpha is not significant
])
def test_asymmetric_criterion_truth_table(ret, tool, expected):
    v = asymmetric_criterion(_pr(*ret), _pr(*tool), 0.05)
    assert v.success is expected
    assert v.reason.startswith("SUCCESS" if expected else "FAIL")


def test_asymmetric_criterion_uses_adjusted_retention_p():
    ret, tool = _pr(0.1, 0.01), _pr(0.0, 1.0)
    assert asymmetric_criterion(ret, tool).success
    v = asymmetric_criterion(ret, tool, retention_p_adjusted=0.08)
    assert not v.success and v.retention_p == 0.08 and "Holm" in v.reason
    assert not v.retention_rises and not v.tool_following_falls


def test_asymmetric_criterion_empty_contrasts():
    empty = PairedResult(float("nan"), float("nan"), float("nan"), float("nan"), 0, 0)
    assert not asymmetric_criterion(empty, _pr(0.0, 1.0)).success
    v = asymmetric_criterion(_pr(0.1, 0.01), empty)
    assert v.success and "not checked" in v.reason
