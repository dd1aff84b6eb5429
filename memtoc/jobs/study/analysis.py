"""The tables of a study, each a list of flat rows (one dict per row, NaN as None) ready for CSV and Markdown.

Everything reuses :mod:`memtoc.scoring.stats` (sign-flip paired tests, Holm, the asymmetric criterion, the pooled
two-proportion z test) and the metric definitions of :mod:`memtoc.scoring.metrics`; ``docs/statistics.md`` says which
reading of the paper each table implements.

Slices: every formulation found in the runs, plus ``pooled`` (the units of all formulations together,
clustered by question, as in :func:`memtoc.scoring.metrics.paired_metric_comparison`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from memtoc.bench.conditions import get_condition
from memtoc.core.vocab import FAR_CONDITION
from memtoc.scoring.judge.layer import LAYERS
from memtoc.scoring.metrics import COMPARISON_METRICS, FORMULATIONS, get_metric, metric_units, paired_metric_comparison
from memtoc.scoring.stats import asymmetric_criterion, holm, paired_difference, two_proportion_z
from memtoc.core.fileio import json_ready
from memtoc.jobs.study.families import Families, StudyError, family_sizes, resolve_families
from memtoc.jobs.study.runs import BASE_LABEL, Contrast, StudyRun, is_scorer_metric, pair_contrasts

POOLED = "pooled"
#: metrics compared across models (z tests, stability rule): the four columns of the paper's tables
MODEL_METRICS: tuple[str, ...] = ("retention", "correct_tool_following", "incorrect_tool_following",
                                  "tool_error_abstention")
#: near metric -> far metric of the paired near-vs-far contrast (same run, same question)
NEAR_FAR: dict[str, str] = {"retention": "retention_far",
                            "incorrect_tool_following": "incorrect_tool_following_far"}
CRITERION_METRICS = ("retention", "correct_tool_following")
#: the metric a cross-model z test reads for a model metric: retention as the release's keepQ (retention without
#: trivial hops, the gold inside the question; upstream README: "keepQ all 10 pairs")
ZTEST_READS: dict[str, str] = {"retention": "retention_qminus"}


@dataclass(frozen=True)
class StudySettings:
    """What a study computes. ``family`` is a ``--holm-family`` value (see :mod:`memtoc.jobs.study.families`)."""

    family: str = "arm"
    metrics: tuple[str, ...] = COMPARISON_METRICS
    holm_metrics: tuple[str, ...] = ("retention",)
    model_metrics: tuple[str, ...] = MODEL_METRICS
    alpha: float = 0.05
    n_boot: int = 1000
    n_perm: int = 10000
    seed: int = 0
    #: the scoring layer every run is read in: ``judged`` is the paper's (App. B), ``deterministic`` the scorer's
    layer: str = "deterministic"
    #: cross-model paired contrasts ``A:B`` of base runs (display names), e.g. the pre-registered
    #: base-versus-instruction-tuned pair ``Llama-3.1-8B:Llama-3.1-8B-Instruct`` (App. B: pairwise common support)
    model_pairs: tuple[str, ...] = ()
    #: declared families that may be computed with members missing (a per-model run: "3 of 12")
    partial_families: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.layer not in LAYERS:
            raise StudyError(f"unknown layer {self.layer!r}; choose {' or '.join(LAYERS)}")
        for name in (*self.metrics, *self.holm_metrics, *self.model_metrics):
            try:
                get_metric(name)
            except ValueError as exc:
                raise StudyError(str(exc)) from None
        if not 0 < self.alpha < 1 or self.n_boot < 1 or self.n_perm < 1:
            raise StudyError(f"need 0 < alpha < 1 and positive draw counts, got alpha={self.alpha}, "
                             f"n_boot={self.n_boot}, n_perm={self.n_perm}")


@dataclass
class Study:
    settings: StudySettings
    runs: list[StudyRun]
    contrasts: list[Contrast]
    families: Families
    formulations: tuple[str, ...]
    paired: list[dict[str, Any]] = field(default_factory=list)
    criterion: list[dict[str, Any]] = field(default_factory=list)
    near_far: list[dict[str, Any]] = field(default_factory=list)
    controls: list[dict[str, Any]] = field(default_factory=list)
    ztests: list[dict[str, Any]] = field(default_factory=list)
    stability: list[dict[str, Any]] = field(default_factory=list)
    rankings: list[dict[str, Any]] = field(default_factory=list)
    model_pairs: list[dict[str, Any]] = field(default_factory=list)
    #: each declared family: members present vs declared (families.family_sizes)
    family_sizes: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def slices(self) -> tuple[str, ...]:
        return (*self.formulations, POOLED)

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"paired": self.paired, "criterion": self.criterion, "near_far": self.near_far,
                "controls": self.controls, "ztests": self.ztests, "stability": self.stability,
                "rankings": self.rankings, "model_pairs": self.model_pairs}

    def to_dict(self) -> dict[str, Any]:
        return json_ready({
            "settings": {**asdict(self.settings), "metrics": list(self.settings.metrics)},
            "layer": self.settings.layer,
            "runs": [{"label": r.label, "model": r.model, "model_name": r.model_name, "path": str(r.path),
                      "n_records": len(r.records), "layer": r.layer,
                      "judge": (r.judge or {}).get("model")} for r in self.runs],
            "contrasts": [{"name": c.name, "model": c.model, "arm": c.arm, "base": str(c.base_run.path),
                           "arm_run": str(c.arm_run.path)} for c in self.contrasts],
            "families": {k: list(v) for k, v in self.families.items()},
            "family_sizes": self.family_sizes,
            "formulations": list(self.formulations), "slices": list(self.slices),
            "tables": self.tables(),
        })


def _order_formulations(found: Iterable[str]) -> tuple[str, ...]:
    found = set(found)
    return tuple([f for f in FORMULATIONS if f in found] + sorted(found - set(FORMULATIONS)))


def _slice_filter(slice_name: str) -> list[str] | None:
    return None if slice_name == POOLED else [slice_name]


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


# ---------------------------------------------------------------------------------------------------------
# paired changes and Holm

def paired_rows(contrasts: Sequence[Contrast], slices: Sequence[str], settings: StudySettings,
                families: Families) -> list[dict[str, Any]]:
    """One row per contrast x slice x metric: the paired change on common support, its p and Holm p."""
    metrics = list(dict.fromkeys([*CRITERION_METRICS, *settings.metrics]))
    family_of = {m: name for name, members in families.items() for m in members}
    rows: list[dict[str, Any]] = []
    for c in contrasts:
        for s in slices:
            comps = []
            for group in (m for m in ([m for m in metrics if not is_scorer_metric(m)],
                                      [m for m in metrics if is_scorer_metric(m)]) if m):
                comps += paired_metric_comparison(c.base_run.records_for(group[0]), c.arm_run.records_for(group[0]),
                                                  group, holm_family=[], formulations=_slice_filter(s),
                                                  n_boot=settings.n_boot, n_perm=settings.n_perm,
                                                  alpha=settings.alpha, seed=settings.seed)
            comps.sort(key=lambda comp: metrics.index(comp.metric.name))
            for comp in comps:
                r = comp.result
                in_holm = comp.metric.name in settings.holm_metrics and c.name in family_of
                rows.append({
                    "contrast": c.name, "model": c.base_run.model_name, "arm": c.arm, "slice": s,
                    "metric": comp.metric.name, "support_base": comp.support_a, "support_arm": comp.support_b,
                    "n_common": comp.n_common, "n_clusters": r.n_clusters, "value_base": _num(comp.value_a),
                    "value_arm": _num(comp.value_b), "delta": _num(r.delta), "ci_low": _num(r.ci_low),
                    "ci_high": _num(r.ci_high), "p": _num(r.p_value),
                    "family": family_of.get(c.name) if in_holm else None, "p_holm": None,
                    "_result": r,
                })
    for members in families.values():
        member_set = set(members)
        for s in slices:
            for m in settings.holm_metrics:
                idx = [i for i, row in enumerate(rows) if row["contrast"] in member_set and row["slice"] == s
                       and row["metric"] == m]
                adjusted = holm([rows[i]["_result"].p_value for i in idx])
                for i, p in zip(idx, adjusted):
                    rows[i]["p_holm"] = _num(p)
    return rows


def criterion_rows(contrasts: Sequence[Contrast], slices: Sequence[str], paired: Sequence[Mapping[str, Any]],
                   alpha: float) -> list[dict[str, Any]]:
    """The asymmetric criterion per contrast and slice (the paper's Table 5 reads it per formulation and pooled).

    Retention uses its Holm-adjusted p when the contrast is in a Holm family of retention, otherwise the raw p;
    correct-tool following always uses the raw p (see :func:`memtoc.scoring.stats.asymmetric_criterion`). ``code`` is
    ``met``, or ``fail`` with ``k`` (retention gain not significant) and/or ``t`` (tool following falls
    significantly), the marks of Table 5.
    """
    by = {(r["contrast"], r["slice"], r["metric"]): r for r in paired}
    rows = []
    for c in contrasts:
        for s in slices:
            ret, tool = by[(c.name, s, "retention")], by[(c.name, s, "correct_tool_following")]
            adj = ret["p_holm"] if ret["family"] is not None else None
            v = asymmetric_criterion(ret["_result"], tool["_result"], alpha, retention_p_adjusted=adj)
            code = "met" if v.success else "fail" + ("k" if not v.retention_rises else "") + \
                ("t" if v.tool_following_falls else "")
            rows.append({"contrast": c.name, "model": c.base_run.model_name, "arm": c.arm, "slice": s,
                         "verdict": "met" if v.success else "fail", "code": code,
                         "retention_delta": _num(v.retention_delta), "retention_p": _num(v.retention_p),
                         "retention_p_is_holm": ret["family"] is not None,
                         "tool_following_delta": _num(v.tool_following_delta),
                         "tool_following_p": _num(v.tool_following_p), "n_retention": ret["n_common"],
                         "n_tool_following": tool["n_common"], "reason": v.reason})
    return rows


# ---------------------------------------------------------------------------------------------------------
# near vs far, within one run

def near_far_units(records: Sequence[Mapping[str, Any]], near_metric: str, far_metric: str,
                   formulations: Sequence[str] | None) -> tuple[list[float], list[float], list[Any]]:
    """Aligned (near, far, question) values on the (question, formulation) units that have both."""
    near = {(k[0], k[1]): v for k, v in metric_units(records, near_metric, formulations=formulations).items()}
    far = {(k[0], k[1]): v for k, v in metric_units(records, far_metric, formulations=formulations).items()}
    common = sorted(set(near) & set(far), key=repr)
    return [float(near[u]) for u in common], [float(far[u]) for u in common], [u[0] for u in common]


def near_far_rows(runs: Sequence[tuple[str, StudyRun]], slices: Sequence[str],
                  settings: StudySettings) -> list[dict[str, Any]]:
    """Paired far - near contrast per run, slice and metric, on the questions that have both distractors.

    Holm family: the runs sharing a label (the base runs of all models, or one arm across models), per metric
    and slice, as the paper's distractor-distance family spans the models.
    """
    rows: list[dict[str, Any]] = []
    far = get_condition(FAR_CONDITION)
    for label, run in runs:
        if not any(r.get("condition") == far.condition and r.get("divergence_bucket") == far.bucket
                   for r in run.records):
            continue
        for s in slices:
            for near_m, far_m in NEAR_FAR.items():
                a, b, cl = near_far_units(run.records_for(near_m), near_m, far_m, _slice_filter(s))
                res = paired_difference(a, b, cl, n_boot=settings.n_boot, n_perm=settings.n_perm,
                                        alpha=settings.alpha, seed=settings.seed)
                n = len(a)
                rows.append({"run": label, "model": run.model_name, "slice": s, "metric": near_m,
                             "n_common": n, "value_near": sum(a) / n if n else None,
                             "value_far": sum(b) / n if n else None, "delta_far_minus_near": _num(res.delta),
                             "ci_low": _num(res.ci_low), "ci_high": _num(res.ci_high), "p": _num(res.p_value),
                             "family": f"near_far:{label}:{near_m}:{s}", "p_holm": None, "_p": res.p_value})
    return _holm_within_families(rows)


def _holm_within_families(rows: list[dict[str, Any]], family: str = "family", adjusted: str = "p_holm",
                          keep_p: bool = False) -> list[dict[str, Any]]:
    """Fill ``adjusted`` by Holm over the rows of each ``family`` (None: none); their raw p is in ``_p``, removed
    here unless ``keep_p``."""
    for fam in {r[family] for r in rows} - {None}:
        members = [r for r in rows if r[family] == fam]
        for r, p in zip(members, holm([r["_p"] for r in members])):
            r[adjusted] = _num(p)
    if not keep_p:
        for r in rows:
            del r["_p"]
    return rows


# ---------------------------------------------------------------------------------------------------------
# control arms, within one run

#: (control condition, reference metric, control metric): a control against its reference on the same questions
CONTROL_CONTRASTS: tuple[tuple[str, str, str], ...] = (
    ("tool_error_timeout", "tool_error_abstention", "tool_error_abstention_timeout"),
    ("tool_error_timeout", "tool_error_fallback", "tool_error_fallback_timeout"),
    ("tool_error_timeout", "tool_error_bw_abstention", "tool_error_bw_abstention_timeout"),
    ("tool_error_permission", "tool_error_abstention", "tool_error_abstention_permission"),
    ("tool_error_permission", "tool_error_fallback", "tool_error_fallback_permission"),
    ("tool_error_permission", "tool_error_bw_abstention", "tool_error_bw_abstention_permission"),
    ("noop_tool", "no_tool_accuracy", "noop_accuracy"),
    ("noop_tool", "abstention_rate_no_tool", "noop_abstention"),
)


def control_rows(runs: Sequence[tuple[str, StudyRun]], slices: Sequence[str],
                 settings: StudySettings) -> list[dict[str, Any]]:
    """Paired control - reference contrasts inside each run that holds the control arm's episodes, on the
    (question, formulation) units in both metrics' supports. Holm family: as for near vs far."""
    rows: list[dict[str, Any]] = []
    for label, run in runs:
        present = {r.get("condition") for r in run.records}
        for cond, ref_m, ctl_m in CONTROL_CONTRASTS:
            if cond not in present:
                continue
            for s in slices:
                a, b, cl = near_far_units(run.records_for(ref_m), ref_m, ctl_m, _slice_filter(s))
                res = paired_difference(a, b, cl, n_boot=settings.n_boot, n_perm=settings.n_perm,
                                        alpha=settings.alpha, seed=settings.seed)
                n = len(a)
                rows.append({"run": label, "model": run.model_name, "control": cond, "slice": s,
                             "metric_reference": ref_m, "metric_control": ctl_m, "n_common": n,
                             "value_reference": sum(a) / n if n else None, "value_control": sum(b) / n if n else None,
                             "delta": _num(res.delta), "ci_low": _num(res.ci_low), "ci_high": _num(res.ci_high),
                             "p": _num(res.p_value), "family": f"control:{label}:{ctl_m}:{s}", "p_holm": None,
                             "_p": res.p_value})
    return _holm_within_families(rows)


# ---------------------------------------------------------------------------------------------------------
# across models: two-proportion z tests and the stability rule

def metric_counts(records: Sequence[Mapping[str, Any]], metric: str, formulation: str) -> tuple[int, int]:
    """(k, n) of a metric on one formulation of one run, on that run's own cell (no common support)."""
    units = metric_units(records, metric, formulations=[formulation])
    return sum(bool(v) for v in units.values()), len(units)


def _groups(bases: Sequence[StudyRun], contrasts: Sequence[Contrast]) -> dict[str, list[StudyRun]]:
    """Runs comparable across models: the base runs, and each arm label's runs."""
    out: dict[str, list[StudyRun]] = {BASE_LABEL: list(bases)}
    for c in contrasts:
        out.setdefault(c.arm, []).append(c.arm_run)
    return {k: v for k, v in out.items() if len(v) >= 2}


def _base_run_of(bases: Sequence[StudyRun], side: str) -> StudyRun | None:
    """The base run a ``--model-pair`` side names: its model's display name, its model identity, or its directory."""
    for b in bases:
        if side in (b.model_name, b.model):
            return b
    for b in bases:
        try:
            if Path(side).resolve() == Path(b.path).resolve():
                return b
        except OSError:
            continue
    return None


def resolve_model_pairs(bases: Sequence[StudyRun], specs: Sequence[str]) -> list[tuple[StudyRun, StudyRun]]:
    """``A:B`` specs -> (base run A, base run B). Each side is a base run's model name (``run.json``), its model
    identity, or its run directory (a recipe names the runs it made, whatever model the user gave each step). A
    spec holding several ``:`` is split where both sides name a base run."""
    pairs = []
    for spec in specs:
        text = str(spec)
        found = None
        for i in (i for i, ch in enumerate(text) if ch == ":"):
            a, b = _base_run_of(bases, text[:i]), _base_run_of(bases, text[i + 1:])
            if a is not None and b is not None:
                found = (a, b)
                break
        if found is None or found[0] is found[1]:
            names = ", ".join(sorted(b.model_name for b in bases)) or "none"
            raise StudyError(f"--model-pair {spec!r}: give A:B with A and B two base runs of the study (model "
                             f"names {names}, or their run directories)")
        pairs.append(found)
    return pairs


def ztest_rows(groups: Mapping[str, Sequence[StudyRun]], formulations: Sequence[str],
               settings: StudySettings) -> list[dict[str, Any]]:
    """Two-proportion z tests (pooled variance) between every pair of models, per arm, metric and formulation.

    Retention is read as the release's keepQ (``retention_qminus``, :data:`ZTEST_READS`); ``metric_read`` says so.

    Each model's rate is on its own cell (unpaired). ``p_holm``: Holm over every model pair of one (arm, metric,
    formulation) (``z-all-pairs``); ``p_holm_planned``: over the study's ``model_pairs`` only, retention only
    (``z-planned``, App. E). The pooled slice is a mean of rates with no counts, so it gets no z test.
    """
    # the pre-registered base-vs-instruct pairs (model_pairs), unordered model names
    planned = {frozenset((a.model_name, b.model_name))
               for a, b in resolve_model_pairs(groups.get(BASE_LABEL, ()), settings.model_pairs)}
    rows: list[dict[str, Any]] = []
    for label, runs in groups.items():
        for m in settings.model_metrics:
            for f in formulations:
                read = ZTEST_READS.get(m, m)
                counts = [(r, *metric_counts(r.records_for(read), read, f)) for r in runs]
                for (ra, ka, na), (rb, kb, nb) in itertools.combinations(counts, 2):
                    z = two_proportion_z(ka, na, kb, nb)
                    in_plan = m == "retention" and frozenset((ra.model_name, rb.model_name)) in planned
                    rows.append({"arm": label, "metric": m, "metric_read": read, "formulation": f,
                                 "model_a": ra.model_name,
                                 "model_b": rb.model_name, "k_a": ka, "n_a": na, "k_b": kb, "n_b": nb,
                                 "rate_a": _num(z.p1), "rate_b": _num(z.p2), "z": _num(z.z), "p": _num(z.p_value),
                                 "family": f"z-all-pairs:{label}:{m}:{f}", "p_holm": None, "_p": z.p_value,
                                 "family_planned": f"z-planned:{label}:{m}:{f}" if in_plan else None,
                                 "p_holm_planned": None})
    return _holm_within_families(_holm_within_families(rows, "family_planned", "p_holm_planned", keep_p=True))


def _rates(run: StudyRun, metric: str, formulations: Sequence[str]) -> dict[str, float | None]:
    """Per-formulation rate and the pooled value (unweighted mean over formulations with n > 0).

    A run that was not made on every formulation of the study (the base model: pv0 only) has no pooled value:
    the release calls pooled comparisons involving it undefined (scoring.md §10), so its orderings are ``n/a``."""
    out: dict[str, float | None] = {}
    for f in formulations:
        k, n = metric_counts(run.records_for(metric), metric, f)
        out[f] = k / n if n else None
    made = {r.get("formulation") for r in run.records_for(metric)}
    used = [v for v in out.values() if v is not None]
    out[POOLED] = sum(used) / len(used) if used and made >= set(formulations) else None
    return out


def _direction(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "n/a"
    return ">" if a > b else "<" if a < b else "="


def stability_rows(groups: Mapping[str, Sequence[StudyRun]], formulations: Sequence[str],
                   settings: StudySettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The paper's stability rule: an ordering of two models holds only if it holds pooled AND on every formulation.

    Pairwise: ``stable`` is true iff the strict direction (``>`` or ``<`` of the point estimates) is the same in
    the pooled slice and in every formulation of the study; a tie or a missing value (n = 0) breaks it. The
    second table gives each slice's full ranking and whether the whole ranking is the same everywhere.
    """
    slices = (*formulations, POOLED)
    pairs, ranks = [], []
    for label, runs in groups.items():
        for m in settings.model_metrics:
            rates = {r.model_name: _rates(r, m, formulations) for r in runs}
            for a, b in itertools.combinations(rates, 2):
                dirs = {s: _direction(rates[a][s], rates[b][s]) for s in slices}
                stable = len(set(dirs.values())) == 1 and dirs[POOLED] in (">", "<")
                pairs.append({"arm": label, "metric": m, "model_a": a, "model_b": b, **dirs, "stable": stable,
                              "stable_ordering": f"{a} {dirs[POOLED]} {b}" if stable else None})
            ranking = {}
            for s in slices:
                vals = {name: rates[name][s] for name in rates}
                if any(v is None for v in vals.values()):
                    ranking[s] = None
                    continue
                order = sorted(vals, key=lambda n: (-vals[n], n))
                ranking[s] = " > ".join(order) if len(set(vals.values())) == len(vals) else \
                    " ≥ ".join(order) + " (ties)"
            row = {"arm": label, "metric": m, **ranking}
            row["ranking_stable"] = (None not in ranking.values() and len(set(ranking.values())) == 1
                                     and "(ties)" not in (ranking[POOLED] or ""))
            row["n_stable_pairs"] = sum(p["stable"] for p in pairs if p["arm"] == label and p["metric"] == m)
            row["n_pairs"] = sum(1 for p in pairs if p["arm"] == label and p["metric"] == m)
            ranks.append(row)
    return pairs, ranks


# ---------------------------------------------------------------------------------------------------------
# across models, paired: the base-versus-instruction-tuned family

MODEL_PAIR_FAMILY = "base-vs-instruct"


def model_pair_rows(bases: Sequence[StudyRun], slices: Sequence[str], settings: StudySettings
                    ) -> list[dict[str, Any]]:
    """Paired B - A contrasts between two models' base runs on their common support (App. B), one row per pair x
    slice x metric, on the (question, formulation) units in both models' metric cell. Holm runs over the declared
    pairs per formulation and metric (family ``C``). A pooled row only where both runs cover every formulation of
    the study (App. F.2's 70B point is formulation-pooled); the base model is read on one formulation, so family C
    has none (scoring.md §10), and a formulation one of the two runs lacks has no row either."""
    pairs = resolve_model_pairs(bases, settings.model_pairs)
    metrics = list(dict.fromkeys([*CRITERION_METRICS, *settings.metrics]))
    rows: list[dict[str, Any]] = []
    for ra, rb in pairs:
        made = {r.get("formulation") for r in ra.records} & {r.get("formulation") for r in rb.records}
        forms = [s for s in slices if s != POOLED]
        every = len(forms) > 1 and all(s in made for s in forms)
        for s in (s for s in slices if (s in made if s != POOLED else every)):
            for m in metrics:
                (comp,) = paired_metric_comparison(ra.records_for(m), rb.records_for(m), [m], holm_family=[],
                                                   formulations=_slice_filter(s), n_boot=settings.n_boot,
                                                   n_perm=settings.n_perm, alpha=settings.alpha, seed=settings.seed)
                r = comp.result
                rows.append({"pair": f"{ra.model_name}:{rb.model_name}", "model_a": ra.model_name,
                             "model_b": rb.model_name, "slice": s, "metric": m, "n_common": comp.n_common,
                             "value_a": _num(comp.value_a), "value_b": _num(comp.value_b), "delta": _num(r.delta),
                             "ci_low": _num(r.ci_low), "ci_high": _num(r.ci_high), "p": _num(r.p_value),
                             "family": f"{MODEL_PAIR_FAMILY}:{m}:{s}", "p_holm": None, "_p": r.p_value})
    return _holm_within_families(rows)


# ---------------------------------------------------------------------------------------------------------

def run_study(bases: Sequence[StudyRun], arms: Sequence[StudyRun], settings: StudySettings | None = None
              ) -> Study:
    """Compute every table of a study from its runs (see the module docstring for the slices)."""
    settings = settings or StudySettings()
    wrong = [r for r in (*bases, *arms) if r.layer != settings.layer]
    if wrong:
        raise StudyError(f"{wrong[0].path}: read in the {wrong[0].layer} layer, the study asks for the "
                         f"{settings.layer} layer")
    contrasts = pair_contrasts(bases, arms)
    families = resolve_families(settings.family, contrasts, settings.partial_families)
    runs = [*bases, *arms]
    formulations = _order_formulations(r["formulation"] for run in runs for r in run.records
                                       if "formulation" in r)
    study = Study(settings=settings, runs=runs, contrasts=contrasts, families=families,
                  formulations=formulations, family_sizes=family_sizes(families, settings.partial_families))
    paired = paired_rows(contrasts, study.slices, settings, families)
    study.criterion = criterion_rows(contrasts, study.slices, paired, settings.alpha)
    for r in paired:
        del r["_result"]
    study.paired = paired
    labelled = [(BASE_LABEL, b) for b in bases] + [(c.arm, c.arm_run) for c in contrasts]
    study.near_far = near_far_rows(labelled, study.slices, settings)
    study.controls = control_rows(labelled, study.slices, settings)
    groups = _groups(bases, contrasts)
    study.ztests = ztest_rows(groups, formulations, settings)
    study.stability, study.rankings = stability_rows(groups, formulations, settings)
    study.model_pairs = model_pair_rows(bases, study.slices, settings)
    return study
