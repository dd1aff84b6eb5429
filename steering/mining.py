"""SpARE-style feature mining: which SAE latents separate "kept memory" from "followed the tool".

Pipeline (``docs/sae_mining.md``; methods.md section 1, steps D-H):

1. Episodes: ``tool_wrong`` episodes of the questions in the fit fold, labelled by the run's ``outcome``
   (``kept_memory`` = label 1, ``followed_tool`` = label 0; ``both`` / ``neither`` are dropped). The labels come
   from the store's joined columns (``memtoc extract --run``) or from the run's records, joined by episode_id.
   The mining questions must not meet the evaluation questions (the other folds by default): checked, refused.
2. Codes: ``z = sae.encode(h)`` at the chosen position kind (one row per episode for ``last_input``; kinds with
   several rows per episode are averaged per episode).
3. Ranking: mutual information between each latent and the label (sklearn ``mutual_info_classif``, kNN
   estimator, fixed ``random_state``; or the vectorized re-implementation ``knn-fast``, or ``binned``).
4. Cross-check: frequency separation ``|P(z>0 | kept) - P(z>0 | followed)|``; top-20 agreement with the MI
   ranking (overlap and Jaccard) per layer.
5. Selection: K = the smallest count whose cumulative MI (latents sorted by MI) exceeds ``budget`` x total MI;
   walking the MI order, a latent goes to the memory side if ``E = mean(z | kept) - mean(z | followed) > 0``,
   to the tool side if ``E < 0`` (skipped if 0), until K latents are assigned.
6. Targets ("functional activations"): a memory-side latent's target is its mean code over the kept-memory
   episodes; a tool-side latent's, its mean code over the followed-tool episodes (unweighted means).
7. Output: a ``sae_clamp`` edit spec (steer toward memory: remove the tool-side latents, add the memory-side
   latents; toward tool: the reverse), a feature table (CSV + Markdown, with each latent's top-activating tokens
   from the store's ``all`` rows) and ``mining.json`` (provenance, counts, agreement, FVU).
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from memtoc.errors import MemtocError

EDIT_SCHEMA = "memtoc-edit-v1"
MINING_SCHEMA = "memtoc-mining-v1"
ESTIMATORS = ("knn", "knn-fast", "binned")
BEHAVIOURS = {"kept_memory": 1, "followed_tool": 0}
EDIT_POSITIONS = ("last_input", "tool_span", "from_tool_return")


class MiningError(MemtocError):
    """Feature mining that cannot run as asked (no labels, too few episodes, held-out violation, bad SAE)."""


# == mutual information ====================================================================================

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
    """The same estimator as ``mi_knn_sklearn`` (same preprocessing, same noise draws, same formula), vectorized
    over features with sorting instead of per-feature KD-trees.

    In one dimension the k nearest same-label neighbours of a point are among the k left and k right neighbours
    in sorted order; the k-th smallest distance of the two sorted distance lists is
    ``min_t max(L_t, R_{k-t})``. Neighbour counts within the radius come from ``searchsorted`` on the sorted
    column, corrected to the exact comparison sklearn's KD-tree makes (``fl(d^2) <= fl(r^2)``,
    ``r = nextafter(d_k, 0)``). Results agree with sklearn to floating-point rounding (see the tests).
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
            # missing neighbours: inf - x = inf, |x - inf| = inf
            best = None
            for s in range(k + 1):
                lo, hi = lefts[s], rights[k - s]
                if s == 0:
                    cand = hi
                elif s == k:
                    cand = lo
                else:
                    cand = torch.maximum(lo, hi)
                best = cand if best is None else torch.minimum(best, cand)
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

        def inside(pos: Any) -> Any:
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


# == statistics, rankings, selection =======================================================================

