"""Mutual information between SAE latents and a binary behaviour label, per latent, in nats (feature mining,
``steering.mining``, step 3).

Three estimators: ``knn`` (sklearn's ``mutual_info_classif``, Ross 2014, fixed ``random_state``), ``knn-fast``
(a vectorized re-implementation of the same estimator with sklearn's preprocessing) and ``binned`` (plug-in MI
over per-latent quantile bins). ``benchmarks/bench_mining.py`` compares their rankings and speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memtoc.core.errors import MemtocError

ESTIMATORS = ("knn", "knn-fast", "binned")


class MiningError(MemtocError):
    """Feature mining that cannot run as asked (no labels, too few episodes, held-out violation, bad SAE)."""


def _prepare_like_sklearn(z: np.ndarray, random_state: int | None) -> np.ndarray:
    """The exact preprocessing of ``sklearn.feature_selection.mutual_info_classif`` for dense continuous X:
    float64, each column divided by its standard deviation (no centring; zero-variance columns left alone),
    plus noise ``1e-10 * max(1, mean|x|) * N(0, 1)`` drawn from ``check_random_state(random_state)``."""
    from sklearn.preprocessing import scale
    from sklearn.utils import check_random_state

    x = np.array(z, dtype=np.float64, copy=True)
    x = scale(x, with_mean=False, copy=False)
    means = np.maximum(1, np.mean(np.abs(x), axis=0))
    rng = check_random_state(random_state)
    x += 1e-10 * means * rng.standard_normal(size=x.shape)
    return x


def mi_knn_sklearn(z: np.ndarray, y: np.ndarray, *, n_neighbors: int = 3, random_state: int | None = 0,
                   n_jobs: int | None = None) -> np.ndarray:
    """sklearn's kNN estimator (Ross 2014) of I(z_j; y) in nats, per column."""
    from sklearn.feature_selection import mutual_info_classif

    return mutual_info_classif(np.asarray(z), np.asarray(y), discrete_features=False, n_neighbors=n_neighbors,
                               random_state=random_state, n_jobs=n_jobs)


def mi_knn_fast(z: np.ndarray, y: np.ndarray, *, n_neighbors: int = 3, random_state: int | None = 0,
                chunk: int = 1024) -> np.ndarray:
    """``mi_knn_sklearn``'s estimator (same preprocessing, noise and formula), vectorized over features by sorting.

    In one dimension the k nearest same-label neighbours lie among the k left and k right ones, and the k-th
    distance is ``min_t max(L_t, R_{k-t})``; counts within the radius come from ``searchsorted``, corrected to
    the KD-tree's exact comparison (``fl(d^2) <= fl(r^2)``). Agrees with sklearn to rounding.
    """
    import torch
    from scipy.special import digamma

    z = np.asarray(z)
    y = np.asarray(y)
    n_all, n_feat = z.shape
    x_all = _prepare_like_sklearn(z, random_state)
    labels, counts = np.unique(y, return_counts=True)
    count_of = dict(zip(labels.tolist(), counts.tolist()))
    keep = np.array([count_of[v] > 1 for v in y.tolist()], dtype=bool)
    x_all, yk = x_all[keep], y[keep]
    n = int(keep.sum())
    out = np.zeros(n_feat, dtype=np.float64)
    if n == 0:
        return out
    psi = digamma(np.arange(n + 1, dtype=np.float64))          # psi[m] for m >= 1
    k_of = {c: min(n_neighbors, count_of[c] - 1) for c in labels.tolist() if count_of[c] > 1}
    k_i = np.array([k_of[v] for v in yk.tolist()])
    nc_i = np.array([count_of[v] for v in yk.tolist()])
    const = psi[n] + psi[k_i].mean() - psi[nc_i].mean()
    psi_t = torch.from_numpy(psi)
    zero = torch.tensor(0.0, dtype=torch.float64)
    class_rows = {c: torch.from_numpy(np.flatnonzero(yk == c)) for c in k_of}
    for f0 in range(0, n_feat, chunk):
        t = torch.from_numpy(np.ascontiguousarray(x_all[:, f0:f0 + chunk].T))      # [F, n]
        n_f = t.shape[0]
        dk = torch.empty_like(t)
        for c, rows in class_rows.items():
            k = k_of[c]
            sc, order = t[:, rows].sort(dim=1)                                      # [F, n_c]
            n_c = sc.shape[1]
            pad = torch.full((n_f, k), float("inf"), dtype=torch.float64)
            left = torch.cat([pad, sc], 1)     # left[:, p + k - j] = sc[:, p - j]
            right = torch.cat([sc, pad], 1)    # right[:, p + j] = sc[:, p + j]
            lefts = [zero.expand(n_f, n_c)] + [(sc - left[:, k - j:k - j + n_c]).abs() for j in range(1, k + 1)]
            rights = [zero.expand(n_f, n_c)] + [(right[:, j:j + n_c] - sc).abs() for j in range(1, k + 1)]
            # missing neighbours: inf - x = inf, |x - inf| = inf; lefts[0] = rights[0] = 0 leave the other side
            best = torch.stack([torch.maximum(lefts[j], rights[k - j]) for j in range(k + 1)]).amin(0)
            d_sorted = best.nan_to_num(nan=float("inf"))
            d_c = torch.empty_like(d_sorted)
            d_c.scatter_(1, order, d_sorted)
            dk[:, rows] = d_c
        dist = torch.sqrt(dk * dk)                      # what the KD-tree reports: sqrt of the squared distance
        radius = torch.nextafter(dist, zero)
        r2 = radius * radius
        s_all, _ = t.sort(dim=1)
        hi = torch.searchsorted(s_all, t + radius, right=True)
        lo = torch.searchsorted(s_all, t - radius, right=False)

        def inside(pos: Any, s_all: torch.Tensor = s_all, t: torch.Tensor = t, r2: torch.Tensor = r2) -> Any:
            v = torch.gather(s_all, 1, pos.clamp(0, n - 1)) - t
            return (v * v) <= r2

        for _ in range(2):   # exact boundaries under sklearn's comparison (searchsorted is off by at most one)
            hi = hi + ((hi < n) & inside(hi)).long()
            hi = hi - ((hi > 0) & ~inside(hi - 1)).long()
            lo = lo - ((lo > 0) & inside(lo - 1)).long()
            lo = lo + ((lo < n) & ~inside(lo)).long()
        m = (hi - lo).clamp(min=1)
        mi = const - psi_t[m].mean(dim=1)
        out[f0:f0 + n_f] = mi.clamp(min=0).numpy()
    return out


