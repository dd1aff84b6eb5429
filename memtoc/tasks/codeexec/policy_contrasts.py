"""The overreliance paper's prompt-policy contrasts (seed 002 L117-L119): each policy arm (Compare, Verify,
Disclose) against Plain, paired by problem, with Holm inside the tool's family.

The paper: "Holm adjustment covers [...] 42 contrasts per tool for prompts" (3 policies x 2 metrics, P1
adoption and P0 accuracy, x 7: the six models and the pooled estimate); "Only items eligible under both
conditions enter the [...] prompt [...] contrasts"; "Plain uses the per-item mean of its eligible repetitions";
"Plain reuses three main-evaluation repetitions for [...] Code Executor P1" (``plain_main``). The pooled estimate
is "the unweighted mean of the six model-specific paired differences, with item draws shared across models"
(:func:`pooled_paired_difference`). The family's size is declared (42): a call with fewer models reports how
many members it holds (``family_members`` / ``family_size``), since its Holm runs over fewer contrasts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

from memtoc.core.errors import MemtocError
import numpy as np

from memtoc.scoring.stats import PairedResult, holm, paired_difference
from memtoc.tasks.codeexec.metrics import Trial

#: (metric, condition) of each policy contrast, as the paper's prompt tables read them
POLICY_METRICS: tuple[tuple[str, str], ...] = (("adoption", "P1"), ("accuracy", "P0"))
PLAIN = "Plain"


def per_item(trials: Sequence[Trial], metric: str, condition: str) -> dict[str, float]:
    """Problem id -> the mean of the metric over the problem's eligible runs in ``condition``."""
    acc: dict[str, list[float]] = defaultdict(list)
    for t in trials:
        if t.condition != condition:
            continue
        if metric == "adoption":
            if t.adopted is None:
                continue
            acc[t.problem_id].append(float(bool(t.adopted)))
        elif metric == "accuracy":
            acc[t.problem_id].append(float(t.correct))
        else:
            raise MemtocError(f"unknown policy metric {metric!r}; choose adoption or accuracy")
    return {k: sum(v) / len(v) for k, v in acc.items()}


def pooled_paired_difference(per_model: Mapping[str, tuple[Mapping[str, float], Mapping[str, float]]], *,
                             n_boot: int, n_perm: int, alpha: float = 0.05, seed: int = 0) -> PairedResult:
    """The unweighted mean over models of each model's paired difference (b - a on the items eligible in both),
    with a percentile bootstrap interval and a two-sided sign-flip p whose item draws are shared across models.

    ``per_model``: model -> (item -> reference value, item -> arm value). The items are the union of every model's
    eligible items; a bootstrap draw resamples that union once (each model averaging its own eligible items of the
    draw) and a sign-flip draw gives each item one sign for every model. One ``default_rng(seed)``: bootstrap
    first, then signs, as :func:`memtoc.scoring.stats.paired_difference`.
    """
    diffs: dict[str, dict[str, float]] = {}
    for model, (a, b) in per_model.items():
        common = set(a) & set(b)
        if common:
            diffs[model] = {i: float(b[i]) - float(a[i]) for i in common}
    if not diffs:
        return PairedResult(math.nan, math.nan, math.nan, math.nan, 0, 0)
    items = sorted(set().union(*diffs.values()))
    pos = {it: k for k, it in enumerate(items)}
    d = np.zeros((len(diffs), len(items)))
    c = np.zeros((len(diffs), len(items)))
    for m, vals in enumerate(diffs.values()):
        for it, v in vals.items():
            d[m, pos[it]], c[m, pos[it]] = v, 1.0
    delta = float(np.mean(d.sum(axis=1) / c.sum(axis=1)))
    rng = np.random.default_rng(seed)
    n = len(items)
    idx = rng.integers(0, n, size=(n_boot, n))
    w = np.zeros((n_boot, n))
    np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = np.nanmean((w @ d.T) / (w @ c.T), axis=1)
    boots = boots[~np.isnan(boots)]
    lo, hi = np.quantile(boots, [alpha / 2, 1 - alpha / 2]) if boots.size else (math.nan, math.nan)
    signs = rng.integers(0, 2, size=(n_perm, n)) * 2 - 1
    perm = np.mean((signs @ d.T) / c.sum(axis=1), axis=1)
    p = (int((np.abs(perm) >= abs(delta) - 1e-12).sum()) + 1) / (n_perm + 1)
    return PairedResult(delta=delta, ci_low=float(lo), ci_high=float(hi), p_value=float(p),
                        n_units=int(c.sum()), n_clusters=n)


