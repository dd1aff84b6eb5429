"""MemToC metrics: per-formulation rates, the pooled (unweighted) value, and paired comparisons of two arms.

Input is scored episode records: plain dicts, one JSON line of a run's ``episodes.jsonl`` each. The keys used are
``question_id``, ``formulation``, ``condition``, ``divergence_bucket``, ``cell``, ``outcome``, ``followed_tool``,
``kept_memory``, ``final_correct``, ``abstain``, ``ack_proxy`` and ``trivial_hop``. A record is only asked for
the keys the metric it enters needs. A missing key raises :class:`~memtoc.core.errors.BenchmarkDataError`, which
names the record (1-based position) and the key.

The metric definitions are one declarative table, :data:`METRICS` (scoring.md sections 5 and 9). A record
enters a metric when it matches one of the metric's :class:`Selector` (condition, cells, divergence bucket).
Its value is the metric's field, either as a bool or compared with a given value. Rates are k / n with no
smoothing. A ``tool_wrong`` record whose ``divergence_bucket`` is null counts as ``near``.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.scoring.stats import (
    CriterionVerdict,
    Interval,
    PairedResult,
    asymmetric_criterion,
    bootstrap_ci,
    holm,
    paired_difference,
    pooled_cluster_bootstrap_ci,
)
from memtoc.core.fileio import json_ready
from memtoc.core.vocab import CELLS, CONDITIONS, CONFLICT_CONDITION, FORMULATIONS

__all__ = [
    "CONDITIONS",
    "FORMULATIONS",
    "CELLS",
    "Selector",
    "MetricDef",
    "METRICS",
    "METRIC_NAMES",
    "COMPARISON_METRICS",
    "CONTROL_METRICS",
    "get_metric",
    "added_metrics",
    "default_metrics",
    "register_metric",
    "unregister_metric",
    "MetricCell",
    "PooledValue",
    "MetricRow",
    "MetricTable",
    "metric_table",
    "metric_units",
    "cell_counts",
    "MetricComparison",
    "ArmComparison",
    "paired_metric_comparison",
    "compare_arms",
]


# ---------------------------------------------------------------------------------------------------------
# record access

def _get(rec: Mapping[str, Any], key: str, row: int | None) -> Any:
    try:
        return rec[key]
    except (KeyError, TypeError):
        raise BenchmarkDataError("scored episode record lacks a key the metrics need", row=row,
                                 field=key) from None


def _bucket(rec: Mapping[str, Any], row: int | None) -> str | None:
    """The record's divergence bucket. For tool_wrong a null bucket means ``near``. Other conditions give None."""
    if rec.get("condition") != CONFLICT_CONDITION:
        return None
    b = _get(rec, "divergence_bucket", row)
    return "near" if b is None else str(b)


# ---------------------------------------------------------------------------------------------------------
# declarative definitions

@dataclass(frozen=True)
class Selector:
    """Which records enter a metric: one condition, optionally some cells and a divergence bucket.

    ``cells=None`` takes every record of the condition, whatever its cell (``mem_absent`` and null included).
    ``bucket`` is only checked for tool_wrong records: ``"near"`` (a null bucket counts as near) or ``"far"``.
    """

    condition: str
    cells: tuple[str, ...] | None = None
    bucket: str | None = None

    def matches(self, rec: Mapping[str, Any], row: int | None = None) -> bool:
        if _get(rec, "condition", row) != self.condition:
            return False
        if self.bucket is not None and _bucket(rec, row) != self.bucket:
            return False
        if self.cells is not None and _get(rec, "cell", row) not in self.cells:
            return False
        return True

    def describe(self) -> str:
        s = self.condition
        if self.bucket is not None:
            s += f"[{self.bucket}]"
        s += " ∩ " + ("/".join(self.cells) if self.cells is not None else "all cells")
        return s


