"""``memtoc sweep``'s MemToC rows: its config, flip tables, paired changes, the table and the CSV.

The sweep itself is the MemToC sweep job (:func:`memtoc.jobs.sweep.sweep`): every strength an evaluation into its
own run directory ``OUT/strength_<s>``, strength 0 always run as the baseline. This module holds what MemToC reports
of it per strength (``OUT/sweep.{json,csv,md,png}``), which the job body calls: the pooled metrics, the outcome
flips on tool_wrong (near) ∩ arb against strength 0 (:func:`flip_stats`), format integrity (:func:`format_stats`),
and the paired changes with the asymmetric criterion's verdict; :data:`DEFINITIONS` says what each figure counts.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from memtoc.backends.base import final_line_end
from memtoc.bench.conditions import set_default
from memtoc.core.runtime import GenerationConfig
from memtoc.core.config import (MODEL_AS_GIVEN, SWEEP_HERE, EpisodeSelection, ExecutorSettings, Intervention,
                                JobSettings, ModelSpec, ScoreLayer, SweepSettings)
from memtoc.core.options import here
from memtoc.tasks.sweep_format import fmt_delta, fmt_pct, strength_dir_name

REPORT_METRICS = ("retention", "correct_tool_following", "incorrect_tool_following", "tool_error_abstention",
                  "no_conflict_accuracy")
DEGENERATE_NGRAM = 3
DEGENERATE_COVERAGE = 0.5


def is_degenerate(text: str, *, n: int = DEGENERATE_NGRAM, coverage: float = DEGENERATE_COVERAGE) -> bool:
    """Empty or repetitive output.

    A response is degenerate when it is empty (only whitespace), or when the positions covered by the
    occurrences of its most frequent ``n``-gram exceed ``coverage`` of its tokens. Tokens are whitespace-
    separated words; a response of fewer than ``n`` words is measured on characters instead (so a long run of
    one glued string such as ``"aaaa..."`` counts too); fewer than ``4 * n`` characters is never repetitive.
    """
    stripped = text.strip()
    if not stripped:
        return True
    toks: Sequence[str] = stripped.split()
    if len(toks) < n:
        toks = stripped
        if len(toks) < 4 * n:
            return False
    grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]     # never empty: len(toks) >= n here
    top, _ = Counter(grams).most_common(1)[0]
    covered = [False] * len(toks)
    for i, g in enumerate(grams):
        if g == top:
            for j in range(i, i + n):
                covered[j] = True
    return sum(covered) / len(toks) > coverage


@dataclass
class SweepConfig:
    """``memtoc sweep``: the evaluator's pieces (the edit spec path in ``intervention.edit``) plus the strengths;
    ``scoring``: the layer the table reads; ``execution``: where the strengths run (not recorded: a sweep resumes
    under any executor)."""
    #: left out of the flat record (memtoc.core.config.flat_record): the layer the table reads and where the
    #: strengths run (a sweep resumes under any executor)
    RECORD_OMIT: ClassVar[tuple[str, ...]] = ("scoring", "execution")
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"edit": "input", "dev_labels": "input-run", "out": "output-dir"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = (*MODEL_AS_GIVEN, "stop_at_final_line", "temperature")
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {**SWEEP_HERE, "max_new_tokens": here("generation budget per answer")}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    selection: EpisodeSelection = field(
        default_factory=lambda: EpisodeSelection(conditions=set_default("sweep")))
    intervention: Intervention = field(default_factory=Intervention)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/sweep"))
    sweep: SweepSettings = field(default_factory=SweepSettings)
    scoring: ScoreLayer = field(default_factory=ScoreLayer)
    execution: ExecutorSettings = field(default_factory=ExecutorSettings)


def _rate_ci(values: Sequence[bool], clusters: Sequence[str], *, n_boot: int, seed: int) -> dict[str, Any]:
    from memtoc.scoring.stats import bootstrap_ci

    n = len(values)
    k = int(sum(bool(v) for v in values))
    ci = bootstrap_ci([float(v) for v in values], list(clusters), n_boot=n_boot, seed=seed) if n else None
    return {"value": k / n if n else None, "k": k, "n": n,
            "ci_low": None if ci is None or ci.is_nan else ci.low,
            "ci_high": None if ci is None or ci.is_nan else ci.high}


FLIP_BAR = 0.15      # the paper's registered revival bar on the dev flip (half the prompting effect, App. C)


def dev_set(episode_ids: Sequence[str], n: int | None, seed: int = 0) -> set[str]:
    """The first ``n`` of ``episode_ids`` in a seeded order that does not depend on the input order (sha256 of
    seed and id): the paper's dev set of a fixed size per direction. ``n`` None or 0: every episode."""
    import hashlib

    ids = sorted(set(map(str, episode_ids)), key=lambda e: (hashlib.sha256(f"{seed}:{e}".encode()).hexdigest(), e))
    return set(ids if not n else ids[:int(n)])


