"""One table of paired changes against the base model: prompting, SFT, DPO and the best steering edit.

All arms are read on the same questions (the intersection of the question ids every run evaluated), and each
is compared with base by :func:`memtoc.jobs.finetune.compare.compare_on_common_support`, so every change stands
next to its own support (units kept) and its drift (units whose cell the arm changed). Steering and prompting
leave the closed-book pass untreated, so their drift is 0 by construction; fine-tuning's is not.

When several steering runs are given, the "best" is chosen on these same questions (criterion met first, then
the largest retention change) — a selection that is not held out, and the table says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.fileio import write_json_atomic, write_text_atomic
from memtoc.jobs.finetune.compare import SupportComparison, compare_on_common_support
from memtoc.scoring.metrics import COMPARISON_METRICS, get_metric
from memtoc.runs.runstore import RunStore

ARM_ORDER = ("prompt", "sft", "dpo", "steer")
ARM_TITLES = {"prompt": "prompting", "sft": "LoRA SFT", "dpo": "LoRA DPO", "steer": "steering"}


@dataclass(frozen=True)
class ArmInput:
    """An arm's records and where they came from (a run directory or a merged cross-fitted arm)."""

    kind: str            # prompt | sft | dpo | steer
    label: str
    records: list[Mapping[str, Any]]
    source: str


def read_arm(kind: str, path: str | Path) -> ArmInput:
    store = RunStore.read(path)
    info = store.run_info()
    ident = info.get("identity", {})
    detail = ""
    if kind == "prompt":
        detail = ident.get("prompt_intervention") or ""
    elif kind == "steer":
        detail = (info.get("edit") or {}).get("name") or ""
    label = ARM_TITLES[kind] + (f" ({detail})" if detail else "")
    return ArmInput(kind=kind, label=label, records=store.episodes.records(), source=str(path))


def _restrict(records: Sequence[Mapping[str, Any]], qids: set[str]) -> list[Mapping[str, Any]]:
    return [r for r in records if str(r["question_id"]) in qids]


@dataclass(frozen=True)
class SideBySide:
    n_questions: int
    metrics: tuple[str, ...]
    rows: list[tuple[ArmInput, SupportComparison]]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": "memtoc-finetune-table-v1", "n_questions": self.n_questions,
                "metrics": list(self.metrics), "delta": "arm - base, on units whose cell agrees in both",
                "notes": self.notes,
                "arms": [{"kind": a.kind, "label": a.label, "source": a.source, **c.to_dict()} for a, c in self.rows]}

    def markdown(self) -> str:
        head = ["arm", "units kept / cell drift"] + [get_metric(m).label for m in self.metrics] + ["criterion"]
        lines = [f"Paired changes vs base on the same {self.n_questions} questions: Δ pp [95% CI] "
                 "(base → arm %, n paired units, p, drift +entered/−left the metric's support); "
                 "cluster = question", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for arm, comp in self.rows:
            d = comp.drift
            cells = [arm.label, f"{d.n_same_cell} / {d.n_changed_cell}"]
            for m in self.metrics:
                c = comp.comparison[m]
                r = c.result
                if c.n_common == 0 or math.isnan(r.delta):
                    cells.append("– (n=0)")
                    continue
                p = c.p_adjusted if c.p_adjusted is not None else r.p_value
                md = comp.metric_drift.get(m, {})
                cells.append(f"{100 * r.delta:+.1f} [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}] "
                             f"({100 * c.value_a:.0f}→{100 * c.value_b:.0f}%, n={c.n_common}, p={p:.3g}, "
                             f"drift +{md.get('n_treated_only', 0)}/−{md.get('n_base_only', 0)})")
            v = comp.comparison.verdict
            cells.append("**met**" if v.success else "not met")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("p: Holm-adjusted within each arm's family (all listed metrics); criterion: retention rises "
                     "significantly and correct-tool following does not fall significantly. Units kept: "
                     "(question, formulation) units whose cell is the same under base and arm (the support every "
                     "change is computed on); cell drift: units the arm moved to another cell (excluded).")
        for arm, comp in self.rows:
            extra = f"; cell changes (tool_wrong cell base->arm): {comp.drift.transitions}" \
                if comp.drift.transitions else ""
            lines.append(f"- {arm.label}: {comp.comparison.verdict.reason}{extra}")
        for n in self.notes:
            lines.append(f"- {n}")
        return "\n".join(lines) + "\n"


def side_by_side(base: Sequence[Mapping[str, Any]], arms: Sequence[ArmInput], *,
                 metrics: Sequence[str] = COMPARISON_METRICS, seed: int = 0, n_boot: int = 1000,
                 n_perm: int = 10000) -> SideBySide:
    """Compare every arm with base on the questions all of them evaluated; keep the best steering arm."""
    if not arms:
        raise MemtocError("the table needs at least one arm besides base")
    qids = {str(r["question_id"]) for r in base}
    for a in arms:
        qids &= {str(r["question_id"]) for r in a.records}
    if not qids:
        raise MemtocError("the runs share no question; were they made on the same benchmark?")
    base_r = _restrict(base, qids)
    notes: list[str] = []
    results: list[tuple[ArmInput, SupportComparison]] = []
    for a in arms:
        comp = compare_on_common_support(base_r, _restrict(a.records, qids), label=a.label, metrics=metrics,
                                         seed=seed, n_boot=n_boot, n_perm=n_perm)
        results.append((a, comp))
    steer = [(a, c) for a, c in results if a.kind == "steer"]
    if len(steer) > 1:
        def key(ac: tuple[ArmInput, SupportComparison]) -> tuple[bool, float]:
            d = ac[1].comparison["retention"].result.delta
            return (ac[1].comparison.verdict.success, -math.inf if math.isnan(d) else d)

        best = max(steer, key=key)
        results = [ac for ac in results if ac[0].kind != "steer" or ac[0] is best[0]]
        notes.append(f"steering: best of {len(steer)} edits ({best[0].label}, {best[0].source}) chosen on these same "
                     "questions (criterion met first, then the largest retention change); not a held-out choice")
    results.sort(key=lambda ac: ARM_ORDER.index(ac[0].kind) if ac[0].kind in ARM_ORDER else len(ARM_ORDER))
    names = tuple(c.metric.name for c in results[0][1].comparison.comparisons)
    return SideBySide(n_questions=len(qids), metrics=names, rows=results, notes=notes)


def write_table(table: SideBySide, prefix: str | Path) -> dict[str, Path]:
    """``PREFIX.md`` and ``PREFIX.json``."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md, js = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".json")
    write_text_atomic(md, table.markdown())
    write_json_atomic(js, table.to_dict())
    return {"markdown": md, "json": js}
