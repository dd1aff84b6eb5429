"""Feature statistics, rankings and the SpARE selection (feature mining, ``steering.mining``, steps 4-7):
expectation difference, frequency separation and its ranking, top-k agreement, the MI budget, the per-side
selection, functional-activation targets and the spec's per-site feature block.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from steering.mi import MiningError


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