def mi_binned(z: np.ndarray, y: np.ndarray, *, n_bins: int = 8, chunk: int = 2048) -> np.ndarray:
    """Plug-in MI (nats) of a discretised code with the label, with the Miller-Madow bias correction.

    Bins per latent: bin 0 = exactly zero (inactive), the active values split into ``n_bins - 1`` equal-count
    bins by rank. Vectorized over latents; deterministic. Correction: ``(B_occupied - 1)(C - 1) / 2n`` is
    subtracted (the plug-in estimate's first-order bias under independence), then clipped at 0.
    """
    import torch

    z = np.asarray(z, dtype=np.float32)
    y = np.asarray(y)
    n, n_feat = z.shape
    labels, yi = np.unique(y, return_inverse=True)
    n_cls = len(labels)
    out = np.zeros(n_feat, dtype=np.float64)
    if n < 2 or n_cls < 2:
        return out
    yt = torch.from_numpy(yi.astype(np.int64))
    py = torch.bincount(yt, minlength=n_cls).double() / n
    nb = int(n_bins)
    for f0 in range(0, n_feat, chunk):
        t = torch.from_numpy(np.ascontiguousarray(z[:, f0:f0 + chunk].T)).double()      # [F, n]
        n_f = t.shape[0]
        active = t != 0
        n_act = active.sum(1, keepdim=True)                                               # [F, 1]
        key = torch.where(active, t, torch.tensor(-float("inf"), dtype=torch.float64))
        rank = key.argsort(dim=1, stable=True).argsort(dim=1)                             # 0..n-1
        act_rank = rank - (n - n_act)                                                     # 0..n_act-1 if active
        bins = torch.where(active, 1 + (act_rank * (nb - 1)) // n_act.clamp(min=1), torch.zeros_like(rank))
        idx = bins * n_cls + yt.unsqueeze(0)                                              # [F, n]
        joint = torch.zeros(n_f, nb * n_cls, dtype=torch.float64)
        joint.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
        joint = joint.view(n_f, nb, n_cls) / n
        pb = joint.sum(2, keepdim=True)
        ratio = joint / (pb * py.view(1, 1, n_cls))
        terms = torch.where(joint > 0, joint * torch.log(ratio), torch.zeros_like(joint))
        mi = terms.sum((1, 2))
        occupied = (pb.squeeze(2) > 0).sum(1).double()
        mi = mi - (occupied - 1) * (n_cls - 1) / (2 * n)
        out[f0:f0 + n_f] = mi.clamp(min=0).numpy()
    return out


def mutual_information(z: np.ndarray, y: np.ndarray, *, estimator: str = "knn", n_neighbors: int = 3,
                       random_state: int | None = 0, n_bins: int = 8) -> np.ndarray:
    """I(z_j; y) per latent with the chosen estimator (``knn`` = sklearn, ``knn-fast``, ``binned``)."""
    if estimator == "knn":
        return mi_knn_sklearn(z, y, n_neighbors=n_neighbors, random_state=random_state)
    if estimator == "knn-fast":
        return mi_knn_fast(z, y, n_neighbors=n_neighbors, random_state=random_state)
    if estimator == "binned":
        return mi_binned(z, y, n_bins=n_bins)
    raise MiningError(f"unknown MI estimator {estimator!r}; choose {', '.join(ESTIMATORS)}")