def expectation_difference(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``E_j = mean(z_j | y=1) - mean(z_j | y=0)`` (y=1: kept memory). Positive = memory side."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y)
    return z[y == 1].mean(0) - z[y == 0].mean(0)


def frequency_separation(z: np.ndarray, y: np.ndarray, *, tau: float = 0.0) -> dict[str, np.ndarray]:
    """Active-frequency statistics: ``f1 = P(z > tau | y=1)``, ``f0 = P(z > tau | y=0)``, ``delta = f1 - f0``
    and ``score = |delta|`` (the cross-check ranking key)."""
    z = np.asarray(z)
    y = np.asarray(y)
    f1 = (z[y == 1] > tau).mean(0)
    f0 = (z[y == 0] > tau).mean(0)
    return {"f1": f1, "f0": f0, "delta": f1 - f0, "score": np.abs(f1 - f0)}


def rank_order(primary: np.ndarray, secondary: np.ndarray | None = None) -> np.ndarray:
    """Feature ids by ``primary`` descending, ties by ``secondary`` descending, then by id (deterministic)."""
    primary = np.asarray(primary, dtype=np.float64)
    ids = np.arange(len(primary))
    keys = [ids, -np.asarray(secondary, dtype=np.float64)] if secondary is not None else [ids]
    return np.lexsort(keys + [-primary])


def frequency_order(z: np.ndarray, y: np.ndarray, *, tau: float = 0.0) -> np.ndarray:
    """The cross-check ranking: frequency separation, ties broken by the standardized mean difference
    ``|E_j| / pooled std`` (small samples make the frequency score coarse)."""
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y)
    score = frequency_separation(z, y, tau=tau)["score"]
    e = np.abs(expectation_difference(z, y))
    sd = np.sqrt(0.5 * (z[y == 1].var(0) + z[y == 0].var(0)))
    std_diff = np.divide(e, sd, out=np.zeros_like(e), where=sd > 0)
    return rank_order(score, std_diff)


def topk_agreement(order_a: Sequence[int], order_b: Sequence[int], k: int = 20) -> dict[str, Any]:
    a, b = set(int(i) for i in list(order_a)[:k]), set(int(i) for i in list(order_b)[:k])
    union = a | b
    return {"k": int(k), "overlap": len(a & b), "jaccard": (len(a & b) / len(union)) if union else 1.0}


def budget_count(mi: np.ndarray, budget: float) -> int:
    """K: the smallest count of latents (sorted by MI, descending) whose cumulative MI exceeds
    ``budget * total MI``; 0 when the total is 0; all positive-MI latents if the budget is never exceeded."""
    if not 0 < budget <= 1:
        raise MiningError(f"--budget must be in (0, 1], got {budget}")
    mi = np.clip(np.asarray(mi, dtype=np.float64), 0, None)
    total = float(mi.sum())
    if total <= 0:
        return 0
    cum = np.cumsum(np.sort(mi)[::-1])
    hit = np.flatnonzero(cum > budget * total)
    return int(hit[0] + 1) if hit.size else int((mi > 0).sum())


def select_features(mi: np.ndarray, expectation: np.ndarray, budget: float) -> dict[str, Any]:
    """SpARE selection: walk latents by MI (descending, ties by id); E > 0 -> memory side, E < 0 -> tool side,
    E == 0 skipped; stop once K = ``budget_count`` latents are assigned. Returns ids per side in MI order."""
    mi = np.asarray(mi, dtype=np.float64)
    e = np.asarray(expectation, dtype=np.float64)
    k = budget_count(mi, budget)
    memory: list[int] = []
    tool: list[int] = []
    if k:
        for j in rank_order(mi):
            if len(memory) + len(tool) >= k or mi[j] <= 0:
                break
            if e[j] > 0:
                memory.append(int(j))
            elif e[j] < 0:
                tool.append(int(j))
    return {"k": k, "memory": memory, "tool": tool, "total_mi": float(np.clip(mi, 0, None).sum())}


def side_targets(z: np.ndarray, y: np.ndarray, ids: Sequence[int], label: int) -> np.ndarray:
    """Mean code of latents ``ids`` over the episodes with behaviour ``label`` (the functional activation)."""
    z = np.asarray(z, dtype=np.float64)
    if not len(ids):
        return np.zeros(0)
    return z[np.asarray(y) == label][:, list(ids)].mean(0)


def spec_features(sel: Mapping[str, Sequence[int]], targets: Mapping[str, np.ndarray], steer_toward: str
                  ) -> dict[str, list]:
    """The spec's per-site feature block: steer toward memory removes the tool side and adds the memory side."""
    if steer_toward not in ("memory", "tool"):
        raise MiningError(f"--steer-toward must be memory or tool, got {steer_toward!r}")
    rem, add = ("tool", "memory") if steer_toward == "memory" else ("memory", "tool")
    return {"remove": [int(i) for i in sel[rem]], "remove_targets": [float(v) for v in targets[rem]],
            "add": [int(i) for i in sel[add]], "add_targets": [float(v) for v in targets[add]]}


# == the job ================================================================================================

