"""Report sections of the code-executor family: its runs (``memtoc codeexec evaluate``) and sweeps
(``memtoc codeexec sweep``). Built from the files those commands write, like the MemToC sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import memtoc.core.plots as plots
from memtoc.jobs.report.document import (Image, Links, Para, Section, Table, anchor_id, fmt_delta, pct_text, read_json,
                                          rel_path)

SWEEP_SCHEMA = "memtoc-codeexec-sweep-v1"


def is_codeexec_run_dir(p: Path) -> bool:
    return (p / "run.json").is_file() and (p / "trials.jsonl").is_file()


def is_codeexec_sweep(path: Path) -> bool:
    return (read_json(path) or {}).get("schema_version") == SWEEP_SCHEMA


def _est(e: Mapping[str, Any] | None, pct: bool = True) -> str:
    if not e or e.get("value") is None:
        return "–"
    ci = e.get("ci") or {}
    lo, hi = ci.get("low", e.get("ci_low")), ci.get("high", e.get("ci_high"))
    if pct:
        return f"{pct_text(e['value'])}% [{pct_text(lo)}, {pct_text(hi)}]"
    return f"{e['value']:.2f} [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else f"{e['value']:.2f}"


def codeexec_run_section(run: Path, base: Path, *, level: int = 3) -> Section:
    src = rel_path(run, base)
    info = read_json(run / "run.json") or {}
    summary = read_json(run / "summary.json") or {}
    agent = info.get("agent") or {}
    sec = Section(f"Code-executor run {src}", anchor_id("codeexec-run", src), level, f"{src}/summary.json")
    sec.blocks.append(Para(f"model {info.get('model_spec')}, policy {info.get('policy')}, split {info.get('split')}, "
                           f"{info.get('n_problems')} problems, protocol {info.get('protocol')}, first call "
                           f"{agent.get('first_call', 'model')}, edit {(info.get('edit') or {}).get('name')}"))
    rows = []
    for r in summary.get("rows") or []:
        rows.append([str(r.get("policy")), str(r.get("condition")), str((r.get("accuracy") or {}).get("n_trials")),
                     _est(r.get("accuracy")), _est(r.get("adoption")), _est(r.get("override")),
                     _est(r.get("tool_call_ratio"), pct=False)])
    sec.blocks.append(Table(["policy", "condition", "n", "accuracy", "adoption", "override", "tool-call ratio"], rows,
                            source=f"{src}/summary.json", caption="[95% problem-bootstrap CI]"))
    sec.blocks.append(Links([(f, f"{src}/{f}") for f in ("trials.jsonl", "run.json", "summary.json")
                             if (run / f).is_file()]))
    return sec


def codeexec_sweep_section(path: Path, base: Path) -> Section:
    d = read_json(path)
    src = rel_path(path, base)
    rows = d.get("rows") or []
    conditions = list((d.get("config") or {}).get("conditions") or [])
    edit = d.get("edit") or {}
    sec = Section(f"Code-executor sweep {src}", anchor_id("sweep", src), 2, src)
    sec.blocks.append(Para(f"edit {edit.get('name')} ({edit.get('kind')}, positions {edit.get('positions')}, sites "
                           f"{edit.get('layers')}), toward {d.get('direction')}, strengths "
                           f"{', '.join(f'{float(s):g}' for s in d.get('strengths') or [])}; split "
                           f"{(d.get('config') or {}).get('split')}"))

    headers = ["strength"]
    for c in conditions:
        headers += [f"{c} accuracy", f"Δ {c} accuracy"]
        if any("adoption" in ((r.get("conditions") or {}).get(c) or {}) for r in rows):
            headers += [f"{c} adoption", f"Δ {c} adoption"]
    trs = []
    for r in rows:
        cells = [f"{float(r['strength']):g}"]
        for c in conditions:
            e = (r.get("conditions") or {}).get(c) or {}
            n_acc = (e.get("accuracy") or {}).get("n")
            cells += [_est(e.get("accuracy")) + f" (n={n_acc})", fmt_delta(e.get("d_accuracy"))]
            if f"{c} adoption" in headers:
                cells += [_est(e.get("adoption")), fmt_delta(e.get("d_adoption"))]
        trs.append(cells)
    sec.blocks.append(Table(headers, trs, source=src, caption="rates over problems [95% CI]; Δ = paired change vs "
                                                              "strength 0 in percentage points [95% CI]"))
    if rows:
        sec.blocks.append(Image(plots.codeexec_sweep_curves(rows, conditions, title=f"{edit.get('name')}"),
                                anchor_id("sweep", src), "accuracy and adoption against edit strength", src))
    return sec


def codeexec_paper_table_section(path: Path, base: Path) -> Section:
    """``codeexec table``'s output: the overreliance paper's columns beside its numbers."""
    from memtoc.tasks.codeexec.paper_table import blocks

    src = rel_path(path, base)
    sec = Section(f"Overreliance paper table {src}", anchor_id("paper-table", src), 2, src)
    for blk in blocks(read_json(path) or {}):
        sec.blocks.append(Para(blk["title"]))
        sec.blocks.append(Table(blk["headers"], blk["rows"], source=src, caption=blk["caption"]))
    return sec
