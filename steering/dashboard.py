"""Feature dashboards: what each mined SAE latent (``memtoc mine-features``) responds to.

For every latent of a mining directory's feature table, its code at every stored prompt token (position kind
``all``) gives its top-activating contexts (the first token of each prompt left out, as mining does), its
activation by condition, and by span: question side, tool value (the store's ``tool_span`` rows) and the rest;
an episode whose tool tokens are not stored is counted as ``unknown``. The page adds its MI score, rank, side
and role from the feature table. The store needs ``all`` rows at the latent's site (and ``tool_span`` rows
for the span split).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from steering.mi import MiningError
from memtoc.core.fileio import json_ready

__all__ = ["FeatureView", "feature_views", "SPANS"]

SPANS = ("question", "tool value", "rest", "unknown")


@dataclass
class FeatureView:
    site: int
    feature: int
    side: str
    role: str
    mi: float
    mi_rank: int
    contexts: list[dict[str, Any]] = field(default_factory=list)     # tokens [(str, code)], peak index, episode
    by_condition: dict[str, dict[str, float]] = field(default_factory=dict)
    by_span: dict[str, dict[str, float]] = field(default_factory=dict)
    #: episodes with a tool return whose tokens could not be split (no ``tool_span`` rows): span ``unknown``
    unsplit_episodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a figure with no tokens behind it (NaN: a span or condition absent) becomes null."""
        return json_ready(dict(self.__dict__))



def read_feature_table(mining_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The mined features (``features.csv``) and the mining report (``mining.json``)."""
    d = Path(mining_dir)
    table, report = d / "features.csv", d / "mining.json"
    if not table.is_file() or not report.is_file():
        raise MiningError(f"{d} is not a mining directory (no features.csv / mining.json); give the --out of "
                          "memtoc mine-features")
    with table.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return rows, json.loads(report.read_text(encoding="utf-8"))


def _has_tool_return(condition: str) -> bool | None:
    """Whether a record's condition shows a tool return (None: not a registered condition)."""
    from memtoc.bench.conditions import get_condition
    from memtoc.core.errors import BenchmarkDataError

    try:
        return get_condition(condition).has_tool_return
    except BenchmarkDataError:
        return None


def _stats(z: np.ndarray) -> dict[str, float]:
    return {"mean": float(z.mean()) if len(z) else float("nan"), "firing": float((z > 0).mean()) if len(z) else
            float("nan"), "n_tokens": int(len(z))}


def feature_views(store: Any, saes: dict[int, Any], features: Sequence[dict[str, Any]], *, n_contexts: int = 8,
                  window: int = 10, chunk: int = 8192) -> list[FeatureView]:
    """One :class:`FeatureView` per feature row (``site``, ``feature``, ``side``, ``role``, ``mi``, ``mi_rank``)."""
    from steering.sae import encode

    idx = store.index
    kinds = np.asarray(idx["position_kind"]).astype(str)
    token_index = np.asarray(idx["token_index"]).astype(np.int64)
    episodes = np.asarray(idx["episode_id"]).astype(str)
    conditions = np.asarray(idx["condition"]).astype(str)
    tokens = np.asarray(idx["token_str"]).astype(str)
    all_rows = np.flatnonzero(kinds == "all")
    if not len(all_rows):
        raise MiningError("the store has no 'all' rows (every prompt token); extract with --position-kinds "
                          "last_input,all at the SAE's site")
    # the tool span of each episode, from its tool_span rows: [first, last] token index
    span: dict[str, tuple[int, int]] = {}
    for r in np.flatnonzero(kinds == "tool_span"):
        e, t = episodes[r], int(token_index[r])
        lo, hi = span.get(e, (t, t))
        span[e] = (min(lo, t), max(hi, t))

    condition_of = dict(zip(episodes[all_rows], conditions[all_rows]))
    unsplit = {e for e, c in condition_of.items() if e not in span and _has_tool_return(c) is not False}

    def span_of(e: str, t: int) -> str:
        if e not in span:
            return "unknown" if e in unsplit else "question"    # no tool return: the whole prompt is the question
        lo, hi = span[e]
        return "question" if t < lo else "tool value" if t <= hi else "rest"

    spans = np.array([span_of(episodes[r], int(token_index[r])) for r in all_rows])
    keep = token_index[all_rows] > 0                                # the attention sink
    by_site: dict[int, list[dict[str, Any]]] = {}
    for f in features:
        by_site.setdefault(int(f["site"]), []).append(f)
    views: list[FeatureView] = []
    for site, feats in sorted(by_site.items()):
        if site not in saes:
            raise MiningError(f"no SAE for site {site} in the mining report")
        if site not in store.layers:
            raise MiningError(f"site {site} is not stored in the activation store (stored: {store.layers})")
        ids = [int(f["feature"]) for f in feats]
        z = np.concatenate([encode(saes[site], store.read(site, all_rows[i:i + chunk]))[:, ids]
                            for i in range(0, len(all_rows), chunk)], 0)        # [n_all_rows, n_features]
        order = np.lexsort((token_index[all_rows], episodes[all_rows]))
        for col, f in enumerate(feats):
            v = FeatureView(site, int(f["feature"]), str(f.get("side", "")), str(f.get("role", "")),
                            float(f.get("mi") or 0.0), int(float(f.get("mi_rank") or 0)),
                            unsplit_episodes=len(unsplit))
            code = z[:, col]
            for cond in sorted(set(conditions[all_rows])):
                v.by_condition[cond] = _stats(code[keep & (conditions[all_rows] == cond)])
            for sp in SPANS:
                v.by_span[sp] = _stats(code[keep & (spans == sp)])
            seen: set[str] = set()
            for j in np.argsort(-np.where(keep, code, -np.inf), kind="stable"):
                if len(v.contexts) >= n_contexts or code[j] <= 0:
                    break
                e = episodes[all_rows[j]]
                if e in seen:
                    continue
                seen.add(e)
                mine = order[episodes[all_rows][order] == e]          # the episode's rows in token order
                t0 = int(token_index[all_rows[j]])
                pos = [int(token_index[all_rows[k]]) for k in mine]
                lo, hi = max(0, pos.index(t0) - window), min(len(mine), pos.index(t0) + window + 1)
                v.contexts.append({"episode_id": e, "condition": str(conditions[all_rows[j]]),
                                   "peak": pos.index(t0) - lo, "value": float(code[j]),
                                   "tokens": [(str(tokens[all_rows[k]]), float(code[k])) for k in mine[lo:hi]]})
            views.append(v)
    return views
