"""Collect a run or experiment directory into a report document (sections of tables, plots and links).

The document is rendered twice from the same structure: :mod:`memtoc.jobs.report.html` (one self-contained page,
plots embedded as base64 PNG) and :mod:`memtoc.jobs.report.markdown` (plots written beside it). Every table and
plot carries ``source``: the file its numbers come from (relative to the report).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.core.errors import MemtocError
import memtoc.core.plots as plots
from memtoc.jobs.report.document import (Alert, Document, Image, Links, Para, Section, Table, anchor_id, fmt3,
                                          fmt_cell, fmt_delta, fmt_pooled, pct_text, read_json, rel_path, short_text)
from memtoc.core.textfmt import fmt_value
from memtoc.core.vocab import CONFLICT_CONDITION, OUTCOMES

N_EPISODE_ROWS = 20
MAX_DEPTH = 4
_RUN_FILES = ("episodes.jsonl", "closed_book.jsonl", "run.json", "summary.json")


# -- run directories ------------------------------------------------------------------------------------------

def is_run_dir(p: Path) -> bool:
    """A MemToC run directory, finished or not (a run killed in its closed-book pass has no episodes yet)."""
    return (p / "run.json").is_file() and ((p / "episodes.jsonl").is_file() or (p / "closed_book.jsonl").is_file())


@dataclass
class RunView:
    """What the report reads of a run directory (through :meth:`RunStore.read`: read only)."""

    info: dict[str, Any]
    episodes: list[dict[str, Any]]
    state: Any                      # memtoc.runs.runstore.RunState


def read_run(run: Path, warnings: list[str] | None = None) -> RunView:
    """Read a run without writing to it; its warnings (interrupted, still running, torn line) are appended to
    ``warnings`` once each."""
    from memtoc.runs.runstore import RunStore

    store = RunStore.read(run, warn=None)
    if warnings is not None:
        warnings.extend(w for w in store.state.warnings() if w not in warnings)
    return RunView(info=store.run_info(), episodes=store.episodes.records(), state=store.state)


def _summary_of(run: Path, state: Any = None) -> dict[str, Any]:
    """A finished run's ``summary.json`` ({} when absent or stale)."""
    summary = run / "summary.json"
    if summary.exists() and (state is None or state.finished):
        return read_json(summary)
    return {}