@dataclass(frozen=True)
class MetricDef:
    """One metric: the records it counts (``selectors``, a union) and what counts as a success on each.

    The value of a record is ``bool(rec[field])`` when ``equals`` is None, otherwise ``rec[field] == equals``.
    ``exclude_trivial`` drops records whose ``trivial_hop`` is true (the Q- variant).
    """

    name: str
    label: str
    selectors: tuple[Selector, ...]
    field: str
    equals: Any = None
    exclude_trivial: bool = False
    description: str = ""
    #: only records whose ``outcome`` is one of these (None: any outcome); the decided-only readings
    outcomes: tuple[str, ...] | None = None

    def qualifies(self, rec: Mapping[str, Any], row: int | None = None) -> bool:
        if not any(s.matches(rec, row) for s in self.selectors):
            return False
        if self.exclude_trivial and bool(_get(rec, "trivial_hop", row)):
            return False
        if self.outcomes is not None and _get(rec, "outcome", row) not in self.outcomes:
            return False
        return True

    def value(self, rec: Mapping[str, Any], row: int | None = None) -> bool:
        v = _get(rec, self.field, row)
        return bool(v) if self.equals is None else v == self.equals

    @property
    def records_text(self) -> str:
        s = " + ".join(sel.describe() for sel in self.selectors)
        return s + (", minus trivial hops" if self.exclude_trivial else "")

    @property
    def numerator_text(self) -> str:
        return self.field if self.equals is None else f"{self.field} == {self.equals!r}"


_NEAR_ARB = (Selector("tool_wrong", ("arb",), "near"),)
_NEAR_BW = (Selector("tool_wrong", ("both_wrong",), "near"),)
_RIGHT_GOLD = (Selector("tool_right", ("tool_gold",)),)

# Control arms (memtoc.bench.controls): the tool-error payload variants beside the released one (paper section 6:
# abstention over all records; fall-back to the closed-book answer on arb; abstention on both_wrong), and the
# NoopTool interface control with the no_tool accuracy it is read against.
_ERROR_PAYLOADS = (("tool_error", "", "service unavailable"), ("tool_error_timeout", "_timeout", "timeout"),
                   ("tool_error_permission", "_permission", "permission denied"))
CONTROL_METRICS: tuple[MetricDef, ...] = tuple(
    m for cond, suffix, name in _ERROR_PAYLOADS for m in (
        *((MetricDef(f"tool_error_abstention{suffix}", f"Err. {name}", (Selector(cond),), "abstain",
                     description=f"tool-error abstention under the {name} payload: abstain over ALL {cond} "
                                 "records"),) if suffix else ()),
        MetricDef(f"tool_error_fallback{suffix}", f"Err. fall-back {name}", (Selector(cond, ("arb",)),),
                  "kept_memory", description=f"fall-back to the (correct) closed-book answer after the {name} "
                                             f"payload: kept_memory on {cond} ∩ arb"),
        MetricDef(f"tool_error_bw_abstention{suffix}", f"Err. abst. bw {name}", (Selector(cond, ("both_wrong",)),),
                  "abstain", description=f"abstention when memory is wrong, after the {name} payload: abstain on "
                                         f"{cond} ∩ both_wrong"),
    )) + (
    MetricDef("noop_retention", "Noop ret.", (Selector("noop_tool", ("arb",)),), "kept_memory",
              description="NoopTool interface control: kept_memory on noop_tool ∩ arb (a return without a "
                          "factual value; does the tool frame alone move a correct closed-book answer?)"),
    MetricDef("noop_accuracy", "Noop acc.", (Selector("noop_tool"),), "final_correct",
              description="NoopTool interface control: final answer correct over ALL noop_tool records"),
    MetricDef("noop_abstention", "Noop abst.", (Selector("noop_tool"),), "abstain",
              description="NoopTool interface control: abstain over ALL noop_tool records"),
    MetricDef("no_tool_accuracy", "No-tool acc.", (Selector("no_tool"),), "final_correct",
              description="final answer correct over ALL no_tool records (the reference of the NoopTool control)"),
)