@dataclass
class MiningConfig:
    activations: str
    sae: dict[int, Any]                         # site -> {"path": DIR} | {"release", "sae_id"}
    fit_fold: str
    out: str
    run: str | None = None
    layers: Sequence[int] | None = None         # default: every site with an SAE
    position_kind: str = "last_input"
    benchmark: str = "demo"
    eval_folds: Sequence[str] | None = None     # default: every fold but the fit fold
    eval_question_ids: Sequence[str] | None = None   # extra evaluation questions that must stay unseen
    budget: float = 0.07
    steer_toward: str = "memory"
    positions: str = "last_input"
    strength: float = 1.0
    estimator: str = "knn"
    n_neighbors: int = 3
    seed: int = 0
    n_bins: int = 8
    top_k_agreement: int = 20
    top_tokens: int = 8
    min_per_class: int = 2
    fvu_threshold: float = 0.5
    name: str | None = None
    device: str = "cpu"


@dataclass
class LayerResult:
    site: int
    n_latents: int
    mi: np.ndarray
    expectation: np.ndarray
    freq: dict[str, np.ndarray]
    mean_kept: np.ndarray
    mean_followed: np.ndarray
    selection: dict[str, Any]
    targets: dict[str, np.ndarray]
    agreement: dict[str, Any]
    fvu: float
    mi_seconds: float
    mi_rank: np.ndarray = field(repr=False, default=None)        # rank (1-based) of every latent by MI
    freq_rank: np.ndarray = field(repr=False, default=None)
    top_tokens: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class MiningResult:
    out: Path
    spec_path: Path
    spec: dict[str, Any]
    layers: dict[int, LayerResult]
    counts: dict[str, int]
    report: dict[str, Any]


def _read_run_labels(run: str | Path) -> tuple[dict[str, str], dict[str, Any]]:
    from memtoc.runstore import RunStore

    store = RunStore.read(run)
    recs = store.episodes.records()
    labels = {str(r["episode_id"]): str(r.get("outcome") or "") for r in recs}
    return labels, store.run_info()


def _check_run_model(run_info: Mapping[str, Any], store_attrs: Mapping[str, Any], run: Any) -> None:
    ident = run_info.get("identity") or {}
    theirs = ident.get("weights_sha256")
    mine = store_attrs.get("weights_sha256")
    if theirs and mine and mine not in ("None", "") and theirs != mine:
        raise MiningError(f"run {run} was made with another model (weights {str(theirs)[:12]}) than the activations "
                          f"(weights {str(mine)[:12]}); its outcomes do not describe these activations")


def resolve_labels(store: Any, rows: np.ndarray, run: str | Path | None) -> tuple[np.ndarray, dict[str, Any]]:
    """Outcome of each row: the store's joined labels when present, else the run's records by episode_id. When
    both exist they must agree (a store joined with another run is refused rather than silently mixed)."""
    idx = store.index
    eids = idx["episode_id"][rows]
    store_out = idx["outcome"][rows] if "outcome" in idx else np.full(len(rows), "", dtype=object)
    has_store = bool(np.any(store_out != ""))
    source: dict[str, Any] = {}
    if run is not None:
        labels, info = _read_run_labels(run)
        _check_run_model(info, store.attrs, run)
        run_out = np.asarray([labels.get(str(e), "") for e in eids], dtype=object)
        source["run"] = str(Path(run).resolve())
        if has_store:
            both = (store_out != "") & (run_out != "")
            bad = np.flatnonzero(both & (store_out != run_out))
            if bad.size:
                i = bad[0]
                raise MiningError(f"the store's joined labels disagree with run {run} for {bad.size} rows (e.g. "
                                  f"{eids[i]}: {store_out[i]!r} in the store, {run_out[i]!r} in the run); the store "
                                  f"was labelled from {store.attrs.get('labels_source', {}).get('run', '?')} -- "
                                  "re-extract with --run, or mine without --run to use the store's labels")
            source["labels"] = "store+run (agree)"
            return np.where(store_out != "", store_out, run_out), source
        source["labels"] = "run"
        return run_out, source
    if not has_store:
        raise MiningError(f"{store.path} carries no behaviour labels (it was extracted without --run); pass --run "
                          "RUN_DIR (the evaluation run whose outcomes label the episodes)")
    source["labels"] = "store"
    source["labels_source"] = store.attrs.get("labels_source")
    return store_out, source