def flip_stats(base: Sequence[Mapping[str, Any]], treated: Sequence[Mapping[str, Any]], *, n_boot: int = 1000,
               seed: int = 0, dev_per_direction: int | None = None,
               labels: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Outcome flips on tool_wrong (near) ∩ arb, paired by episode id (the cell taken from both runs).

    Two kinds of rate. Per direction (the paper's, App. C): ``toward_memory`` = kept memory now, over the episodes
    that followed the tool at strength 0; ``toward_tool`` = followed the tool now, over those that kept memory at
    strength 0 -- each over a dev set of at most ``dev_per_direction`` such episodes (seeded, ``dev_set``). Over
    the whole cell (the older columns): ``flip_to_memory`` / ``flip_to_tool``.

    ``labels``: the records of the labelling run (the behavioural split the features were mined on). The paper's
    statistic (App. C, "tool-following on kept-memory episodes rises 0.03 -> 0.28"): the dev sets are picked by
    the LABELLING run's outcome, the strength-0 rate on them is measured (``baseline``, not 0 by construction),
    and the flip is ``treated - baseline`` on the same episodes. Without labels the dev sets are picked by the
    strength-0 outcome itself, so ``baseline`` is 0 by construction (said in ``baseline_by_construction``)."""
    from memtoc.scoring.metrics import get_metric

    cell_def = get_metric("retention")
    t_by = {r["episode_id"]: r for r in treated}
    pairs = []             # (episode, outcome at strength 0, outcome now, question) on the cell in both runs
    for b in base:
        t = t_by.get(b["episode_id"])
        if t is not None and cell_def.qualifies(b) and cell_def.qualifies(t):
            pairs.append((str(b["episode_id"]), b["outcome"], t["outcome"], str(b["question_id"])))
    qs = [q for *_, q in pairs]
    per_dir = {}
    label_of = None if labels is None else {str(r["episode_id"]): r.get("outcome") for r in labels
                                            if cell_def.qualifies(r)}
    for name, base_outcome, target in (("toward_memory", "followed_tool", "kept_memory"),
                                       ("toward_tool", "kept_memory", "followed_tool")):
        dev = dev_set([e for e, ob, _, _ in pairs if (ob if label_of is None else label_of.get(e)) == base_outcome],
                      dev_per_direction, seed)
        sel = [(ob == target, ot == target, q) for e, ob, ot, q in pairs if e in dev]
        rate = _rate_ci([t for _, t, _ in sel], [q for _, _, q in sel], n_boot=n_boot, seed=seed)
        base_rate = _rate_ci([b for b, _, _ in sel], [q for _, _, q in sel], n_boot=n_boot, seed=seed)
        treated_rate = rate["value"]
        if label_of is not None and sel:     # the flip: treated - baseline, paired on the dev episodes
            from memtoc.scoring.stats import bootstrap_ci

            ci = bootstrap_ci([float(t) - float(b) for b, t, _ in sel], [q for _, _, q in sel], n_boot=n_boot,
                              seed=seed)
            rate = {**rate, "value": treated_rate - base_rate["value"], "ci_low": None if ci.is_nan else ci.low,
                    "ci_high": None if ci.is_nan else ci.high}
        rate["baseline"] = base_rate["value"]
        rate["treated"] = treated_rate
        rate["baseline_by_construction"] = label_of is None
        who = "the labelling run" if label_of is not None else "strength 0"
        rate["denominator"] = f"{cell_def.records_text} episodes that were {base_outcome} in {who}"
        rate["passes_bar"] = None if rate["value"] is None else rate["value"] >= FLIP_BAR - 1e-12
        per_dir[name] = rate
    return {
        "cell": cell_def.records_text,
        **per_dir,
        "bar": FLIP_BAR,
        "dev_per_direction": dev_per_direction,
        "flip_to_memory": _rate_ci([ob != "kept_memory" and ot == "kept_memory" for _, ob, ot, _ in pairs], qs,
                                   n_boot=n_boot, seed=seed),
        "flip_to_tool": _rate_ci([ob != "followed_tool" and ot == "followed_tool" for _, ob, ot, _ in pairs], qs,
                                 n_boot=n_boot, seed=seed),
        "followed_tool_to_kept_memory": sum(ob == "followed_tool" and ot == "kept_memory" for _, ob, ot, _ in pairs),
        "kept_memory_to_followed_tool": sum(ob == "kept_memory" and ot == "followed_tool" for _, ob, ot, _ in pairs),
        "outcome_changed": sum(ob != ot for _, ob, ot, _ in pairs),
        "n": len(qs),
    }


def format_stats(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    qs = [str(r["question_id"]) for r in records]
    final = [final_line_end(r.get("response") or "") is not None for r in records]
    degen = [is_degenerate(r.get("response") or "") for r in records]
    return {"final_line_rate": _rate_ci(final, qs, n_boot=n_boot, seed=seed),
            "degenerate_rate": _rate_ci(degen, qs, n_boot=n_boot, seed=seed)}


def strength_row(strength: float, spec_strength: float, records: Sequence[Mapping[str, Any]],
                 base_records: Sequence[Mapping[str, Any]], *, n_boot: int, n_perm: int, seed: int,
                 dev_per_direction: int | None = None,
                 labels: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    from memtoc.scoring.metrics import compare_arms, metric_table

    table = metric_table(records, metrics=REPORT_METRICS, n_boot=n_boot, seed=seed)
    metrics = {}
    for name in REPORT_METRICS:
        p = table[name].pooled
        n = sum(p.n_per_formulation.values())
        metrics[name] = {"value": None if not p.formulations_used else p.value, "n": n,
                         "ci_low": None if p.ci.is_nan else p.ci.low, "ci_high": None if p.ci.is_nan else p.ci.high}
    comp = compare_arms(base_records, records, metrics=REPORT_METRICS, n_boot=n_boot, n_perm=n_perm, seed=seed,
                        label_a="strength_0", label_b=strength_dir_name(strength))
    paired = {}
    for c in comp.comparisons:
        r = c.result
        ok = c.n_common > 0
        paired[c.metric.name] = {"delta": r.delta if ok else None, "ci_low": r.ci_low if ok else None,
                                 "ci_high": r.ci_high if ok else None,
                                 "p": r.p_value if ok and math.isfinite(r.p_value) else None,
                                 "p_holm": c.p_adjusted if c.p_adjusted is not None and math.isfinite(c.p_adjusted)
                                 else None, "n_common": c.n_common}
    return {"strength": strength, "spec_strength": spec_strength, "n_episodes": len(records), "metrics": metrics,
            "flips": flip_stats(base_records, records, n_boot=n_boot, seed=seed,
                                dev_per_direction=dev_per_direction, labels=labels),
            "format": format_stats(records, n_boot=n_boot, seed=seed), "paired_vs_0": paired,
            "verdict": comp.verdict.to_dict()}


TABLE_COLUMNS = ("strength", "spec_strength", "n", "toward_memory", "toward_tool", "retention", "d_retention",
                 "correct_tool", "d_correct_tool", "tool_error_abstention", "d_tool_error_abstention",
                 "flip_to_memory", "flip_to_tool", "changed", "final_line", "degenerate")


def fmt_dir_flip(d: Mapping[str, Any]) -> str:
    """A per-direction flip rate as ``+0.125 (5/40) ✓`` against the +0.15 bar ("-" without episodes)."""
    if d.get("value") is None:
        return f"- (0/{d.get('n', 0)})"
    mark = "✓" if d.get("passes_bar") else "✗"
    return f"{d['value']:+.3f} ({d['k']}/{d['n']}) {mark}"


def format_markdown(rows: Sequence[Mapping[str, Any]], *, title: str = "") -> str:
    head = "| " + " | ".join(TABLE_COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"
    body = []
    for r in rows:
        m, fl, fm, pv = r["metrics"], r["flips"], r["format"], r["paired_vs_0"]
        t = {
            "strength": f"{r['strength']:g}", "spec_strength": f"{r['spec_strength']:g}", "n": str(r["n_episodes"]),
            "toward_memory": fmt_dir_flip(fl.get("toward_memory") or {}),
            "toward_tool": fmt_dir_flip(fl.get("toward_tool") or {}),
            "retention": f"{fmt_pct(m['retention']['value'])} (n={m['retention']['n']})",
            "d_retention": fmt_delta(pv["retention"]),
            "correct_tool": f"{fmt_pct(m['correct_tool_following']['value'])} (n={m['correct_tool_following']['n']})",
            "d_correct_tool": fmt_delta(pv["correct_tool_following"]),
            "tool_error_abstention": f"{fmt_pct(m['tool_error_abstention']['value'])} "
                                     f"(n={m['tool_error_abstention']['n']})",
            "d_tool_error_abstention": fmt_delta(pv["tool_error_abstention"]),
            "flip_to_memory": f"{fmt_pct(fl['flip_to_memory']['value'])} ({fl['flip_to_memory']['k']}/{fl['n']})",
            "flip_to_tool": f"{fmt_pct(fl['flip_to_tool']['value'])} ({fl['flip_to_tool']['k']}/{fl['n']})",
            "changed": f"{fl['outcome_changed']}/{fl['n']}",
            "final_line": fmt_pct(fm["final_line_rate"]["value"]),
            "degenerate": fmt_pct(fm["degenerate_rate"]["value"]),
        }
        body.append("| " + " | ".join(t[c] for c in TABLE_COLUMNS) + " |")
    notes = ("toward_memory = kept memory now, over the episodes of tool_wrong (near) ∩ arb that followed the tool "
             "at strength 0; toward_tool = followed the tool now, over those that kept memory at strength 0 (the "
             f"paper's per-direction dev flips, App. C); ✓ = at or past the paper's +{FLIP_BAR:.2f} bar. "
             "Other rates in %, pooled over formulations; d_* = paired change vs strength 0 in percentage points "
             "[95% cluster-bootstrap CI] on common support; flips on tool_wrong (near) ∩ arb vs strength 0; "
             "final_line = responses with a complete FINAL line; degenerate = empty or most frequent 3-gram "
             "covering > 50% of the tokens.")
    return "\n".join(([f"## {title}", ""] if title else []) + [head, sep] + body + ["", notes]) + "\n"


def csv_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``sweep.csv``: one flat record per strength."""
    flat = []
    for r in rows:
        d: dict[str, Any] = {"strength": r["strength"], "spec_strength": r["spec_strength"],
                             "n_episodes": r["n_episodes"]}
        for name, m in r["metrics"].items():
            for k in ("value", "ci_low", "ci_high", "n"):
                d[f"{name}_{k}"] = m[k]
        for name, p in r["paired_vs_0"].items():
            for k in ("delta", "ci_low", "ci_high", "p", "n_common"):
                d[f"delta_{name}_{k}"] = p[k]
        for name in ("toward_memory", "toward_tool", "flip_to_memory", "flip_to_tool"):
            for k in ("value", "ci_low", "ci_high", "k", "n"):
                d[f"{name}_{k}"] = r["flips"][name][k]
        for name in ("toward_memory", "toward_tool"):
            d[f"{name}_passes_bar"] = r["flips"][name]["passes_bar"]
        for k in ("followed_tool_to_kept_memory", "kept_memory_to_followed_tool", "outcome_changed"):
            d[k] = r["flips"][k]
        for name in ("final_line_rate", "degenerate_rate"):
            for k in ("value", "ci_low", "ci_high", "n"):
                d[f"{name}_{k}"] = r["format"][name][k]
        d["criterion_success"] = r["verdict"].get("success")
        flat.append(d)
    return flat


DEFINITIONS = {
    "toward_memory": "per direction (the paper's): episodes of tool_wrong (near) ∩ arb that followed the tool at "
                     "strength 0 (a seeded dev set of at most dev_per_direction) and keep memory at this strength, "
                     "over those episodes",
    "toward_tool": "per direction: episodes that kept memory at strength 0 (dev set) and follow the tool now, over "
                   "those episodes",
    "bar": f"+{FLIP_BAR:.2f}: the paper's registered revival bar on the dev flip",
    "flip_to_memory": "tool_wrong (near) ∩ arb episodes (cell in both runs) whose outcome was not "
                      "kept_memory at strength 0 and is kept_memory at this strength, over the cell",
    "flip_to_tool": "same cell; outcome was not followed_tool at strength 0 and is followed_tool now",
    "final_line_rate": "tool-pass responses with a complete FINAL line (final_line_end is not None)",
    "degenerate_rate": f"responses that are empty or whose most frequent {DEGENERATE_NGRAM}-gram of "
                       f"words covers > {DEGENERATE_COVERAGE:.0%} of the words (characters when fewer "
                       f"than {DEGENERATE_NGRAM} words)",
    "paired_vs_0": "memtoc.scoring.metrics.compare_arms(strength 0, this strength): delta b - a on common "
                   "support, cluster bootstrap CI, sign-flip p",
}