METRICS: tuple[MetricDef, ...] = (
    MetricDef("retention", "Ret.", _NEAR_ARB, "outcome", "kept_memory",
              description="retention: the answer keeps the closed-book answer and does not match the wrong tool "
                          "value (outcome kept_memory; 'both' does not count), on tool_wrong (near) ∩ arb"),
    MetricDef("retention_qminus", "Ret. Q-", _NEAR_ARB, "outcome", "kept_memory", exclude_trivial=True,
              description="retention on Q-: as retention, without trivial hops (gold answer inside the question)"),
    MetricDef("keep_flag", "keep flag", _NEAR_ARB, "kept_memory",
              description="kept_memory flag on tool_wrong (near) ∩ arb; counts 'both' too (older field, not reported)"),
    MetricDef("cra_arb", "CRA arb", _NEAR_ARB, "final_correct",
              description="final answer correct on tool_wrong (near) ∩ arb"),
    MetricDef("correct_tool_following", "Tool", _RIGHT_GOLD, "followed_tool",
              description="correct-tool following: answer matches the (correct) tool value on tool_right ∩ tool_gold"),
    MetricDef("incorrect_tool_following", "Wrong", _NEAR_BW, "followed_tool",
              description="incorrect-tool following: answer matches the wrong tool value on tool_wrong (near) ∩ "
                          "both_wrong"),
    MetricDef("bw_gold", "BW gold", _NEAR_BW, "final_correct",
              description="answer correct although neither side was, on tool_wrong (near) ∩ both_wrong"),
    MetricDef("no_conflict_accuracy", "NC acc.", (Selector("no_conflict", ("tool_gold",)),), "final_correct",
              description="no-conflict accuracy: final answer correct on no_conflict ∩ tool_gold"),
    MetricDef("tool_error_abstention", "Err.", (Selector("tool_error"),), "abstain",
              description="tool-error abstention: abstain over ALL tool_error records (any cell, mem_absent included)"),
    MetricDef("conflict_resolved_accuracy", "CRA conflict",
              _NEAR_ARB + _RIGHT_GOLD, "final_correct",
              description="final answer correct over tool_wrong (near) ∩ arb plus tool_right ∩ tool_gold "
                          "(both_wrong excluded: gold unreachable)"),
    MetricDef("agreement_accuracy", "Agree acc.", (Selector("tool_right", ("agree",)),), "final_correct",
              description="final answer correct on tool_right ∩ agree (memory and tool both right)"),
    MetricDef("abstention_rate_tool_right", "Abst. right", (Selector("tool_right"),), "abstain",
              description="abstain over all tool_right records"),
    MetricDef("abstention_rate_tool_wrong", "Abst. wrong", (Selector("tool_wrong", None, "near"),), "abstain",
              description="abstain over all tool_wrong (near) records"),
    MetricDef("abstention_rate_no_tool", "Abst. no tool", (Selector("no_tool"),), "abstain",
              description="abstain over all no_tool records"),
    MetricDef("ack_proxy", "CAR proxy", (Selector("tool_wrong", ("arb", "both_wrong"), "near"),), "ack_proxy",
              description="coarse acknowledgment proxy (followed_tool and kept_memory) on tool_wrong (near) ∩ "
                          "arb/both_wrong"),
    MetricDef("retention_far", "Ret. far", (Selector("tool_wrong", ("arb",), "far"),), "outcome", "kept_memory",
              description="retention with far distractors: outcome kept_memory on tool_wrong (far) ∩ arb"),
    MetricDef("incorrect_tool_following_far", "Wrong far", (Selector("tool_wrong", ("both_wrong",), "far"),),
              "followed_tool",
              description="incorrect-tool following with far distractors: followed_tool on tool_wrong (far) ∩ "
                          "both_wrong"),
    *CONTROL_METRICS,
)

#: Readings asked for by name (memtoc study --metrics, compare): not in every run's metric table.
READING_METRICS: tuple[MetricDef, ...] = (
    MetricDef("cra_arb_decided", "Y (decided)", _NEAR_ARB, "final_correct", outcomes=("kept_memory", "followed_tool"),
              description="decided-only accuracy Y (App. E, the switch compositions): final answer correct on "
                          "tool_wrong (near) ∩ arb among the answers that took a side (kept memory or followed the "
                          "tool; 'both' and 'neither' are left out)"),
)

METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in METRICS)
_BY_NAME = {m.name: m for m in (*METRICS, *READING_METRICS)}
#: Metrics that registered conditions add (memtoc.bench.conditions): after METRICS in every default table.
_ADDED: dict[str, MetricDef] = {}
#: The package whose import registers every condition and the metrics they add. Named, not imported: the
#: conditions sit above the scorer (they build payloads from questions), so it is loaded on first use, as
#: memtoc.core.tasks loads the task modules.
_CONDITIONS_PACKAGE = "memtoc.bench.conditions"


def _load_conditions() -> None:
    if _CONDITIONS_PACKAGE not in sys.modules:
        importlib.import_module(_CONDITIONS_PACKAGE)