def _parse_eval_folds(bench: Any, fit_fold: str, eval_folds: Sequence[str] | None) -> list[str]:
    if bench.folds is None:
        raise MiningError(f"benchmark {bench.name!r} has no cross-fitting folds; mining needs a fit fold held out "
                          "from the evaluation questions")
    names = sorted(set(bench.folds.values()))
    if fit_fold not in names:
        raise MiningError(f"unknown fit fold {fit_fold!r}; folds are {', '.join(names)}")
    if eval_folds is None:
        out = [f for f in names if f != fit_fold]
        if not out:
            raise MiningError(f"benchmark {bench.name!r} has only fold {fit_fold!r}: nothing left to evaluate on")
        return out
    for f in eval_folds:
        if f not in names:
            raise MiningError(f"unknown evaluation fold {f!r}; folds are {', '.join(names)}")
    return list(eval_folds)


def check_held_out(mining_qids: Sequence[str], eval_qids: Sequence[str], *, what: str = "evaluation") -> None:
    """Refuse mining questions that are also evaluation questions (the edit would be tested on its own data)."""
    overlap = sorted(set(map(str, mining_qids)) & set(map(str, eval_qids)))
    if overlap:
        raise MiningError(f"held-out violation: {len(overlap)} of the {len(set(mining_qids))} mining questions are "
                          f"also {what} questions (e.g. {', '.join(overlap[:5])}); mine on a fit fold disjoint from "
                          "the evaluation fold")