def _metrics_of(run: Path, episodes: list[dict[str, Any]], state: Any = None,
                summary: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """The run's metrics: its summary's (``summary``: the already read ``_summary_of``), else recomputed."""
    s = _summary_of(run, state) if summary is None else summary   # an unfinished run's summary is stale
    if s.get("metrics"):
        return s["metrics"], "summary.json"
    from memtoc.scoring.metrics import metric_table

    return metric_table(episodes).to_dict(), "episodes.jsonl (recomputed)"


def provenance_table(info: Mapping[str, Any], src: str, state: Any = None) -> Table:
    ident = info.get("identity") or {}
    prov = info.get("provenance") or {}
    git = info.get("git") or {}
    cfg = info.get("config") or {}
    rows = [
        ["model", str(ident.get("model") or prov.get("model"))],
        ["model source", str(prov.get("model_source", "–"))],
        ["weights sha256", str(ident.get("weights_sha256"))],
        ["backend / dtype / device", f"{ident.get('backend')} / {ident.get('dtype')} / {ident.get('device_type')}"],
        ["chat template sha256", str(ident.get("chat_template_sha256"))],
    ]
    for f, h in sorted((ident.get("benchmark_files") or {}).items()):
        rows.append([f"benchmark file {f}", str(h)])
    rows += [
        ["prompt version / templates sha256", f"{ident.get('prompt_version')} / "
         f"{ident.get('prompt_templates_sha256') or ident.get('prompts_sha256')}"],
        ["git commit", f"{git.get('commit')}" + (" (dirty)" if git.get("dirty") else "")],
        ["package version", str(info.get("package_version"))],
        ["settings", f"closed book {ident.get('closed_book')}, intervention {ident.get('prompt_intervention')}, "
                     f"frame {ident.get('frame')}, max_new_tokens {ident.get('max_new_tokens')}, "
                     f"edit sha256 {ident.get('edit_sha256')}"
                     + (f", adapter sha256 {ident['adapter_sha256']}" if ident.get("adapter_sha256") else "")],
        ["selection", f"formulations {cfg.get('formulations')}, conditions {cfg.get('conditions')}, question set "
                      f"{cfg.get('question_set')}, limit {cfg.get('limit')}"],
        ["protocol", _protocol_text(info)],
        ["identity sha256", str(info.get("identity_sha256"))],
        ["status", state.describe() if state is not None else str(info.get("status"))],
    ]
    if info.get("edit"):
        e = info["edit"]
        rows.append(["edit", f"{e.get('name')} ({e.get('kind')}, strength {e.get('strength')})"])
    for m in info.get("merged_from") or []:
        rows.append(["merged from", f"{m.get('path')} ({m.get('n_episodes')} episodes, {m.get('status')})"])
    return Table(["field", "value"], rows, source=src)


def _protocol_text(info: Mapping[str, Any]) -> str:
    """The run's protocol and every setting that differs from the paper's (run.json ``protocol``)."""
    block = info.get("protocol")
    if not block:
        return "not recorded (a run made before protocols were recorded)"
    diffs = [f"{k} {v.get('run')} (paper {v.get('paper')})" for k, v in (block.get("settings") or {}).items()
             if v.get("differs")]
    src = block.get("closed_book_source") or {}
    cb = f"closed book from {src.get('path')}" if src.get("kind") == "shared" else "own closed-book pass"
    return f"{block.get('name')}; {cb}; " + ("as the paper" if not diffs else "differs: " + "; ".join(diffs))


def _measured(row: Mapping[str, Any]) -> bool:
    return any((c or {}).get("n") for c in (row.get("per_formulation") or {}).values())


def metric_rows_table(metrics: Mapping[str, Any], src: str, *, only: Sequence[str] | None = None,
                      fold_empty: bool = False) -> Table:
    """The metric table; ``fold_empty``: rows no episode of the run measured (n = 0 everywhere) are left out and
    counted in the caption (a demo run measures a handful of the 20-odd rows)."""
    forms = list(metrics.get("formulations") or [])
    rows = []
    folded = []
    for name, row in (metrics.get("metrics") or {}).items():
        if only is not None and name not in only:
            continue
        if fold_empty and not _measured(row):
            folded.append(name)
            continue
        rows.append([name, str(row.get("label", ""))]
                    + [fmt_cell((row.get("per_formulation") or {}).get(f)) for f in forms]
                    + [fmt_pooled(row.get("pooled"))])
    boot = metrics.get("bootstrap") or {}
    cap = (f"value% [95% CI] (k/n) per formulation; pooled = unweighted mean over formulations with n > 0 "
           f"(n summed); {boot.get('n_boot')} cluster-bootstrap draws over questions, seed {boot.get('seed')}; "
           f"{metrics.get('n_records')} records"
           + (f"; {len(folded)} rows with no episode in this run left out ({', '.join(folded)})" if folded else ""))
    return Table(["metric", "label", *forms, "pooled"], rows, source=src, caption=cap)


def measured_extra_rows(metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The control-arm rows (NoopTool, the error payloads; :data:`memtoc.scoring.metrics.CONTROL_METRICS`), the rows
    of registered conditions (memtoc.bench.conditions) and a switch composition's rows that this run measured
    (n > 0), for the compact view beside the headline rows."""
    from memtoc.scoring.metrics import CONTROL_METRICS, added_metrics

    extra = {m.name for m in (*CONTROL_METRICS, *added_metrics())}
    out = []
    for name, row in (metrics.get("metrics") or {}).items():
        if name in extra or name.startswith("switch_"):
            if _measured(row):
                out.append(name)
    return tuple(out)


def outcome_table(episodes: Sequence[Mapping[str, Any]], src: str) -> Table:
    counts: Counter = Counter()
    keys = set()
    for r in episodes:
        k = (str(r.get("arm") or r.get("condition")), str(r.get("cell")))
        keys.add(k)
        counts[(k, str(r.get("outcome")))] += 1
    rows = []
    for k in sorted(keys):
        vals = [counts[(k, o)] for o in OUTCOMES]
        rows.append([k[0], k[1], *[str(v) for v in vals], str(sum(vals))])
    return Table(["condition (arm)", "cell", *OUTCOMES, "total"], rows, source=src,
                 caption="episode counts by outcome")


def episode_table(episodes: Sequence[Mapping[str, Any]], src: str) -> Table:
    arb = [r for r in episodes if r.get("cell") == "arb"]
    arb.sort(key=lambda r: (r.get("condition") != CONFLICT_CONDITION, str(r.get("episode_id"))))
    rows = [[str(r.get("episode_id")), str(r.get("condition")), str(r.get("question")), str(r.get("gold_answer")),
             str(r.get("tool_value")), str(r.get("memory_span")), str(r.get("extracted")), str(r.get("outcome"))]
            for r in arb[:N_EPISODE_ROWS]]
    return Table(["episode", "condition", "question", "gold", "tool value", "memory span", "extracted answer",
                  "outcome"], rows, source=src,
                 caption=f"first {len(rows)} of {len(arb)} episodes in the arbitration cell (memory right, tool "
                         "wrong), tool_wrong first")


def run_sections(run: Path, base: Path, *, compact: bool = False, level: int = 2,
                 warnings: list[str] | None = None) -> list[Section]:
    view = read_run(run, warnings)
    info, episodes, state = view.info, view.episodes, view.state
    alerts = [Alert(w) for w in state.warnings()]
    fb = info.get("frame_fallback")
    if fb:   # loud: every arm of this run used the no-schema frame, not the paper's
        alerts.append(Alert(f"frame fallback: {fb.get('reason')}: frame {fb.get('used')!r} instead of the paper's "
                            f"{fb.get('paper')!r} (benchmark {fb.get('benchmark')})"))
    summary = _summary_of(run, state)
    metrics, msrc = _metrics_of(run, episodes, state, summary)
    rel = rel_path(run, base)
    pre = f"{rel}/" if rel != "." else ""
    key = anchor_id("run", rel)
    out: list[Section] = []
    ident = info.get("identity") or {}
    if compact:
        sec = Section(f"Run {rel}", key, level, source=f"{pre}run.json", blocks=list(alerts))
        sec.blocks.append(Para(f"model {ident.get('model')} (weights {short_text(ident.get('weights_sha256'))}), "
                               f"intervention {ident.get('prompt_intervention')}, frame {ident.get('frame')}, edit "
                               f"{(info.get('edit') or {}).get('name')}, status {state.describe()}, "
                               f"{len(episodes)} episodes, "
                               f"git {short_text((info.get('git') or {}).get('commit'), 10)}"))
        sec.blocks.append(metric_rows_table(metrics, pre + msrc, only=plots.HEADLINE + ("no_conflict_accuracy",)
                                            + measured_extra_rows(metrics)))
        sec.blocks.append(outcome_table(episodes, pre + "episodes.jsonl"))
        sec.blocks.append(Links([(f"{pre}{f}", f"{pre}{f}") for f in _RUN_FILES if (run / f).exists()]))
        return [sec]
    # the headline first (chart and table; alerts above them), provenance last
    out.append(Section("Headline metrics", key + "-headline", level, pre + msrc, [
        *alerts,
        Image(plots.headline_bars(metrics, title=f"{ident.get('model')}: headline metrics per formulation"),
              f"{anchor_id(run.resolve().name)}_headline",
              "bar plot of retention, correct-tool following, incorrect-tool following and tool-error abstention "
              "per formulation and pooled, with 95% intervals", pre + msrc)]))
    out.append(Section("Metrics", key + "-metrics", level, pre + msrc,
                       [metric_rows_table(metrics, pre + msrc, fold_empty=True)]))
    from memtoc.scoring.judge.sidebyside import run_layer_table

    judged = run_layer_table(run)
    if judged is not None:  # a judge pass exists: both layers side by side
        out.append(Section("Deterministic vs judged layer", key + "-judged", level, f"{pre}judge.jsonl",
                           [Table(judged[0], judged[1], source=f"{pre}judge.jsonl", caption=judged[2])]))
    out.append(Section("Outcomes by condition and cell", key + "-outcomes", level, f"{pre}episodes.jsonl",
                       [outcome_table(episodes, f"{pre}episodes.jsonl")]))
    mc = summary.get("transfer_mc")
    if mc:   # the transfer set (App. F.1): which option each answer names, unmatched share beside adoption
        rows = [{"condition": c, "n": v.get("n"), "gold": v.get("gold_rate"),
                 "counterfactual (adopted)": v.get("counterfactual_rate"), "other option": v.get("other_rate"),
                 "unmatched": v.get("unmatched_rate")} for c, v in mc.items()]
        out.append(Section("Multiple-choice reading (transfer set, App. F.1)", key + "-transfer", level,
                           f"{pre}summary.json", [_row_table(rows, f"{pre}summary.json",
                                                             "shares of the answers per condition; an unmatched "
                                                             "answer names no option or several")]))
    out.append(Section("Files", key + "-files", level, rel, [
        Links([(f, f"{pre}{f}") for f in _RUN_FILES if (run / f).exists()])]))
    out.append(Section("Arbitration-cell episodes", key + "-episodes", level, f"{pre}episodes.jsonl",
                       [episode_table(episodes, f"{pre}episodes.jsonl")]))
    out.append(Section("Provenance", key + "-provenance", level, f"{pre}run.json",
                       [provenance_table(info, f"{pre}run.json", state)]))
    return out


# -- other artifacts ------------------------------------------------------------------------------------------

def sweep_section(path: Path, base: Path) -> Section:
    d = read_json(path)
    src = rel_path(path, base)
    rows = d.get("rows") or []
    trs = []
    for r in rows:
        m, fl, pv = r.get("metrics") or {}, r.get("flips") or {}, r.get("paired_vs_0") or {}

        def mcell(n: str, m: Mapping[str, Any] = m) -> str:
            c = m.get(n) or {}
            return (f"{pct_text(c.get('value'))}% [{pct_text(c.get('ci_low'))}, {pct_text(c.get('ci_high'))}] "
                    f"(n={c.get('n')})" if c else "–")

        def flip(n: str, fl: Mapping[str, Any] = fl) -> str:
            c = fl.get(n) or {}
            return f"{pct_text(c.get('value'))}% ({c.get('k')}/{fl.get('n')})" if c else "–"

        def dflip(n: str, fl: Mapping[str, Any] = fl) -> str:
            c = fl.get(n) or {}
            if not c or c.get("value") is None:
                return "–"
            return f"{c['value']:+.3f} ({c.get('k')}/{c.get('n')}) {'✓' if c.get('passes_bar') else '✗'}"

        trs.append([f"{float(r.get('strength')):g}", str(r.get("n_episodes")), dflip("toward_memory"),
                    dflip("toward_tool"), mcell("retention"), fmt_delta(pv.get("retention")),
                    mcell("correct_tool_following"), fmt_delta(pv.get("correct_tool_following")),
                    mcell("tool_error_abstention"), flip("flip_to_memory"), flip("flip_to_tool"),
                    str((r.get("verdict") or {}).get("success"))])
    edit = d.get("edit") or {}
    sec = Section(f"Sweep {src}", anchor_id("sweep", src), 2, src)
    sec.blocks.append(Para(f"layer {d.get('layer') or 'deterministic'}"
                           + (f" (judge {(d.get('judge') or {}).get('model')})" if d.get("judge") else "") + "; "
                           f"edit {edit.get('name')} ({edit.get('kind')}, positions {edit.get('positions')}, sites "
                           f"{edit.get('layers')}), direction {d.get('direction')}, strengths "
                           f"{', '.join(f'{float(s):g}' for s in d.get('strengths') or [])}"))
    sec.blocks.append(Table(["strength", "n", "toward memory", "toward tool", "retention", "Δ retention vs 0",
                             "correct tool", "Δ correct tool",
                             "tool-error abstention", "flip to memory", "flip to tool", "criterion met"], trs,
                            source=src, caption="toward memory / toward tool = the paper's per-direction flips "
                                                "(over the arb episodes that followed the tool / kept memory at "
                                                "strength 0; ✓ = at or past +0.15); pooled rates [95% CI]; Δ = "
                                                "paired change vs strength 0 in percentage points [95% CI]; flips on "
                                                "tool_wrong (near) ∩ arb"))
    if rows:
        sec.blocks.append(Image(plots.sweep_curves(rows, title=f"{edit.get('name')} toward {d.get('direction')}"),
                                anchor_id("sweep", src), "metrics and flip rates against edit strength", src))
    return sec


def rank_section(path: Path, base: Path) -> Section:
    d = read_json(path)
    src = rel_path(path, base)
    meta = d.get("meta") or {}
    sec = Section(f"Rank table {src}", anchor_id("rank", src), 2, src)
    sec.blocks.append(Para(f"run {meta.get('run')} (model {meta.get('model')}), {meta.get('n_episodes')} episodes, "
                           f"condition {meta.get('condition')}, cell {meta.get('cell')}, lenses "
                           f"{', '.join(meta.get('lenses') or [])}, top k {meta.get('top_k')}"))
    summ = [r for r in d.get("summary") or [] if r.get("split") == "all"]
    k = meta.get("top_k")
    sec.blocks.append(Table(["lens", "behaviour", "n", "median rank", f"top {k}", "control median"],
                            [[str(r.get("lens")), str(r.get("behaviour")), str(r.get("n")), str(r.get("median_rank")),
                              str(r.get(f"top{k}")), str(r.get("control_median"))] for r in summ],
                            source=src, caption="all prompt splits; rank 1 = top token"))
    for lens in meta.get("lenses") or []:
        sec.blocks.append(Image(plots.rank_histogram(d.get("episodes") or [], lens,
                                                     title=f"{lens} lens: rank distribution per behaviour"),
                                anchor_id("rank", src, lens), f"histogram of log10 rank per behaviour ({lens} lens)",
                                src))
    return sec


def probe_section(path: Path, base: Path) -> Section:
    d = read_json(path)
    src = rel_path(path, base)
    meta = d.get("meta") or {}
    sites = d.get("sites") or []
    sec = Section(f"Probe {src}", anchor_id("probe", src), 2, src)
    sec.blocks.append(Para(f"label {meta.get('label')} ({meta.get('positive')} vs {meta.get('negative')}), "
                           f"activations {meta.get('activations')}, {meta.get('n_splits')}-fold grouped CV, "
                           f"C={meta.get('C')}"))
    if sites:
        sec.blocks.append(Image(plots.probe_auroc(sites, title=f"AUROC by layer: {meta.get('label')}"),
                                anchor_id("probe", src), "probe AUROC by layer with bootstrap interval", src))
    sec.blocks.append(Table(["site", "AUROC (pooled)", "95% CI", "fold mean ± sd"],
                            [[str(s.get("site")), fmt3(s.get("auroc_pooled")),
                              f"[{fmt3(s.get('ci_low'))}, {fmt3(s.get('ci_high'))}]",
                              f"{fmt3(s.get('auroc_mean'))} ± {fmt3(s.get('auroc_sd'))}"] for s in sites], source=src))
    return sec


def experiment_section(path: Path, base: Path) -> Section:
    d = read_json(path)
    src = rel_path(path, base)
    sec = Section(f"Experiment {d.get('name', src)}", anchor_id("experiment", src), 2, src)
    sec.blocks.append(Para(str(d.get("description", ""))))
    sec.blocks.append(Table(["step", "command", "status", "seconds"],
                            [[str(s.get("name")), " ".join(str(a) for a in s.get("argv") or []), str(s.get("status")),
                              str(s.get("seconds"))] for s in d.get("steps") or []], source=src))
    for c in d.get("comparisons") or []:
        csrc = src
        if c.get("source"):
            cp = Path(c["source"])
            csrc = rel_path(cp if cp.is_absolute() else Path.cwd() / cp, base) + f" (copied into {src})"
        sec.blocks.append(Table(["metric", "Δ (b − a) [95% CI]", "p", "p (Holm)", "n common"],
                                [[m, f"{pct_text(v.get('delta'))} "
                                     f"[{pct_text(v.get('ci_low'))}, {pct_text(v.get('ci_high'))}]",
                                  str(v.get("p_value")), str(v.get("p_adjusted")), str(v.get("n_common"))]
                                 for m, v in (c.get("comparisons") or {}).items()],
                                source=csrc, caption=f"{c.get('arm_b')} vs {c.get('arm_a')} (percentage points); "
                                                    f"verdict: {(c.get('verdict') or {}).get('reason')}"))
    return sec


def _row_table(rows: Sequence[Mapping[str, Any]], src: str, caption: str = "") -> Table:
    cols = list(rows[0].keys()) if rows else []
    return Table(cols, [[fmt_value(r.get(c)) for c in cols] for r in rows], source=src, caption=caption)


def study_section(path: Path, base: Path) -> Section:
    """The tables of a ``memtoc study --out DIR`` (its ``study.json``): Holm families, the criterion per
    formulation (Table 5's layout), paired changes, near vs far, the controls' paired contrasts, the cross-model
    z tests and the stability rule."""
    from memtoc.jobs.study.output import LAYER_NOTES, TABLE_TITLES, layer_title

    d = read_json(path)
    src = rel_path(path, base)
    tables = d.get("tables") or {}
    s = d.get("settings") or {}
    layer = str(s.get("layer") or "deterministic")   # studies written before the layer option: deterministic
    sec = Section(f"Study {rel_path(path.parent, base)} ({layer} layer)", anchor_id("study", src), 2, src)
    sec.blocks.append(Para(f"Layer: {LAYER_NOTES.get(layer, layer)}."))
    fams = d.get("families") or {}
    n_models = len({r.get("model") for r in d.get("runs") or []})
    sec.blocks.append(Para(f"{len(d.get('contrasts') or [])} contrasts over {n_models} "
                           f"models; Holm families (--holm-family {s.get('family')!r}, applied to "
                           f"{', '.join(s.get('holm_metrics') or [])}): "
                           + ("; ".join(f"{k}: {', '.join(v)}" for k, v in fams.items()) or "none")
                           + f". alpha {s.get('alpha')}, {s.get('n_boot')} bootstrap draws, {s.get('n_perm')} "
                           f"sign-flip draws, seed {s.get('seed')}."))
    matrix: dict[str, dict[str, Any]] = {}
    for r in tables.get("criterion") or []:
        matrix.setdefault(str(r.get("contrast")), {"contrast": r.get("contrast")})[str(r.get("slice"))] = r.get("code")
    if matrix:
        sec.blocks.append(_row_table(list(matrix.values()), src, layer_title(TABLE_TITLES["criterion"], layer)
                                     + ": met, or fail with "
                                     "k (retention gain not Holm-significant) and/or t (significant fall in "
                                     "correct-tool following)"))
    else:
        sec.blocks.append(Para("No arm in this study (base runs only): no paired contrast and no criterion."))
    for key in ("paired", "controls", "near_far", "ztests", "stability", "rankings", "model_pairs"):
        rows = tables.get(key) or []
        if rows:
            sec.blocks.append(_row_table(rows, src, layer_title(TABLE_TITLES.get(key, key), layer)))
        elif key == "controls":
            sec.blocks.append(Para("Controls: no run of this study has control episodes (evaluate with "
                                   "--conditions all,controls to measure NoopTool and the error payloads)."))
    return sec


# -- the document ---------------------------------------------------------------------------------------------

def _walk(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, _filenames in os.walk(root):
        p = Path(dirpath)
        depth = len(p.relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "report_assets")
        if depth >= MAX_DEPTH:
            dirnames[:] = []
        out.append(p)
    return out


def build_document(target: str | Path, out_dir: str | Path | None = None) -> Document:
    root = Path(target)
    if not root.is_dir():
        raise MemtocError(f"{root}: not a directory (give a run directory or an experiment directory)")
    base = Path(out_dir) if out_dir else root
    warnings: list[str] = []
    from memtoc.jobs.report.agent import agent_run_section, is_agent_run_dir

    if is_agent_run_dir(root):
        info = read_json(root / "run.json")
        return Document(f"MemToC agent run report: {root.resolve().name}",
                        f"run directory {root} · model {info.get('model_spec')}", [agent_run_section(root, base)],
                        warnings)
    if is_run_dir(root):
        sections = run_sections(root, base, warnings=warnings)
        info = read_json(root / "run.json")
        return Document(f"MemToC run report: {root.resolve().name}",
                        f"run directory {root} · model {(info.get('identity') or {}).get('model')}",
                        sections, warnings)
    from memtoc.jobs.report.codeexec import (codeexec_paper_table_section, codeexec_run_section, codeexec_sweep_section,
                                        is_codeexec_run_dir, is_codeexec_sweep)

    def any_sweep(path: Path, base: Path) -> Section:
        return codeexec_sweep_section(path, base) if is_codeexec_sweep(path) else sweep_section(path, base)

    # artifact file -> its section; the sections come in this order (a sweep's judged layer sits beside it)
    section_of = {"experiment.json": experiment_section, "study.json": study_section,
                  "paper_table.json": codeexec_paper_table_section, "sweep.json": any_sweep,
                  "sweep_judged.json": any_sweep, "rank_table.json": rank_section, "probe.json": probe_section}
    found: dict[Any, list[Path]] = {make: [] for make in section_of.values()}
    runs, cx_runs, agent_runs = [], [], []
    for d in _walk(root):
        if is_agent_run_dir(d):
            agent_runs.append(d)
        elif is_run_dir(d):
            runs.append(d)
        elif is_codeexec_run_dir(d):
            cx_runs.append(d)
        for name, make in section_of.items():
            if (d / name).is_file():
                found[make].append(d / name)
    sections = [make(p, base) for make, paths in found.items() for p in paths]
    if runs:
        overview = []
        for r in runs:
            view = read_run(r, warnings)
            info, eps = view.info, view.episodes
            m, msrc = _metrics_of(r, eps, view.state)
            ident = info.get("identity") or {}
            overview.append([rel_path(r, base), str(ident.get("model")), str(ident.get("prompt_intervention")),
                             str(ident.get("frame")), str((info.get("edit") or {}).get("name")),
                             view.state.describe(), str(len(eps))]
                            + [fmt_pooled(((m.get("metrics") or {}).get(n) or {}).get("pooled"))
                               for n in plots.HEADLINE])
        sections.append(Section("Runs", "runs", 2, "run.json / summary.json of each run", [
            Table(["run", "model", "intervention", "frame", "edit", "status", "episodes", "retention", "correct tool",
                   "incorrect tool", "tool-error abstention"], overview,
                  source="each run's run.json and summary.json", caption="pooled values [95% CI]")]))
        for r in runs:
            sections += run_sections(r, base, compact=True, level=3, warnings=warnings)
    if cx_runs:
        sections.append(Section("Code-executor runs", "codeexec-runs", 2, "run.json / summary.json of each run"))
        sections += [codeexec_run_section(r, base) for r in cx_runs]
    if agent_runs:
        sections.append(Section("Agent runs", "agent-runs", 2, "run.json / summary.json of each run"))
        sections += [agent_run_section(r, base, level=3) for r in agent_runs]
    if not sections:
        raise MemtocError(f"{root}: no run directory, sweep.json, rank_table.json, probe.json, study.json or "
                          "experiment.json "
                          f"found (searched {MAX_DEPTH} levels deep)")
    return Document(f"MemToC experiment report: {root.resolve().name}", f"experiment directory {root}", sections,
                    warnings)


@dataclass
class ReportResult:
    html: Path
    markdown: Path
    n_sections: int
    warnings: list[str] = field(default_factory=list)


def write_report(target: str | Path, out_dir: str | Path | None = None) -> ReportResult:
    from memtoc.jobs.report.html import render_html
    from memtoc.jobs.report.markdown import render_markdown

    from memtoc.core.fileio import write_text_atomic

    out = Path(out_dir) if out_dir else Path(target)
    doc = build_document(target, out)          # reads only; the report is the one thing written
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MemtocError(f"cannot create the report directory {out} ({exc.strerror}); pass --out to write "
                          "the report elsewhere") from None
    html_path, md_path = out / "report.html", out / "report.md"
    try:
        md_text = render_markdown(doc, out)
    except OSError as exc:
        raise MemtocError(f"{exc.filename or out}: cannot write a report plot ({exc.strerror}); pass --out to "
                          "write the report elsewhere") from None
    for path, text in ((html_path, render_html(doc)), (md_path, md_text)):
        write_text_atomic(path, text)
    return ReportResult(html=html_path, markdown=md_path, n_sections=len(doc.sections), warnings=doc.warnings)