def register_metric(m: MetricDef) -> MetricDef:
    """Add a condition's metric to the default table and to :func:`get_metric`; a name clash is refused."""
    old = _BY_NAME.get(m.name)
    if old is not None and old != m:
        raise ValueError(f"metric {m.name!r} is already defined")
    _BY_NAME[m.name] = _ADDED[m.name] = m
    return m


def unregister_metric(name: str) -> None:
    """Remove an added metric again (a built-in one stays)."""
    if _ADDED.pop(name, None) is not None:
        del _BY_NAME[name]


def added_metrics() -> tuple[MetricDef, ...]:
    """The metrics registered conditions add, in registration order."""
    _load_conditions()
    return tuple(_ADDED.values())


def default_metrics() -> tuple[MetricDef, ...]:
    """The rows of a default metric table: :data:`METRICS`, then the metrics registered conditions add."""
    return (*METRICS, *added_metrics())

#: Default metrics of a paired arm comparison: the release's primary (retention) and secondary readings.
COMPARISON_METRICS: tuple[str, ...] = ("retention", "correct_tool_following", "incorrect_tool_following",
                                       "tool_error_abstention", "no_conflict_accuracy", "cra_arb")


def get_metric(metric: str | MetricDef) -> MetricDef:
    """Look up a metric by name (a :class:`MetricDef` is passed through)."""
    if isinstance(metric, MetricDef):
        return metric
    if metric not in _BY_NAME:
        _load_conditions()
    try:
        return _BY_NAME[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(_BY_NAME)}") from None


def _order_formulations(found: Iterable[str]) -> tuple[str, ...]:
    found = set(found)
    known = [f for f in FORMULATIONS if f in found]
    return tuple(known + sorted(found - set(FORMULATIONS)))


def _f(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------------------
# single-run table

@dataclass(frozen=True)
class MetricCell:
    """One metric on one formulation: value = k / n (NaN when n = 0) and its cluster-bootstrap interval."""

    value: float
    k: int
    n: int
    ci: Interval

    def to_dict(self) -> dict:
        return json_ready({"value": self.value, "k": self.k, "n": self.n, "ci_low": self.ci.low,
                       "ci_high": self.ci.high})


@dataclass(frozen=True)
class PooledValue:
    """Unweighted mean of the per-formulation values over the formulations with n > 0."""

    value: float
    ci: Interval
    per_formulation: dict[str, float]
    n_per_formulation: dict[str, int]
    formulations_used: tuple[str, ...]
    min: float
    max: float

    @property
    def spread(self) -> float:
        return self.max - self.min

    def to_dict(self) -> dict:
        return json_ready({"value": self.value, "ci_low": self.ci.low, "ci_high": self.ci.high,
                       "per_formulation": dict(self.per_formulation),
                       "n_per_formulation": dict(self.n_per_formulation),
                       "formulations_used": list(self.formulations_used), "min": self.min, "max": self.max,
                       "spread": self.spread})


@dataclass(frozen=True)
class MetricRow:
    metric: MetricDef
    per_formulation: dict[str, MetricCell]
    pooled: PooledValue

    def to_dict(self) -> dict:
        return {"label": self.metric.label, "description": self.metric.description,
                "records": self.metric.records_text, "numerator": self.metric.numerator_text,
                "per_formulation": {f: c.to_dict() for f, c in self.per_formulation.items()},
                "pooled": self.pooled.to_dict()}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}" if _f(x) else "nan"