def _episode_means(z: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """Mean of the rows of each episode (rows are mapped to episodes by ``groups``)."""
    sums = np.zeros((n_groups, z.shape[1]), dtype=np.float64)
    np.add.at(sums, groups, z)
    cnt = np.bincount(groups, minlength=n_groups).astype(np.float64)
    return (sums / cnt[:, None]).astype(np.float32)


def _top_tokens(store: Any, sae: Any, site: int, feature_ids: Sequence[int], rows: np.ndarray, n_top: int,
                chunk: int = 8192) -> dict[int, list[dict[str, Any]]]:
    """For each latent, the ``n_top`` rows (tokens) where it fires most among ``rows``."""
    from steering.sae import encode

    feats = np.asarray(sorted(set(int(f) for f in feature_ids)), dtype=np.int64)
    if not len(feats) or not len(rows) or n_top < 1:
        return {}
    n_keep = 4 * n_top          # candidates kept per latent; identical contexts (shared prompt prefixes) collapse
    best_v = np.full((0, len(feats)), -np.inf, dtype=np.float32)
    best_r = np.zeros((0, len(feats)), dtype=np.int64)
    for i in range(0, len(rows), chunk):
        r = rows[i:i + chunk]
        z = encode(sae, store.read(site, r))[:, feats]
        v = np.concatenate([best_v, z], 0)
        rr = np.concatenate([best_r, np.repeat(r[:, None], len(feats), 1)], 0)
        keep = np.argsort(-v, axis=0, kind="stable")[:n_keep]
        best_v = np.take_along_axis(v, keep, 0)
        best_r = np.take_along_axis(rr, keep, 0)
    idx = store.index
    out: dict[int, list[dict[str, Any]]] = {}
    for col, f in enumerate(feats.tolist()):
        items: list[dict[str, Any]] = []
        seen: set[tuple[str, float]] = set()
        for v, r in zip(best_v[:, col].tolist(), best_r[:, col].tolist()):
            tok = str(idx["token_str"][r])
            if v <= 0 or len(items) >= n_top:
                break
            if (tok, v) in seen:            # the same token in the same context, from another episode
                continue
            seen.add((tok, v))
            items.append({"token": tok, "value": float(v), "episode_id": str(idx["episode_id"][r]),
                          "token_index": int(idx["token_index"][r])})
        out[f] = items
    return out


def _parse_positions(positions: str) -> str:
    kinds = [p.strip() for p in str(positions).split(",") if p.strip()]
    bad = [p for p in kinds if p not in EDIT_POSITIONS]
    if not kinds or bad:
        raise MiningError(f"--positions {positions!r}: choose one of {', '.join(EDIT_POSITIONS)}")
    if len(kinds) != 1:
        raise MiningError(f"--positions takes one position kind for the edit, got {positions!r}")
    return kinds[0]


def mine_features(cfg: MiningConfig, *, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)
                  ) -> MiningResult:
    """Run the mining job (see the module docstring) and write the spec, the tables and ``mining.json``."""
    from activations.store import open_store
    from memtoc.benchmark import load_benchmark
    from steering.sae import (check_sae_site, encode, fvu, load_sae, read_sae_meta, resolve_sae_path,
                              store_fingerprint)

    t_start = time.time()
    if cfg.estimator not in ESTIMATORS:
        raise MiningError(f"unknown MI estimator {cfg.estimator!r}; choose {', '.join(ESTIMATORS)}")
    if cfg.steer_toward not in ("memory", "tool"):
        raise MiningError(f"--steer-toward must be memory or tool, got {cfg.steer_toward!r}")
    if not 0 < cfg.budget <= 1:
        raise MiningError(f"--budget must be in (0, 1], got {cfg.budget}")
    edit_position = _parse_positions(cfg.positions)
    if not cfg.sae:
        raise MiningError("no SAE given: --sae SITE=DIR[,SITE=DIR]")
    sites = sorted(int(s) for s in (cfg.layers if cfg.layers is not None else cfg.sae))
    missing = [s for s in sites if s not in cfg.sae]
    if missing:
        raise MiningError(f"no SAE for site(s) {missing}: give --sae {missing[0]}=DIR")
    bench = load_benchmark(cfg.benchmark)
    eval_folds = _parse_eval_folds(bench, cfg.fit_fold, cfg.eval_folds)
    fit_qids = {q for q, f in bench.folds.items() if f == cfg.fit_fold}
    eval_qids = {q for q, f in bench.folds.items() if f in eval_folds} | set(map(str, cfg.eval_question_ids or ()))
    out = Path(cfg.out)

    with open_store(cfg.activations) as store:
        for s in sites:
            if s not in store.layers:
                raise MiningError(f"site {s} is not stored in {cfg.activations}; stored sites: {store.layers}")
        idx = store.index
        kinds = sorted(set(idx["position_kind"].tolist()))
        cand = np.flatnonzero((idx["position_kind"] == cfg.position_kind) & (idx["condition"] == "tool_wrong"))
        if not len(cand):
            raise MiningError(f"{cfg.activations} has no tool_wrong rows of position kind {cfg.position_kind!r} "
                              f"(position kinds present: {', '.join(kinds) or 'none'})")
        outcome, label_source = resolve_labels(store, cand, cfg.run)
        qids = idx["question_id"][cand].astype(str)
        in_fit = np.isin(qids, list(fit_qids))
        labelled = np.isin(outcome, list(BEHAVIOURS))
        rows = cand[in_fit & labelled]
        row_out = outcome[in_fit & labelled]
        mining_qids = sorted(set(idx["question_id"][rows].astype(str).tolist()))
        check_held_out(mining_qids, eval_qids, what=f"evaluation (fold {', '.join(eval_folds)})")
        eids_rows = idx["episode_id"][rows].astype(str)
        episodes, groups = np.unique(eids_rows, return_inverse=True)
        ep_out = {e: o for e, o in zip(eids_rows.tolist(), row_out.tolist())}
        y = np.asarray([BEHAVIOURS[ep_out[e]] for e in episodes.tolist()], dtype=np.int64)
        fit_eps = set(idx["episode_id"][cand[in_fit]].astype(str).tolist())
        counts = {"kept_memory": int((y == 1).sum()), "followed_tool": int((y == 0).sum()),
                  "other_outcomes": len(fit_eps) - len(episodes),
                  "unlabelled": int(len(set(idx["episode_id"][cand[in_fit & (outcome == '')]].astype(str)))),
                  "fit_fold_episodes": len(fit_eps), "mining_questions": len(mining_qids),
                  "tool_wrong_episodes_in_store": int(len(set(idx["episode_id"][cand].astype(str))))}
        if counts["kept_memory"] < cfg.min_per_class or counts["followed_tool"] < cfg.min_per_class:
            raise MiningError(
                f"too few episodes of each behaviour in fold {cfg.fit_fold}: found {counts['kept_memory']} kept_memory "
                f"and {counts['followed_tool']} followed_tool tool_wrong episodes ({counts['other_outcomes']} with "
                f"other outcomes, {counts['unlabelled']} without a label, of {counts['fit_fold_episodes']} in the "
                f"fold); need at least {cfg.min_per_class} of each -- evaluate more questions or formulations")
        tok_rows = np.flatnonzero((idx["position_kind"] == "all") & np.isin(idx["question_id"].astype(str),
                                                                           list(fit_qids))
                                  & (idx["token_index"] >= 1))
        fingerprint = store_fingerprint(store)

        layer_results: dict[int, LayerResult] = {}
        spec_sae: dict[str, Any] = {}
        spec_feats: dict[str, Any] = {}
        spec_fvu: dict[str, float] = {}
        for s in sites:
            ref = dict(cfg.sae[s])
            sae = load_sae(ref, device=cfg.device)
            sae_path = resolve_sae_path(ref) if "path" in ref else None
            try:
                check_sae_site(sae, s, store.d_model, path=sae_path)
            except MemtocError as exc:
                raise MiningError(str(exc)) from None
            x = store.read(s, rows)
            layer_fvu = fvu(sae, x) if len(x) >= 2 else float("nan")
            z = _episode_means(encode(sae, x), groups, len(episodes))
            t0 = time.time()
            mi = mutual_information(z, y, estimator=cfg.estimator, n_neighbors=cfg.n_neighbors,
                                    random_state=cfg.seed, n_bins=cfg.n_bins)
            mi_seconds = time.time() - t0
            mi = np.where(np.all(z == z[:1], axis=0), 0.0, mi)     # constant (e.g. dead) latents carry no information
            e = expectation_difference(z, y)
            freq = frequency_separation(z, y)
            mi_ord = rank_order(mi)
            fq_ord = frequency_order(z, y)
            mi_rank = np.empty(len(mi), dtype=np.int64)
            mi_rank[mi_ord] = np.arange(1, len(mi) + 1)
            fq_rank = np.empty(len(mi), dtype=np.int64)
            fq_rank[fq_ord] = np.arange(1, len(mi) + 1)
            agreement = topk_agreement(mi_ord, fq_ord, cfg.top_k_agreement)
            sel = select_features(mi, e, cfg.budget)
            targets = {"memory": side_targets(z, y, sel["memory"], 1), "tool": side_targets(z, y, sel["tool"], 0)}
            res = LayerResult(site=s, n_latents=int(z.shape[1]), mi=mi, expectation=e, freq=freq,
                              mean_kept=z[y == 1].mean(0), mean_followed=z[y == 0].mean(0), selection=sel,
                              targets=targets, agreement=agreement, fvu=float(layer_fvu), mi_seconds=mi_seconds,
                              mi_rank=mi_rank, freq_rank=fq_rank)
            res.top_tokens = _top_tokens(store, sae, s, sel["memory"] + sel["tool"], tok_rows, cfg.top_tokens)
            layer_results[s] = res
            n_sel = len(sel["memory"]) + len(sel["tool"])
            log(f"site {s}: {res.n_latents} latents, total MI {sel['total_mi']:.4f} nats, K={sel['k']} -> "
                f"{len(sel['memory'])} memory-side + {len(sel['tool'])} tool-side; top-{agreement['k']} agreement "
                f"with frequency ranking {agreement['overlap']}/{agreement['k']} (Jaccard {agreement['jaccard']:.2f}); "
                f"FVU {layer_fvu:.3f}; MI {cfg.estimator} {mi_seconds:.1f} s")
            if layer_fvu > cfg.fvu_threshold:
                log(f"site {s}: WARNING FVU {layer_fvu:.3f} > threshold {cfg.fvu_threshold}: the SAE reconstructs "
                    "these activations poorly; the edit machinery refuses it unless the spec says force")
            if not n_sel:
                log(f"site {s}: no latent selected (no mutual information with the behaviour); left out of the spec")
                continue
            if "path" in ref:
                out.mkdir(parents=True, exist_ok=True)
                spec_sae[str(s)] = {"path": os.path.relpath(Path(sae_path).resolve(), out.resolve())}
            else:
                spec_sae[str(s)] = {"release": ref["release"], "sae_id": ref["sae_id"]}
            spec_feats[str(s)] = spec_features(sel, targets, cfg.steer_toward)
            spec_fvu[str(s)] = float(layer_fvu)

    if not spec_feats:
        raise MiningError("no latent carries mutual information with the behaviour at any mined site "
                          f"({', '.join(map(str, sites))}); nothing to write")
    spec_sites = sorted(int(s) for s in spec_feats)
    name = cfg.name or (f"spare-{cfg.steer_toward}-fold{cfg.fit_fold}-L" + "_".join(map(str, spec_sites)))
    spec = {
        "schema_version": EDIT_SCHEMA, "name": name, "kind": "sae_clamp", "layers": spec_sites,
        "positions": edit_position, "strength": float(cfg.strength), "apply_to_closed_book": False,
        "sae": spec_sae, "features": spec_feats, "steer_toward": cfg.steer_toward, "fvu": spec_fvu,
        "fvu_threshold": float(cfg.fvu_threshold), "force": False,
        "description": f"SpARE-style SAE clamp mined by memtoc mine-features: steer toward {cfg.steer_toward}",
        "source": {"tool": "memtoc mine-features", "report": "mining.json", "fit_fold": cfg.fit_fold,
                   "eval_folds": eval_folds, "activations": str(Path(cfg.activations).resolve()),
                   "run": str(Path(cfg.run).resolve()) if cfg.run else None, "estimator": cfg.estimator,
                   "budget": float(cfg.budget), "position_kind": cfg.position_kind,
                   "n_episodes": {"kept_memory": counts["kept_memory"], "followed_tool": counts["followed_tool"]}},
    }
    report = {
        "schema_version": MINING_SCHEMA, "spec": "edit.json", "config": _jsonable(asdict(cfg)),
        "store": fingerprint, "labels": label_source, "benchmark": {"name": bench.name, "files": bench.files},
        "fit_fold": cfg.fit_fold, "eval_folds": eval_folds, "mining_question_ids": mining_qids,
        "mining_episode_ids": episodes.tolist(), "counts": counts,
        "sae": {str(s): {"ref": _jsonable(cfg.sae[s]),
                         "memtoc_sae": read_sae_meta(resolve_sae_path(cfg.sae[s])) if "path" in cfg.sae[s] else None}
                for s in sites},
        "layers": {str(s): {"n_latents": r.n_latents, "k": r.selection["k"], "total_mi": r.selection["total_mi"],
                            "memory": r.selection["memory"], "tool": r.selection["tool"], "agreement": r.agreement,
                            "fvu": r.fvu, "mi_seconds": round(r.mi_seconds, 3)} for s, r in layer_results.items()},
        "definitions": {
            "label": "1 = kept_memory, 0 = followed_tool (tool_wrong episodes; both/neither dropped)",
            "expectation": "E_j = mean(z_j | kept_memory) - mean(z_j | followed_tool); E > 0 = memory side",
            "frequency_separation": "|P(z_j > 0 | kept_memory) - P(z_j > 0 | followed_tool)|, ties by |E_j|/pooled sd",
            "target": "memory side: mean z_j over kept_memory episodes; "
                      "tool side: mean z_j over followed_tool episodes",
            "budget": "K = smallest count whose cumulative MI (descending) exceeds budget x total MI",
            "fvu": "sum ||x - x_hat||^2 / sum ||x - mean x||^2 over the mining rows",
        },
        "seconds": round(time.time() - t_start, 2),
    }
    spec_path = write_outputs(out, spec, report, layer_results, cfg.steer_toward)
    log(f"edit spec -> {spec_path} ({sum(len(f['remove']) + len(f['add']) for f in spec_feats.values())} latents at "
        f"sites {spec_sites}); feature table -> {out / 'features.md'}")
    return MiningResult(out=out, spec_path=spec_path, spec=spec, layers=layer_results, counts=counts, report=report)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


