"""Report plots: each function returns PNG bytes (matplotlib, Agg backend), embedded by the HTML page."""

from __future__ import annotations

import io
import math
from typing import Any, Mapping, Sequence

HEADLINE = ("retention", "correct_tool_following", "incorrect_tool_following", "tool_error_abstention")
HEADLINE_LABELS = {"retention": "retention", "correct_tool_following": "correct-tool\nfollowing",
                   "incorrect_tool_following": "incorrect-tool\nfollowing",
                   "tool_error_abstention": "tool-error\nabstention"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and x is not None and math.isfinite(float(x)) else float("nan")


def headline_bars(metrics: Mapping[str, Any], *, title: str = "") -> bytes:
    """Grouped bars: headline metric x (formulations + pooled), error bars = the table's intervals. A measured
    0 % is drawn (a thick line at the axis and "0%"), so it never looks like a missing value ("n=0")."""
    plt = _plt()
    forms = list(metrics.get("formulations") or [])
    series = forms + ["pooled"]
    rows = metrics.get("metrics") or {}
    names = [m for m in HEADLINE if m in rows]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / max(len(series), 1)
    for j, s in enumerate(series):
        vals, lo, hi = [], [], []
        for m in names:
            cell = rows[m]["pooled"] if s == "pooled" else (rows[m].get("per_formulation") or {}).get(s, {})
            v, a, b = _num(cell.get("value")), _num(cell.get("ci_low")), _num(cell.get("ci_high"))
            vals.append(100 * v)
            lo.append(0 if math.isnan(a) or math.isnan(v) else max(0.0, 100 * (v - a)))
            hi.append(0 if math.isnan(b) or math.isnan(v) else max(0.0, 100 * (b - v)))
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, [0 if math.isnan(v) else v for v in vals], width, yerr=[lo, hi], capsize=3, label=s,
                      hatch="//" if s == "pooled" else None, alpha=0.85)
        for x, v, bar in zip(xs, vals, bars):
            if math.isnan(v):                   # nothing measured: no bar, said in words
                ax.text(x, 1, "n=0", ha="center", va="bottom", fontsize=7, rotation=90)
            elif v == 0:                        # measured 0 %: a zero-height bar is invisible, so mark it
                ax.plot([x - width / 2, x + width / 2], [0.6, 0.6], color=bar.get_facecolor(), lw=3,
                        solid_capstyle="butt")
                ax.text(x, 1.5, "0%", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([HEADLINE_LABELS[m] for m in names], fontsize=8)
    ax.set_ylabel("% (95% cluster-bootstrap CI)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, ncol=len(series))
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def _band_curve(ax: Any, xs: Sequence[float], cells: Sequence[Mapping[str, Any]], label: str) -> None:
    """One rate (``value``, ``ci_low``, ``ci_high`` per x) in percent, with its interval as a band."""
    ax.plot(xs, [100 * _num(c.get("value")) for c in cells], marker="o", ms=3, label=label)
    lo = [100 * _num(c.get("ci_low")) for c in cells]
    hi = [100 * _num(c.get("ci_high")) for c in cells]
    if not all(math.isnan(v) for v in lo + hi):
        ax.fill_between(xs, lo, hi, alpha=0.15)


def _strength_axis(ax: Any, title: str) -> None:
    ax.set_xlabel("strength")
    ax.set_ylabel("%")
    ax.set_ylim(-3, 103)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _strength_panels(rows: Sequence[Mapping[str, Any]], panels: Sequence[tuple[str, Sequence[tuple[str, Any]]]],
                     title: str) -> bytes:
    """Two panels of rates against edit strength: ``panels`` = ``[(panel title, [(label, row -> cell)])]``."""
    plt = _plt()
    rows = sorted(rows, key=lambda r: float(r["strength"]))     # the baseline comes first in the table, not here
    xs = [float(r["strength"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    for ax, (label, curves) in zip(axes, panels):
        for name, get in curves:
            cells = [get(r) or {} for r in rows]
            if any(cells):
                _band_curve(ax, xs, cells, name)
        _strength_axis(ax, label)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


def sweep_curves(rows: Sequence[Mapping[str, Any]], *, title: str = "") -> bytes:
    """Pooled metrics and flip rates against edit strength, with interval bands."""
    left = [(n, lambda r, n=n: (r.get("metrics") or {}).get(n)) for n in HEADLINE]
    right = [(n, lambda r, n=n: (r.get("flips") or {}).get(n)) for n in ("flip_to_memory", "flip_to_tool")]
    right += [(n, lambda r, n=n: (r.get("format") or {}).get(n)) for n in ("final_line_rate", "degenerate_rate")]
    return _strength_panels(rows, [("pooled metrics", left), ("flips (arb cell) and format", right)], title)


def rank_histogram(episodes: Sequence[Mapping[str, Any]], lens: str, *, title: str = "") -> bytes:
    """Histogram of log10(rank) of the memory answer's token per behaviour (one lens)."""
    plt = _plt()
    by: dict[str, list[float]] = {}
    for ep in episodes:
        d = (ep.get("lenses") or {}).get(lens)
        if not d or d.get("rank") is None:
            continue
        by.setdefault(str(ep.get("behaviour")), []).append(math.log10(max(1, int(d["rank"]))))
    fig, ax = plt.subplots(figsize=(7, 3.4))
    allv = [v for vs in by.values() for v in vs]
    top = max(allv) if allv else 1.0
    bins = [i * 0.25 for i in range(int(top / 0.25) + 2)]
    for beh, vals in sorted(by.items()):
        ax.hist(vals, bins=bins, alpha=0.55, label=f"{beh} (n={len(vals)})")
    ax.set_xlabel("log10(rank) of the memory answer's first token (1 = top)")
    ax.set_ylabel("episodes")
    ax.legend(fontsize=7)
    ax.set_title(title or f"{lens} lens", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def probe_auroc(sites: Sequence[Mapping[str, Any]], *, title: str = "") -> bytes:
    """Pooled out-of-fold AUROC by site with the bootstrap interval."""
    plt = _plt()
    xs = [int(s["site"]) for s in sites]
    ys = [_num(s.get("auroc_pooled")) for s in sites]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.fill_between(xs, [_num(s.get("ci_low")) for s in sites], [_num(s.get("ci_high")) for s in sites],
                    alpha=0.25, label="95% bootstrap interval")
    ax.plot(xs, ys, marker="o", ms=3, label="pooled out-of-fold AUROC")
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("site (0 = embeddings, s = output of block s-1)")
    ax.set_ylabel("AUROC")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def codeexec_sweep_curves(rows: Sequence[Mapping[str, Any]], conditions: Sequence[str], *, title: str = "") -> bytes:
    """Code-executor sweep: accuracy and adoption per condition against edit strength, with interval bands."""
    panels = [(name, [(c, lambda r, c=c, name=name: ((r.get("conditions") or {}).get(c) or {}).get(name))
                      for c in conditions])
              for name in ("accuracy", "adoption")]
    return _strength_panels(rows, panels, title)
