"""Two-stage prevalence of conflict acknowledgment (paper App. D, "CAR detector details").

Stage 1 screens every tool_wrong answer with a detector (flag rate f); stage 2 labels a human sample within
each flag stratum: precision p = P(yes | flagged), miss rate m = P(yes | not flagged). The paper's estimate,
prevalence = f * p + (1 - f) * m, holds whatever the sampling share per stratum; recall is f * p / prevalence.

The paper gives no interval. Ours (docs/judge.md): a Monte Carlo interval over independent Jeffreys posteriors
Beta(k + 1/2, n - k + 1/2) for f, p and m (``n_draws`` draws, ``default_rng(seed)``). Jeffreys rather than a
bootstrap because the positive class is rare: a stratum with 0 positives collapses a bootstrap interval to a
point, while the Jeffreys interval keeps an honest upper tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memtoc.core.errors import MemtocError


@dataclass(frozen=True)
class StratumCounts:
    """k positives among n."""

    k: int
    n: int

    def __post_init__(self) -> None:
        if self.n < 0 or self.k < 0 or self.k > self.n:
            raise MemtocError(f"invalid counts k={self.k} of n={self.n}")

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else float("nan")


@dataclass(frozen=True)
class PrevalenceEstimate:
    prevalence: float
    ci_low: float
    ci_high: float
    flag_rate: float
    precision: float
    miss_rate: float
    recall: float
    n_screened: int
    n_validated_flagged: int
    n_validated_unflagged: int

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in self.__dict__.items()}


def two_stage_prevalence(screen: StratumCounts, val_flagged: StratumCounts, val_unflagged: StratumCounts, *,
                         alpha: float = 0.05, n_draws: int = 4000, seed: int = 0) -> PrevalenceEstimate:
    """Prevalence from detector screening (``screen``: flagged of screened) and a flag-stratified labelled sample.

    ``val_flagged``: human positives among validated flagged answers; ``val_unflagged``: among validated
    unflagged ones. An empty validation stratum whose screen stratum is not empty is refused: the estimate would
    rest on nothing there.
    """
    if screen.n == 0:
        raise MemtocError("two-stage prevalence: no screened answers")
    f = screen.rate
    if (screen.k > 0 and val_flagged.n == 0) or (screen.k < screen.n and val_unflagged.n == 0):
        raise MemtocError("two-stage prevalence: a detector stratum has screened answers but no labelled ones "
                          f"(flagged {val_flagged.n}, unflagged {val_unflagged.n} labelled)")
    p = val_flagged.rate if val_flagged.n else 0.0
    m = val_unflagged.rate if val_unflagged.n else 0.0
    prev = f * p + (1 - f) * m
    rng = np.random.default_rng(seed)

    def draw(c: StratumCounts) -> np.ndarray:
        if c.n == 0:
            return np.zeros(n_draws)
        return rng.beta(c.k + 0.5, c.n - c.k + 0.5, n_draws)

    fd, pd, md = draw(screen), draw(val_flagged), draw(val_unflagged)
    sims = fd * pd + (1 - fd) * md
    lo, hi = np.quantile(sims, [alpha / 2, 1 - alpha / 2])
    # an empty validation stratum has weight 0 in the estimate; its rate is reported as unknown (None)
    return PrevalenceEstimate(prevalence=prev, ci_low=float(lo), ci_high=float(hi), flag_rate=f,
                              precision=val_flagged.rate, miss_rate=val_unflagged.rate,
                              recall=f * p / prev if prev > 0 else float("nan"),
                              n_screened=screen.n, n_validated_flagged=val_flagged.n,
                              n_validated_unflagged=val_unflagged.n)

