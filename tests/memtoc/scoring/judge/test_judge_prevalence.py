"""The two-stage prevalence estimator: formula, refusal of empty strata, interval coverage by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from memtoc.core.errors import MemtocError
from memtoc.scoring.judge.prevalence import PrevalenceEstimate, StratumCounts, two_stage_prevalence


def test_point_estimate_is_flag_rate_times_precision_plus_unflagged_times_miss_rate():
    est = two_stage_prevalence(StratumCounts(200, 1000), StratumCounts(20, 40), StratumCounts(1, 50))
    f, p, m = 0.2, 0.5, 0.02
    assert est.prevalence == pytest.approx(f * p + (1 - f) * m)
    assert est.recall == pytest.approx(f * p / (f * p + (1 - f) * m))
    assert est.ci_low < est.prevalence < est.ci_high


def test_zero_positives_still_give_an_upper_tail():
    est = two_stage_prevalence(StratumCounts(10, 500), StratumCounts(0, 10), StratumCounts(0, 60))
    assert est.prevalence == 0.0 and est.ci_low >= 0.0 and est.ci_high > 0.0


def test_an_unlabelled_stratum_is_refused():
    with pytest.raises(MemtocError, match="no labelled"):
        two_stage_prevalence(StratumCounts(10, 500), StratumCounts(0, 0), StratumCounts(0, 60))
    with pytest.raises(MemtocError):
        StratumCounts(5, 3)


def simulate_coverage(*, prevalence: float, recall: float, precision: float, n_screened: int, n_val_flagged: int,
                      n_val_unflagged: int, n_sims: int = 200, seed: int = 0, alpha: float = 0.05,
                      n_draws: int = 2000) -> tuple[float, list[PrevalenceEstimate]]:
    """Share of simulated studies whose interval covers the true prevalence.

    The truth fixes the flag rate f = prevalence * recall / precision and the miss rate
    m = prevalence * (1 - recall) / (1 - f). Each study screens ``n_screened`` answers (flag ~ Binomial) and labels
    ``n_val_flagged`` flagged and ``n_val_unflagged`` unflagged answers (positives ~ Binomial(p) and Binomial(m)).
    """
    f = prevalence * recall / precision
    if not 0 < f < 1:
        raise MemtocError(f"inconsistent truth: flag rate {f:.3f} from prevalence, recall and precision")
    m = prevalence * (1 - recall) / (1 - f)
    rng = np.random.default_rng(seed)
    estimates = []
    hits = 0
    for i in range(n_sims):
        k_flag = int(rng.binomial(n_screened, f))
        vf = min(n_val_flagged, k_flag)
        vu = min(n_val_unflagged, n_screened - k_flag)
        est = two_stage_prevalence(StratumCounts(k_flag, n_screened),
                                   StratumCounts(int(rng.binomial(vf, precision)), vf),
                                   StratumCounts(int(rng.binomial(vu, m)), vu),
                                   alpha=alpha, n_draws=n_draws, seed=seed + 1 + i)
        estimates.append(est)
        hits += est.ci_low <= prevalence <= est.ci_high
    return hits / n_sims, estimates


@pytest.mark.parametrize("truth", [
    dict(prevalence=0.08, recall=0.73, precision=0.38),   # the paper's detector on a rare class
    dict(prevalence=0.25, recall=0.6, precision=0.8),
])
def test_interval_covers_the_truth_in_most_simulated_studies(truth):
    coverage, ests = simulate_coverage(**truth, n_screened=2000, n_val_flagged=60, n_val_unflagged=60,
                                       n_sims=200, seed=1)
    print(f"coverage of the 95% interval over 200 simulated studies {truth}: {coverage:.3f}")
    assert coverage >= 0.90
    # and the point estimate is centred on the truth
    assert np.mean([e.prevalence for e in ests]) == pytest.approx(truth["prevalence"], abs=0.01)
    # the recall and precision the truth implies are recovered on average
    assert np.mean([e.precision for e in ests]) == pytest.approx(truth["precision"], abs=0.03)