# == output =================================================================================================

TABLE_COLUMNS = ("site", "feature", "side", "role", "mi", "mi_rank", "freq_score", "freq_rank", "delta_freq",
                 "expectation", "mean_kept", "mean_followed", "target", "top_tokens")


def feature_rows(layers: Mapping[int, LayerResult], steer_toward: str) -> list[dict[str, Any]]:
    out = []
    for s, r in sorted(layers.items()):
        for side in ("memory", "tool"):
            for j, target in zip(r.selection[side], r.targets[side]):
                role = "add" if side == steer_toward else "remove"
                toks = r.top_tokens.get(int(j), [])
                out.append({
                    "site": s, "feature": int(j), "side": side, "role": role, "mi": float(r.mi[j]),
                    "mi_rank": int(r.mi_rank[j]), "freq_score": float(r.freq["score"][j]),
                    "freq_rank": int(r.freq_rank[j]), "delta_freq": float(r.freq["delta"][j]),
                    "expectation": float(r.expectation[j]), "mean_kept": float(r.mean_kept[j]),
                    "mean_followed": float(r.mean_followed[j]), "target": float(target),
                    "top_tokens": [(t["token"], round(t["value"], 4)) for t in toks],
                })
    out.sort(key=lambda d: (d["site"], d["mi_rank"]))
    return out


