"""The outputs of ``memtoc mine-features``: the feature table (``features.csv`` / ``features.md``), ``mining.json``
and the edit spec ``edit.json``, each written atomically (temporary file, then rename).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np


@dataclass
class LayerResult:
    """One site's mining result: ``steering.mining`` makes it, the writers below lay it out."""

    site: int
    n_latents: int
    mi: np.ndarray
    expectation: np.ndarray
    freq: dict[str, np.ndarray]
    mean_kept: np.ndarray
    mean_followed: np.ndarray
    selection: dict[str, Any]
    targets: dict[str, np.ndarray]
    agreement: dict[str, Any]
    fvu: float
    mi_seconds: float
    mi_rank: np.ndarray = field(repr=False, default=None)        # rank (1-based) of every latent by MI
    freq_rank: np.ndarray = field(repr=False, default=None)
    top_tokens: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


TABLE_COLUMNS = ("site", "feature", "side", "role", "mi", "mi_rank", "freq_score", "freq_rank", "delta_freq",
                 "expectation", "mean_kept", "mean_followed", "target", "top_tokens")


def feature_rows(layers: Mapping[int, LayerResult], steer_toward: str) -> list[dict[str, Any]]:
    out = []
    for s, r in sorted(layers.items()):
        for side in ("memory", "tool"):
            for j, target in zip(r.selection[side], r.targets[side]):
                role = "add" if side == steer_toward else "remove"
                toks = r.top_tokens.get(int(j), [])
                out.append({
                    "site": s, "feature": int(j), "side": side, "role": role, "mi": float(r.mi[j]),
                    "mi_rank": int(r.mi_rank[j]), "freq_score": float(r.freq["score"][j]),
                    "freq_rank": int(r.freq_rank[j]), "delta_freq": float(r.freq["delta"][j]),
                    "expectation": float(r.expectation[j]), "mean_kept": float(r.mean_kept[j]),
                    "mean_followed": float(r.mean_followed[j]), "target": float(target),
                    "top_tokens": [(t["token"], round(t["value"], 4)) for t in toks],
                })
    out.sort(key=lambda d: (d["site"], d["mi_rank"]))
    return out


def _md_token(tok: str) -> str:
    s = json.dumps(tok, ensure_ascii=False)[1:-1]
    return s.replace("|", "\\|").replace("`", "'")


def write_outputs(out: Path, spec: Mapping[str, Any], report: Mapping[str, Any], layers: Mapping[int, LayerResult],
                  steer_toward: str) -> Path:
    from memtoc.core.fileio import write_json_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    rows = feature_rows(layers, steer_toward)
    with (out / "features.csv.tmp").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "top_tokens": json.dumps(r["top_tokens"], ensure_ascii=False)})
    os.replace(out / "features.csv.tmp", out / "features.csv")
    lines = [f"# Mined SAE features: {spec['name']}", "",
             f"Steer toward **{steer_toward}** (remove the {'tool' if steer_toward == 'memory' else 'memory'}-side "
             f"latents, add the {steer_toward}-side latents). Fit fold {report['fit_fold']}, evaluation fold(s) "
             f"{', '.join(report['eval_folds'])}; {report['counts']['kept_memory']} kept-memory and "
             f"{report['counts']['followed_tool']} followed-tool episodes from {report['counts']['mining_questions']} "
             f"questions. MI estimator `{report['config']['estimator']}`, budget {report['config']['budget']}.", "",
             "| site | latents | total MI | K | memory | tool | top-20 agreement (overlap / Jaccard) | FVU |",
             "|---:|---:|---:|---:|---:|---:|---|---:|"]
    for s, r in sorted(layers.items()):
        a = r.agreement
        lines.append(f"| {s} | {r.n_latents} | {r.selection['total_mi']:.4f} | {r.selection['k']} | "
                     f"{len(r.selection['memory'])} | {len(r.selection['tool'])} | {a['overlap']}/{a['k']} / "
                     f"{a['jaccard']:.2f} | {r.fvu:.3f} |")
    lines += ["", "| site | feature | side | role | MI | MI rank | freq sep | freq rank | Δfreq | E | target | "
                  "top-activating tokens |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        toks = ", ".join(f"`{_md_token(t)}` ({v:.2f})" for t, v in r["top_tokens"]) or "–"
        lines.append(f"| {r['site']} | {r['feature']} | {r['side']} | {r['role']} | {r['mi']:.4f} | {r['mi_rank']} | "
                     f"{r['freq_score']:.3f} | {r['freq_rank']} | {r['delta_freq']:+.3f} | {r['expectation']:+.4f} | "
                     f"{r['target']:.4f} | {toks} |")
    lines += ["", "Δfreq = P(z>0 | kept memory) − P(z>0 | followed tool); E = mean(z | kept) − mean(z | followed); "
                  "target = mean code of the latent over the episodes of its side's behaviour. Top tokens: the store's "
                  "`all` rows of fit-fold questions (first token excluded).", ""]
    write_text_atomic(out / "features.md", "\n".join(lines))
    write_json_atomic(out / "mining.json", dict(report))
    spec_path = out / "edit.json"
    write_json_atomic(spec_path, dict(spec))
    return spec_path
