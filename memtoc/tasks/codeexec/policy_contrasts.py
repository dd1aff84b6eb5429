"""The overreliance paper's prompt-policy contrasts (seed 002 L117-L119): each policy arm (Compare, Verify,
Disclose) against Plain, paired by problem, with Holm inside the tool's family.

The paper: "Prompt and metadata contrasts use 10,000 resamples and 20,000 permutations with fixed seeds (20260918
for prompts)"; "Holm adjustment covers [...] 42 contrasts per tool for prompts"; "Only items eligible under both
conditions enter the [...] prompt [...] contrasts"; "Plain uses the per-item mean of its eligible repetitions";
"Compare and Verify significantly lower the pooled P1 adoption rate in every tool"; "Compare significantly lowers
P0 accuracy in Search and Sub-Agent".

Our reading of the 42: 3 policies x 2 metrics (P1 adoption, P0 accuracy) x 7 (the pooled estimate and six
models). One model's run gives 3 x 2 = 6 members; the family is whatever the rows of one call hold.
Per item, each arm's value is the mean over its eligible repetitions (adoption: the P1 runs, ``adopted`` not
None; accuracy: the P0 runs); the contrast is the paired policy - Plain difference on the items eligible in both
(:func:`memtoc.scoring.stats.paired_difference`: cluster bootstrap, then sign flips, one ``default_rng(seed)``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.scoring.stats import holm, paired_difference
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


def policy_contrasts(plain: Sequence[Trial], arms: Mapping[str, Sequence[Trial]], *, n_boot: int, n_perm: int,
                     seed: int, alpha: float = 0.05, family: str = "overreliance-policy") -> list[dict[str, Any]]:
    """One row per policy arm x (metric, condition): the paired policy - Plain change, its interval, p and Holm p
    (Holm over every row of this call: the family of one tool)."""
    if not arms:
        raise MemtocError("no policy arm to contrast with Plain (give Verify=RUN, Compare=RUN, ...)")
    rows: list[dict[str, Any]] = []
    for policy, trials in arms.items():
        if policy == PLAIN:
            raise MemtocError("the Plain run is the reference; give it as --plain, not as an arm")
        for metric, cond in POLICY_METRICS:
            a, b = per_item(plain, metric, cond), per_item(trials, metric, cond)
            items = sorted(set(a) & set(b))
            res = paired_difference([a[i] for i in items], [b[i] for i in items], items, n_boot=n_boot,
                                    n_perm=n_perm, alpha=alpha, seed=seed)
            n = len(items)
            rows.append({"policy": policy, "metric": metric, "condition": cond, "n_items": n,
                         "value_plain": sum(a[i] for i in items) / n if n else None,
                         "value_policy": sum(b[i] for i in items) / n if n else None,
                         "delta": res.delta, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value,
                         "family": family, "p_holm": None})
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
    for row in rows:
        for k in ("delta", "ci_low", "ci_high", "p", "p_holm"):
            if isinstance(row[k], float) and math.isnan(row[k]):
                row[k] = None
    return rows
