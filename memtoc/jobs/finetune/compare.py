"""Paired comparisons of a treated arm with the base model on the same support.

Fine-tuning changes the model's closed-book answers, so it moves questions between cells (a question is in
``arb`` because of the arm's OWN parametric answer). Comparing rates over each arm's own cells would compare
different questions. Here both record sets are first restricted to the (question_id, formulation) units
whose cell is the same under both checkpoints — every condition's cell, which is the memory status seen
through each condition — and :func:`memtoc.scoring.metrics.compare_arms` runs on that intersection. How many units
changed cell (the support drift) is reported next to every change, and per metric how many units entered
(treated only) and left (base only) the metric's support before the restriction.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.vocab import CONFLICT_CONDITION
from memtoc.scoring.metrics import COMPARISON_METRICS, ArmComparison, compare_arms, metric_units

Unit = tuple[str, str]  # (question_id, formulation)


def unit_cells(records: Iterable[Mapping[str, Any]]) -> dict[Unit, dict[str, Any]]:
    """(question_id, formulation) -> {arm: cell} (``arm`` distinguishes the near and far tool_wrong episodes)."""
    out: dict[Unit, dict[str, Any]] = defaultdict(dict)
    for r in records:
        out[(str(r["question_id"]), str(r["formulation"]))][str(r.get("arm") or r["condition"])] = r.get("cell")
    return dict(out)


@dataclass(frozen=True)
class SupportDrift:
    """How the unit sets of the two arms relate before restriction."""

    n_units_base: int
    n_units_treated: int
    n_shared: int            # units present in both arms
    n_same_cell: int         # shared units whose cell agrees on every shared condition (the support kept)
    n_changed_cell: int      # shared units whose cell differs (the drift)
    transitions: dict[str, int]  # "base_cell->treated_cell" on the tool_wrong episode, for changed units

    def to_dict(self) -> dict[str, Any]:
        return {"n_units_base": self.n_units_base, "n_units_treated": self.n_units_treated,
                "n_shared": self.n_shared, "n_same_cell": self.n_same_cell, "n_changed_cell": self.n_changed_cell,
                "transitions": dict(self.transitions)}


def restrict_to_common_cells(base: Sequence[Mapping[str, Any]], treated: Sequence[Mapping[str, Any]]
                             ) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], SupportDrift]:
    """Both record sets restricted to the units whose cells agree, and the drift that restriction removed."""
    cb, ct = unit_cells(base), unit_cells(treated)
    shared = set(cb) & set(ct)
    keep: set[Unit] = set()
    transitions: dict[str, int] = defaultdict(int)
    for u in shared:
        arms = set(cb[u]) & set(ct[u])
        if all(cb[u][a] == ct[u][a] for a in arms):
            keep.add(u)
        else:
            a = CONFLICT_CONDITION if CONFLICT_CONDITION in arms else sorted(arms)[0]
            transitions[f"{cb[u].get(a)}->{ct[u].get(a)}"] += 1
    drift = SupportDrift(n_units_base=len(cb), n_units_treated=len(ct), n_shared=len(shared), n_same_cell=len(keep),
                         n_changed_cell=len(shared) - len(keep), transitions=dict(sorted(transitions.items())))

    def sel(recs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [r for r in recs if (str(r["question_id"]), str(r["formulation"])) in keep]

    return sel(base), sel(treated), drift


def metric_drift(base: Sequence[Mapping[str, Any]], treated: Sequence[Mapping[str, Any]],
                 metrics: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per metric, before restriction: units only the treated arm supports (entered) and only the base (left)."""
    out = {}
    shared_q = {str(r["question_id"]) for r in base} & {str(r["question_id"]) for r in treated}
    b = [r for r in base if str(r["question_id"]) in shared_q]
    t = [r for r in treated if str(r["question_id"]) in shared_q]
    for m in metrics:
        ub, ut = set(metric_units(b, m)), set(metric_units(t, m))
        out[m] = {"n_base": len(ub), "n_treated": len(ut), "n_treated_only": len(ut - ub),
                  "n_base_only": len(ub - ut)}
    return out


@dataclass(frozen=True)
class SupportComparison:
    """One arm against base: the paired comparison on cell-agreeing units and the drift around it."""

    label: str
    comparison: ArmComparison
    drift: SupportDrift
    metric_drift: dict[str, dict[str, int]]
    n_questions: int

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "n_questions": self.n_questions, "support_drift": self.drift.to_dict(),
                "metric_support_drift": self.metric_drift, **self.comparison.to_dict()}


def compare_on_common_support(base: Sequence[Mapping[str, Any]], treated: Sequence[Mapping[str, Any]], *,
                              label_base: str = "base", label: str = "treated",
                              metrics: Sequence[str] = COMPARISON_METRICS, seed: int = 0, n_boot: int = 1000,
                              n_perm: int = 10000, alpha: float = 0.05) -> SupportComparison:
    """:func:`compare_arms` (treated − base) on the units whose cell agrees, with the support drift."""
    rb, rt, drift = restrict_to_common_cells(base, treated)
    comp = compare_arms(rb, rt, metrics=metrics, seed=seed, n_boot=n_boot, n_perm=n_perm, alpha=alpha,
                        label_a=label_base, label_b=label)
    names = [c.metric.name for c in comp.comparisons]
    return SupportComparison(label=label, comparison=comp, drift=drift, metric_drift=metric_drift(base, treated, names),
                             n_questions=len({str(r["question_id"]) for r in rb}))


def merge_held_out(halves: Sequence[tuple[Sequence[Mapping[str, Any]], set[str]]]) -> list[Mapping[str, Any]]:
    """Union of the held-out records of each half: ``(records, held_out_question_ids)`` per adapter.

    Records of questions outside a half's held-out set are dropped (an evaluation may cover extra questions
    when a fold is sliced by position); a question held out by two halves is an error.
    """
    seen: dict[str, int] = {}
    out: list[Mapping[str, Any]] = []
    for i, (records, held_out) in enumerate(halves):
        for qid in held_out:
            if qid in seen:
                raise MemtocError(f"question {qid} is held out by halves {seen[qid]} and {i}: the folds overlap")
            seen[qid] = i
        out.extend(r for r in records if str(r["question_id"]) in held_out)
    missing = set(seen) - {str(r["question_id"]) for r in out}
    if missing:
        raise MemtocError(f"{len(missing)} held-out question(s) have no evaluated records, e.g. {sorted(missing)[0]}")
    return out
