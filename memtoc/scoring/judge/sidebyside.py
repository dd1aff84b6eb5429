"""Deterministic and judged layers side by side: one row per metric, pooled values and the difference.

Used by ``memtoc metrics --score-layer both`` (text) and by the report (a table in the run's page).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADERS = ["metric", "label", "deterministic %", "n", "judged %", "n", "judged - det (pp)"]


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def layer_diff_rows(det: Any, jud: Any) -> list[list[str]]:
    """Rows of two :class:`~memtoc.scoring.metrics.MetricTable` (same metrics): pooled values, n, and judged - det."""
    rows = []
    for r in det.rows:
        j = jud[r.metric.name]
        dv, jv = r.pooled.value, j.pooled.value
        diff = "-" if dv != dv or jv != jv else f"{100 * (jv - dv):+.1f}"
        rows.append([r.metric.name, r.metric.label, _pct(dv), str(sum(r.pooled.n_per_formulation.values())),
                     _pct(jv), str(sum(j.pooled.n_per_formulation.values())), diff])
    return rows


def side_by_side_text(det: Any, jud: Any) -> str:
    from memtoc.scoring.metrics import align_rows

    rows = [HEADERS, *layer_diff_rows(det, jud)]
    return "Deterministic vs judged layer (pooled over formulations)\n" + align_rows(rows)


def run_layer_table(run: str | Path, judge_file: str = "judge.jsonl") -> tuple[list[str], list[list[str]], str] | None:
    """(headers, rows, caption) for a run with a judge pass, else None (the report shows nothing then)."""
    from memtoc.scoring.judge.layer import layer_records
    from memtoc.scoring.metrics import metric_table
    from memtoc.runs.runstore import RunStore

    run = Path(run)
    if not (run / judge_file).exists():
        return None
    records = RunStore.read(run).episodes.records()
    det = metric_table(records, n_boot=200)
    lr = layer_records(records, "judged", run_dir=run, judge_file=judge_file, allow_partial=True)
    jud = metric_table(lr.records, n_boot=200)
    judge = lr.judge or {}
    cap = (f"pooled values in both layers; judge {judge.get('model')} (weights "
           f"{str(judge.get('weights_sha256'))[:12]}, prompts {judge.get('prompt_version')}); changes "
           + ", ".join(f"{k} {v}" for k, v in lr.changes.to_dict().items()))
    if lr.coverage is not None and lr.coverage.partial:
        cap += f"; PARTIAL judge pass: {lr.coverage.text()} (unjudged episodes keep the scorer's labels)"
    return HEADERS, layer_diff_rows(det, jud), cap