#: the declared family's size per tool: 3 policies x 2 metrics x (6 models + the pooled estimate)
FAMILY_SIZE = 42


def policy_contrasts_by_model(plain: Mapping[str, Sequence[Trial]], arms: Mapping[str, Mapping[str, Sequence[Trial]]],
                              *, n_boot: int, n_perm: int, seed: int, alpha: float = 0.05,
                              plain_main: Mapping[str, Sequence[Trial]] | None = None) -> list[dict[str, Any]]:
    """The tool's family: per model (``plain[model]``, ``arms[model][policy]``) each policy vs Plain on each
    metric, and with two or more models the pooled estimate per policy and metric; Holm over every row.

    ``plain_main[model]``: the main evaluation's Plain run; its P1 trials (all repetitions) replace the Plain
    run's P1 trials ("Plain reuses three main-evaluation repetitions for [...] Code Executor P1")."""
    if not plain:
        raise MemtocError("no Plain run: give one per model")
    plain_main = plain_main or {}
    policies: list[str] = []
    for model in plain:
        if model not in arms or not arms[model]:
            raise MemtocError(f"model {model!r} has a Plain run but no policy run")
        for pol in arms[model]:
            if pol == PLAIN:
                raise MemtocError("the Plain run is the reference; give it as --plain, not as an arm")
            if pol not in policies:
                policies.append(pol)
    extra = sorted(set(arms) - set(plain))
    if extra:
        raise MemtocError(f"model {extra[0]!r} has policy runs but no Plain run")
    ref: dict[str, list[Trial]] = {}
    for model, trials in plain.items():
        main = plain_main.get(model)
        if main is None:
            ref[model] = list(trials)
        else:
            ref[model] = [t for t in trials if t.condition != "P1"] + [t for t in main if t.condition == "P1"
                                                                    and t.policy == PLAIN]
    rows: list[dict[str, Any]] = []
    for model in plain:
        for policy in policies:
            if policy not in arms[model]:
                continue
            for metric, cond in POLICY_METRICS:
                a, b = per_item(ref[model], metric, cond), per_item(arms[model][policy], metric, cond)
                items = sorted(set(a) & set(b))
                res = paired_difference([a[i] for i in items], [b[i] for i in items], items, n_boot=n_boot,
                                        n_perm=n_perm, alpha=alpha, seed=seed)
                n = len(items)
                rows.append({"model": model, "policy": policy, "metric": metric, "condition": cond, "n_items": n,
                             "value_plain": sum(a[i] for i in items) / n if n else None,
                             "value_policy": sum(b[i] for i in items) / n if n else None,
                             "plain_p1_from": "main run" if model in plain_main else "Plain run",
                             "delta": res.delta, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value,
                             "family": "overreliance-policy", "p_holm": None})
    if len(plain) >= 2:
        for policy in policies:
            for metric, cond in POLICY_METRICS:
                per = {m: (per_item(ref[m], metric, cond), per_item(arms[m][policy], metric, cond))
                       for m in plain if policy in arms[m]}
                res = pooled_paired_difference(per, n_boot=n_boot, n_perm=n_perm, alpha=alpha, seed=seed)
                mv = [r for r in rows if r["policy"] == policy and r["metric"] == metric and r["n_items"]]
                rows.append({"model": "pooled", "policy": policy, "metric": metric, "condition": cond,
                             "n_items": res.n_clusters, "n_models": len(per),
                             "value_plain": float(np.mean([r["value_plain"] for r in mv])) if mv else None,
                             "value_policy": float(np.mean([r["value_policy"] for r in mv])) if mv else None,
                             "delta": res.delta, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value,
                             "family": "overreliance-policy", "p_holm": None})
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
    for row in rows:
        row["family_members"], row["family_size"] = len(rows), FAMILY_SIZE
        for k in ("delta", "ci_low", "ci_high", "p", "p_holm"):
            if isinstance(row[k], float) and math.isnan(row[k]):
                row[k] = None
    return rows

