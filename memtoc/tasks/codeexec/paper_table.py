"""``memtoc codeexec table``: the overreliance paper's columns for one model, with the paper's numbers beside them.

Three blocks, each read from the output of a study step, never recomputed, so the table always agrees with the
files it names: adoption and override under P1 and P2 (Table 1's columns) from a ``codeexec evaluate`` run's
``summary.json``; the probe AUROC per site of the steering band, their mean and the best site from
``memtoc probe``'s ``probe.json``; and per strength P0 accuracy, P1 adoption and P1 accuracy with their paired
change against alpha = 0 (Table 40's columns) from ``memtoc codeexec sweep``'s ``sweep.json``, greedy and, when
given, sampled. The paper's numbers come from ``data/overreliance_paper.json``; cells its text does not state are
shown as "n/s".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.tasks.codeexec.resources import load_data
from memtoc.core.errors import MemtocError

__all__ = ["PaperTableConfig", "paper_numbers", "build_table", "blocks", "to_markdown", "write_table"]


@dataclass(frozen=True)
class PaperTableConfig:
    run: str
    probe: str
    sweep: str
    sampled_sweep: str | None = None
    #: Sites of the steering band; None = the edit's own sites (from sweep.json).
    band: tuple[int, ...] | None = None


def paper_numbers() -> dict[str, Any]:
    return load_data("overreliance_paper.json", schema_version="memtoc-codeexec-paper-v1",
                     required=("behaviour", "probe", "steering"))


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MemtocError(f"{path} is missing: run the {what} step first") from None
    except json.JSONDecodeError as exc:
        raise MemtocError(f"{path}: not valid JSON ({exc})") from None


def _value(est: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not est:
        return None
    v = est.get("value")
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    ci = est.get("ci") or {}
    return {"value": v, "ci_low": ci.get("low"), "ci_high": ci.get("high"), "n": est.get("n_trials")}


def _behaviour(run: Path) -> dict[str, Any]:
    summary = _read_json(run / "summary.json", "codeexec evaluate")
    info = _read_json(run / "run.json", "codeexec evaluate")
    rows = {r["condition"]: r for r in summary.get("rows", [])}
    out: dict[str, Any] = {"model": (info.get("provenance") or {}).get("model") or info.get("model_spec"),
                           "n_problems": summary.get("n_problems"), "repetitions": summary.get("repetitions")}
    for c in ("P1", "P2"):
        r = rows.get(c) or {}
        out[f"{c}_adoption"] = _value(r.get("adoption"))
        out[f"{c}_override"] = _value(r.get("override"))
    out["P0_accuracy"] = _value((rows.get("P0") or {}).get("accuracy"))
    out["no_tool_accuracy"] = _value((rows.get("no_tool") or {}).get("accuracy"))
    return out


def _probe_layer(run: Path, band: Sequence[int]) -> tuple[int, str]:
    """The probe layer the paper reads (Table 39, by family and depth) for the run's model; without the model's
    architecture in run.json, the band's middle site (said so)."""
    from memtoc.tasks.codeexec.protocol import probe_site_info

    prov = (_read_json(run / "run.json", "run").get("provenance") or {})
    if prov.get("architecture") and prov.get("n_layers"):
        return probe_site_info(str(prov["architecture"]), int(prov["n_layers"]))
    return int(band[len(band) // 2]), "FALLBACK: the steering band's middle site (run.json names no architecture)"


def _probe(probe: Path, band: Sequence[int], layer: tuple[int, str]) -> dict[str, Any]:
    doc = _read_json(probe / "probe.json", "probe")
    sites = {int(s["site"]): s for s in doc.get("sites", [])}
    missing = [s for s in band if s not in sites]
    if missing:
        raise MemtocError(f"{probe / 'probe.json'} has no probe at band site(s) {missing} (probed: {sorted(sites)})")
    per_site = [{"site": s, "auroc": sites[s]["auroc_pooled"], "ci_low": sites[s]["ci_low"],
                 "ci_high": sites[s]["ci_high"]} for s in band]
    valid = [x["auroc"] for x in per_site if x["auroc"] is not None and not math.isnan(x["auroc"])]
    best = max((s for s in sites.values() if s["auroc_pooled"] is not None and not math.isnan(s["auroc_pooled"])),
               key=lambda s: s["auroc_pooled"], default=None)
    meta = doc.get("meta", {})
    site, source = layer
    at = sites.get(site)
    return {"probe_site": site, "probe_site_source": source,
            "probe_site_auroc": None if at is None else at["auroc_pooled"],
            "band": list(band), "per_site": per_site, "band_mean": sum(valid) / len(valid) if valid else None,
            "best_site": None if best is None else best["site"], "best_auroc": None if best is None else
            best["auroc_pooled"], "n_positive": meta.get("n_positive"), "n_negative": meta.get("n_negative"),
            "positive": meta.get("positive"), "negative": meta.get("negative"), "label": meta.get("label")}


def _steering(sweep: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    doc = _read_json(sweep / "sweep.json", "sweep")
    rows = []
    for r in sorted(doc.get("rows", []), key=lambda r: r["strength"]):
        c = r["conditions"]
        p0, p1 = c.get("P0") or {}, c.get("P1") or {}

        def get(entry: Mapping[str, Any], name: str) -> float | None:
            return (entry.get(name) or {}).get("value")

        def delta(entry: Mapping[str, Any], name: str) -> float | None:
            return (entry.get(f"d_{name}") or {}).get("delta")
        rows.append({"alpha": r["strength"], "P0_accuracy": get(p0, "accuracy"), "d_P0_accuracy": delta(p0, "accuracy"),
                     "P1_adoption": get(p1, "adoption"), "d_P1_adoption": delta(p1, "adoption"),
                     "P1_accuracy": get(p1, "accuracy"), "d_P1_accuracy": delta(p1, "accuracy")})
    return rows, doc


def build_table(cfg: PaperTableConfig) -> dict[str, Any]:
    greedy, doc = _steering(Path(cfg.sweep))
    band = tuple(cfg.band) if cfg.band else tuple(int(s) for s in (doc.get("edit") or {}).get("layers", ()))
    if not band:
        raise MemtocError(f"{cfg.sweep}/sweep.json names no edit sites; give the band explicitly")
    sampled, sdoc = _steering(Path(cfg.sampled_sweep)) if cfg.sampled_sweep else (None, {})
    sampled_reps = (sdoc.get("config") or {}).get("repetitions")
    return {"schema_version": "memtoc-codeexec-paper-table-v1", "behaviour": _behaviour(Path(cfg.run)),
            "probe": _probe(Path(cfg.probe), band, _probe_layer(Path(cfg.run), band)),
            "steering": {"greedy": greedy, "sampled": sampled, "sampled_repetitions": sampled_reps,
                         "edit": doc.get("edit", {}).get("name")},
            "paper": paper_numbers(), "sources": {"run": cfg.run, "probe": cfg.probe, "sweep": cfg.sweep,
                                                  "sampled_sweep": cfg.sampled_sweep}}


def _pct(x: Any) -> str:
    if isinstance(x, Mapping):
        x = x.get("value")
    return "n/s" if x is None else f"{100 * float(x):.1f}%"


def _pct_ci(e: Mapping[str, Any] | None) -> str:
    if not e:
        return "n/a"
    if e.get("ci_low") is None:
        return _pct(e)
    return f"{_pct(e)} [{100 * e['ci_low']:.0f}, {100 * e['ci_high']:.0f}]"


def _pp(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f}"


def _auc(x: Any) -> str:
    return "n/s" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{float(x):.3f}"


def blocks(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The table's three blocks as ``{title, headers, rows, caption}`` (shared by the Markdown file and the
    experiment report, so both show the same cells)."""
    b, pr, st, paper = table["behaviour"], table["probe"], table["steering"], table["paper"]
    band = f"{pr['band'][0]}–{pr['band'][-1]}" if len(pr["band"]) > 1 else str(pr["band"][0])
    rows = [[str(b["model"]), _pct_ci(b["P1_adoption"]), _pct_ci(b["P1_override"]), _pct_ci(b["P2_adoption"]),
             _pct_ci(b["P2_override"])]]
    rows += [[r["model"], _pct(r["P1_adoption"]), _pct(r["P1_override"]), _pct(r["P2_adoption"]),
              _pct(r["P2_override"])] for r in paper["behaviour"]["rows"]]
    out = [{"title": "Adoption and override (paper Table 1 columns)",
            "headers": ["model", "P1 adoption", "P1 override", "P2 adoption", "P2 override"], "rows": rows,
            "caption": f"{b['n_problems']} problems x {b['repetitions']} repetition(s) [95% problem-bootstrap CI]; "
                       f"P0 accuracy {_pct_ci(b['P0_accuracy'])}, no-tool accuracy {_pct_ci(b['no_tool_accuracy'])}; "
                       "n/s = not stated in the paper's text"}]
    rows = [[str(b["model"]), band, ", ".join(f"{x['site']}: {_auc(x['auroc'])}" for x in pr["per_site"]),
             _auc(pr["band_mean"]), f"{pr['best_site']} ({_auc(pr['best_auroc'])})",
             f"{pr['n_positive']} {pr['positive']} / {pr['n_negative']} {pr['negative']}",
             f"{pr.get('probe_site')} ({_auc(pr.get('probe_site_auroc'))})"
             + ("; fallback" if str(pr.get("probe_site_source", "")).startswith("FALLBACK") else "")]]
    rows += [[f"{r['model']} (paper)", f"{r['steering_band'][0]}–{r['steering_band'][1]}", "n/s", "n/s",
              "n/s", "n/s", f"Table 39 layer, n/s ({_auc(r['auroc'])})"]
             for r in paper["probe"]["rows"]]
    out.append({"title": "Probe AUROC per layer band (accepted correct vs adopted corrupted return)",
                "headers": ["model", "band (sites)", "AUROC per band site", "band mean", "best site (AUROC)",
                            "episodes (+ / −)", "probe layer (AUROC)"], "rows": rows,
                "caption": "pooled out-of-fold AUROC, folds grouped by problem; the probe layer is the paper's "
                           "fixed Table 39 layer for the model's family where known, else the steering band's "
                           f"middle site ({pr.get('probe_site_source')})"})
    for name in ("greedy", "sampled"):
        srows = st.get(name)
        if not srows:
            continue
        title = "greedy" if name == "greedy" else f"sampled, mean of {st.get('sampled_repetitions')} repetitions"
        out.append({"title": f"Steering over sites {band}: alpha x unit x |projection gap|, {title}",
                    "headers": ["alpha", "P0 accuracy", "Δ", "P1 adoption", "Δ", "P1 accuracy", "Δ"],
                    "rows": [[f"{r['alpha']:g}", _pct(r["P0_accuracy"]), _pp(r["d_P0_accuracy"]),
                              _pct(r["P1_adoption"]), _pp(r["d_P1_adoption"]), _pct(r["P1_accuracy"]),
                              _pp(r["d_P1_accuracy"])] for r in srows],
                    "caption": "from the first tool return on; Δ = paired change against alpha = 0 in percentage "
                               "points (held-out problems). Paper (Figure 4 / Table 40): " + "; ".join(
                                   f"{r['model']}, alpha {r['alpha']}: {r['finding']}"
                                   for r in paper["steering"]["rows"])})
    return out


def to_markdown(table: Mapping[str, Any]) -> str:
    lines = ["# The overreliance paper's code-executor table", "",
             f"Model: {table['behaviour']['model']}. Paper rows are quoted from the paper "
             "(memtoc/tasks/codeexec/data/overreliance_paper.json).", ""]
    for blk in blocks(table):
        lines += [f"## {blk['title']}", "", "| " + " | ".join(blk["headers"]) + " |",
                  "|" + "|".join("---" for _ in blk["headers"]) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in blk["rows"]]
        lines += ["", blk["caption"], ""]
    return "\n".join(lines)


def write_table(cfg: PaperTableConfig, out: str | Path) -> dict[str, Path]:
    from memtoc.core.fileio import write_json_atomic, write_text_atomic

    table = build_table(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "paper_table.json", "markdown": out / "paper_table.md"}
    write_json_atomic(paths["json"], table)
    write_text_atomic(paths["markdown"], to_markdown(table))
    return paths