def align_rows(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as aligned plain text, the first row a header underlined with dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class MetricTable:
    """Every metric per formulation plus the pooled value. Made by :func:`metric_table`."""

    formulations: tuple[str, ...]
    rows: tuple[MetricRow, ...]
    n_records: int
    n_boot: int
    alpha: float
    seed: int

    def __getitem__(self, name: str) -> MetricRow:
        return {r.metric.name: r for r in self.rows}[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.metric.name for r in self.rows)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (NaN becomes None)."""
        return json_ready({
            "formulations": list(self.formulations),
            "n_records": self.n_records,
            "bootstrap": {"n_boot": self.n_boot, "alpha": self.alpha, "seed": self.seed,
                          "per_formulation": "cluster percentile bootstrap, clusters = question_id",
                          "pooled": "unweighted mean over formulations with n > 0; interval from a joint "
                                    "question-cluster bootstrap across formulations"},
            "metrics": {r.metric.name: r.to_dict() for r in self.rows},
        })

    def format_text(self) -> str:
        """An aligned plain-text table: one row per metric, one column per formulation plus the pooled value."""
        head = ["metric", "label", *self.formulations, "pooled (unweighted mean)"]
        rows = [head]
        for r in self.rows:
            line = [r.metric.name, r.metric.label]
            for f in self.formulations:
                c = r.per_formulation[f]
                if c.n == 0:
                    line.append("- n=0")
                else:
                    line.append(f"{_pct(c.value)}% [{_pct(c.ci.low)}, {_pct(c.ci.high)}] n={c.n}")
            p = r.pooled
            if not p.formulations_used:
                line.append("-")
            else:
                line.append(f"{_pct(p.value)}% [{_pct(p.ci.low)}, {_pct(p.ci.high)}] "
                            f"range {_pct(p.min)}-{_pct(p.max)} ({len(p.formulations_used)} form.)")
            rows.append(line)
        pct = round(100 * (1 - self.alpha))
        title = (f"MemToC metrics ({self.n_records} records): value % [{pct}% CI, bootstrap over questions, "
                 f"{self.n_boot} draws, seed {self.seed}] n")
        foot = ("pooled = unweighted mean of the per-formulation rates (formulations with n > 0); its interval "
                "resamples questions jointly across formulations.")
        return title + "\n" + align_rows(rows) + "\n" + foot


def metric_table(records: Iterable[Mapping[str, Any]], *, metrics: Sequence[str | MetricDef] | None = None,
                 n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> MetricTable:
    """Compute every metric per formulation and pooled over formulations.

    Per formulation: value = k / n, with a percentile cluster-bootstrap interval (clusters = question_id, a fresh
    ``default_rng(seed)`` per cell). Pooled: the UNWEIGHTED mean of the per-formulation values where n > 0, with
    an interval that resamples QUESTIONS jointly across formulations: more conservative than the release, which
    resamples each formulation separately (scoring.md section 10), because the three formulations ask the same
    questions, so their rates are positively correlated and independent resampling would be too narrow.

    Records are counted as given; duplicates are not removed. ``metrics`` None: :func:`default_metrics`.
    """
    mdefs = [get_metric(m) for m in (default_metrics() if metrics is None else metrics)]
    recs = list(records)
    # metric -> formulation -> (values, question ids) of the qualifying records
    data: dict[str, dict[str, tuple[list, list]]] = {m.name: {} for m in mdefs}
    found = []
    for row, rec in enumerate(recs, start=1):
        f, q = _get(rec, "formulation", row), _get(rec, "question_id", row)
        _get(rec, "condition", row)
        found.append(f)
        for m in mdefs:
            if m.qualifies(rec, row):
                vals, qs = data[m.name].setdefault(f, ([], []))
                vals.append(m.value(rec, row))
                qs.append(q)
    forms = _order_formulations(found)
    rows = []
    for m in mdefs:
        per: dict[str, MetricCell] = {}
        groups = []
        for f in forms:
            vals, qs = data[m.name].get(f, ([], []))
            n, k = len(vals), sum(bool(v) for v in vals)
            if n:
                ci = bootstrap_ci(vals, qs, n_boot=n_boot, alpha=alpha, seed=seed)
                groups.append((vals, qs))
            else:
                ci = Interval(float("nan"), float("nan"))
            per[f] = MetricCell(value=k / n if n else float("nan"), k=k, n=n, ci=ci)
        used = tuple(f for f in forms if per[f].n > 0)
        vals_used = [per[f].value for f in used]
        pooled = PooledValue(
            value=sum(vals_used) / len(vals_used) if used else float("nan"),
            ci=pooled_cluster_bootstrap_ci(groups, n_boot=n_boot, alpha=alpha, seed=seed),
            per_formulation={f: per[f].value for f in forms},
            n_per_formulation={f: per[f].n for f in forms},
            formulations_used=used,
            min=min(vals_used) if used else float("nan"),
            max=max(vals_used) if used else float("nan"),
        )
        rows.append(MetricRow(metric=m, per_formulation=per, pooled=pooled))
    return MetricTable(formulations=forms, rows=tuple(rows), n_records=len(recs), n_boot=n_boot, alpha=alpha,
                       seed=seed)


def cell_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many records sit in each cell (:data:`CELLS`, in that order; ``no_tool`` records have none): the
    support every cell-selected metric is read on."""
    counts = dict.fromkeys(CELLS, 0)
    for row, rec in enumerate(records, start=1):
        cell = _get(rec, "cell", row)
        if cell is not None:
            if cell not in counts:
                raise BenchmarkDataError(f"unknown cell {cell!r}; expected one of {', '.join(CELLS)}", row=row,
                                         field="cell")
            counts[cell] += 1
    return counts


# ---------------------------------------------------------------------------------------------------------
# paired comparison of two arms

def metric_units(records: Iterable[Mapping[str, Any]], metric: str | MetricDef, *,
                 formulations: Sequence[str] | None = None) -> dict[tuple, bool]:
    """The metric's support in one arm: unit -> 0/1 value.

    A unit is (question_id, formulation, condition, divergence bucket). For every single-condition metric
    this is one unit per (question_id, formulation). Two records with the same unit raise
    :class:`~memtoc.core.errors.RunStoreError`.
    """
    m = get_metric(metric)
    out: dict[tuple, bool] = {}
    for row, rec in enumerate(records, start=1):
        f = _get(rec, "formulation", row)
        if formulations is not None and f not in formulations:
            continue
        if not m.qualifies(rec, row):
            continue
        key = (_get(rec, "question_id", row), f, rec["condition"], _bucket(rec, row))
        if key in out:
            raise RunStoreError(f"record {row}: duplicate episode {key} in the support of metric {m.name!r}")
        out[key] = m.value(rec, row)
    return out


@dataclass(frozen=True)
class MetricComparison:
    """Paired contrast b - a of one metric on the units both arms support (same question, formulation, cell).

    A gap between ``support_a``/``support_b`` and ``n_common`` is support drift (cells that differ between the
    arms); ``value_a``/``value_b`` are the rates on the common units; ``p_adjusted`` is None outside the Holm family.
    """

    metric: MetricDef
    support_a: int
    support_b: int
    n_common: int
    value_a: float
    value_b: float
    result: PairedResult
    p_adjusted: float | None
    in_family: bool

    def to_dict(self) -> dict:
        return json_ready({"metric": self.metric.name, "label": self.metric.label, "support_a": self.support_a,
                       "support_b": self.support_b, "n_common": self.n_common, "value_a": self.value_a,
                       "value_b": self.value_b, **self.result.to_dict(), "p_adjusted": self.p_adjusted,
                       "in_holm_family": self.in_family})


def paired_metric_comparison(records_a: Iterable[Mapping[str, Any]], records_b: Iterable[Mapping[str, Any]],
                             metrics: Sequence[str | MetricDef] = COMPARISON_METRICS, *,
                             holm_family: Sequence[str] | None = None,
                             formulations: Sequence[str] | None = None, n_boot: int = 1000,
                             n_perm: int = 10000, alpha: float = 0.05, seed: int = 0) -> list[MetricComparison]:
    """Compare arm b with arm a (e.g. treated vs baseline), one paired contrast per metric.

    The units of a metric are those in BOTH arms' support (the same question and formulation sits in the
    metric's cell in both), clustered by question, all formulations pooled (or those named in ``formulations``):
    :func:`memtoc.scoring.stats.paired_difference` with a fresh ``default_rng(seed)`` per metric. Holm runs over
    every metric received, or only those named in ``holm_family``; others get ``p_adjusted=None``.
    """
    recs_a, recs_b = list(records_a), list(records_b)
    mdefs = [get_metric(m) for m in metrics]
    family = {m.name for m in mdefs} if holm_family is None else {get_metric(m).name for m in holm_family}
    partial = []
    for m in mdefs:
        ua = metric_units(recs_a, m, formulations=formulations)
        ub = metric_units(recs_b, m, formulations=formulations)
        common = sorted(set(ua) & set(ub), key=repr)
        va = [float(ua[u]) for u in common]
        vb = [float(ub[u]) for u in common]
        res = paired_difference(va, vb, [u[0] for u in common], n_boot=n_boot, n_perm=n_perm, alpha=alpha,
                                seed=seed)
        n = len(common)
        partial.append((m, len(ua), len(ub), n, sum(va) / n if n else float("nan"),
                        sum(vb) / n if n else float("nan"), res))
    fam_idx = [i for i, p in enumerate(partial) if p[0].name in family]
    adjusted = holm([partial[i][6].p_value for i in fam_idx])
    adj = dict(zip(fam_idx, adjusted))
    return [MetricComparison(metric=m, support_a=sa, support_b=sb, n_common=n, value_a=a, value_b=b, result=r,
                             p_adjusted=adj.get(i), in_family=i in adj)
            for i, (m, sa, sb, n, a, b, r) in enumerate(partial)]


@dataclass(frozen=True)
class ArmComparison:
    """Paired comparisons of arm b against arm a plus the asymmetric-criterion verdict."""

    comparisons: tuple[MetricComparison, ...]
    verdict: CriterionVerdict
    alpha: float
    label_a: str = "a"
    label_b: str = "b"
    n_boot: int = 1000
    n_perm: int = 10000
    seed: int = 0

    def __getitem__(self, name: str) -> MetricComparison:
        return {c.metric.name: c for c in self.comparisons}[name]

    def to_dict(self) -> dict:
        return json_ready({"arm_a": self.label_a, "arm_b": self.label_b, "alpha": self.alpha,
                       "n_boot": self.n_boot, "n_perm": self.n_perm, "seed": self.seed,
                       "delta": "b - a on common support",
                       "comparisons": {c.metric.name: c.to_dict() for c in self.comparisons},
                       "verdict": self.verdict.to_dict()})

    def format_text(self) -> str:
        """An aligned plain-text table of the comparisons, with the verdict underneath."""
        a, b = self.label_a, self.label_b
        rows = [["metric", "label", f"support {a}/{b}/common", f"{a} %", f"{b} %", "delta pp [CI]", "p", "p Holm"]]
        for c in self.comparisons:
            r = c.result
            if c.n_common == 0:
                delta = "-"
                p = "-"
            else:
                delta = f"{100 * r.delta:+.1f} [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}]"
                p = f"{r.p_value:.4g}"
            padj = "-" if c.p_adjusted is None or not _f(c.p_adjusted) else f"{c.p_adjusted:.4g}"
            rows.append([c.metric.name, c.metric.label, f"{c.support_a}/{c.support_b}/{c.n_common}",
                         _pct(c.value_a), _pct(c.value_b), delta, p, padj])
        title = (f"Paired comparison {b} - {a} on common support (cluster = question; bootstrap "
                 f"{self.n_boot}, sign-flip {self.n_perm}, seed {self.seed})")
        return title + "\n" + align_rows(rows) + "\nverdict: " + self.verdict.reason


def compare_arms(records_a: Iterable[Mapping[str, Any]], records_b: Iterable[Mapping[str, Any]], *,
                 metrics: Sequence[str | MetricDef] = COMPARISON_METRICS,
                 holm_family: Sequence[str] | None = None, formulations: Sequence[str] | None = None,
                 alpha: float = 0.05, n_boot: int = 1000, n_perm: int = 10000, seed: int = 0,
                 label_a: str = "a", label_b: str = "b") -> ArmComparison:
    """Paired comparison of arm b (treated) against arm a (baseline) and the asymmetric success criterion.

    ``retention`` and ``correct_tool_following`` are always compared; they are added in front of ``metrics``
    if missing. The verdict uses the Holm-adjusted retention p when retention is in the Holm family, and the
    raw p of correct-tool following (see :func:`memtoc.scoring.stats.asymmetric_criterion`).
    """
    mdefs = [get_metric(m) for m in metrics]
    for needed in ("correct_tool_following", "retention"):
        if needed not in {m.name for m in mdefs}:
            mdefs.insert(0, get_metric(needed))
    comps = paired_metric_comparison(records_a, records_b, mdefs, holm_family=holm_family,
                                     formulations=formulations, n_boot=n_boot, n_perm=n_perm, alpha=alpha,
                                     seed=seed)
    by = {c.metric.name: c for c in comps}
    ret, tool = by["retention"], by["correct_tool_following"]
    verdict = asymmetric_criterion(ret.result, tool.result, alpha,
                                   retention_p_adjusted=ret.p_adjusted if ret.in_family else None)
    return ArmComparison(comparisons=tuple(comps), verdict=verdict, alpha=alpha, label_a=label_a,
                         label_b=label_b, n_boot=n_boot, n_perm=n_perm, seed=seed)