def _md_token(tok: str) -> str:
    s = json.dumps(tok, ensure_ascii=False)[1:-1]
    return s.replace("|", "\\|").replace("`", "'")


def write_outputs(out: Path, spec: Mapping[str, Any], report: Mapping[str, Any], layers: Mapping[int, LayerResult],
                  steer_toward: str) -> Path:
    from memtoc.fileio import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    rows = feature_rows(layers, steer_toward)
    with (out / "features.csv.tmp").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "top_tokens": json.dumps(r["top_tokens"], ensure_ascii=False)})
    os.replace(out / "features.csv.tmp", out / "features.csv")
    lines = [f"# Mined SAE features: {spec['name']}", "",
             f"Steer toward **{steer_toward}** (remove the {'tool' if steer_toward == 'memory' else 'memory'}-side "
             f"latents, add the {steer_toward}-side latents). Fit fold {report['fit_fold']}, evaluation fold(s) "
             f"{', '.join(report['eval_folds'])}; {report['counts']['kept_memory']} kept-memory and "
             f"{report['counts']['followed_tool']} followed-tool episodes from {report['counts']['mining_questions']} "
             f"questions. MI estimator `{report['config']['estimator']}`, budget {report['config']['budget']}.", "",
             "| site | latents | total MI | K | memory | tool | top-20 agreement (overlap / Jaccard) | FVU |",
             "|---:|---:|---:|---:|---:|---:|---|---:|"]
    for s, r in sorted(layers.items()):
        a = r.agreement
        lines.append(f"| {s} | {r.n_latents} | {r.selection['total_mi']:.4f} | {r.selection['k']} | "
                     f"{len(r.selection['memory'])} | {len(r.selection['tool'])} | {a['overlap']}/{a['k']} / "
                     f"{a['jaccard']:.2f} | {r.fvu:.3f} |")
    lines += ["", "| site | feature | side | role | MI | MI rank | freq sep | freq rank | Δfreq | E | target | "
                  "top-activating tokens |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        toks = ", ".join(f"`{_md_token(t)}` ({v:.2f})" for t, v in r["top_tokens"]) or "–"
        lines.append(f"| {r['site']} | {r['feature']} | {r['side']} | {r['role']} | {r['mi']:.4f} | {r['mi_rank']} | "
                     f"{r['freq_score']:.3f} | {r['freq_rank']} | {r['delta_freq']:+.3f} | {r['expectation']:+.4f} | "
                     f"{r['target']:.4f} | {toks} |")
    lines += ["", "Δfreq = P(z>0 | kept memory) − P(z>0 | followed tool); E = mean(z | kept) − mean(z | followed); "
                  "target = mean code of the latent over the episodes of its side's behaviour. Top tokens: the store's "
                  "`all` rows of fit-fold questions (first token excluded).", ""]
    (out / "features.md.tmp").write_text("\n".join(lines), encoding="utf-8")
    os.replace(out / "features.md.tmp", out / "features.md")
    write_json_atomic(out / "mining.json", dict(report))
    spec_path = out / "edit.json"
    write_json_atomic(spec_path, dict(spec))
    return spec_path


def parse_sae_arg(text: str) -> dict[int, dict[str, str]]:
    """``SITE=DIR[,SITE=DIR]`` or ``SITE=pretrained:RELEASE:SAE_ID``; a bare ``DIR`` takes its site from the
    directory's ``memtoc_sae.json``."""
    from steering.sae import read_sae_meta

    out: dict[int, dict[str, str]] = {}
    for item in [t.strip() for t in str(text).split(",") if t.strip()]:
        if "=" in item and item.split("=", 1)[0].strip().isdigit():
            site_s, ref = item.split("=", 1)
            site = int(site_s)
        else:
            ref = item
            meta = read_sae_meta(ref)
            if meta is None or "site" not in meta:
                raise MiningError(f"--sae {item!r}: say which site it is for (SITE={item}); it has no memtoc_sae.json")
            site = int(meta["site"])
        if site in out:
            raise MiningError(f"--sae names site {site} twice")
        if ref.startswith("pretrained:"):
            parts = ref.split(":", 2)
            if len(parts) != 3 or not parts[1] or not parts[2]:
                raise MiningError(f"--sae {item!r}: use SITE=pretrained:RELEASE:SAE_ID")
            out[site] = {"release": parts[1], "sae_id": parts[2]}
        else:
            out[site] = {"path": ref}
    if not out:
        raise MiningError("--sae is empty")
    return out
