"""The feature-dashboard job (``memtoc features``, ``mt.features``): one HTML page for a mining run's latents.

Reads the mining directory (``memtoc mine-features --out``: its feature table, and the report naming the SAEs and
the activation store), computes each latent's view (:mod:`steering.dashboard`) and writes ``features.html``
(self-contained: no script, no remote asset) and ``features.json``. ``memtoc report`` links the page when it sits
beside the run's report.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from memtoc.core.options import opt

__all__ = ["FeaturesConfig", "FeaturesJobResult", "run_features", "render_html"]


@dataclass
class FeaturesConfig:
    """``memtoc features``: the dashboard of the latents a mining run selected."""

    mining: str = field(default="", metadata=opt("mining directory (memtoc mine-features --out)", required=True,
                                                 role="input-dir"))
    out: str = field(default="features", metadata=opt("output directory (features.html, features.json)",
                                                      required=True, role="output-dir"))
    activations: str | None = field(default=None, metadata=opt(
        "activation store with the 'all' rows at the SAE's site (default: the store the mining read)",
        role="input-store"))
    contexts: int = field(default=8, metadata=opt("top-activating contexts shown per latent", low=1, high=100))
    window: int = field(default=10, metadata=opt("tokens shown on each side of a context's peak", low=1, high=200))
    limit: int | None = field(default=None, metadata=opt("only the first N latents of the table (by MI rank)", low=1))


@dataclass
class FeaturesJobResult:
    views: list[Any]
    files: dict[str, Path] = field(default_factory=dict)


def run_features(cfg: FeaturesConfig, *, backend: Any = None, edit: Any = None,
                 log: Callable[[str], None] | None = None) -> FeaturesJobResult:
    """Each mined latent's contexts, conditions and spans, written as one page."""
    from activations.store import open_store
    from memtoc.core.fileio import write_json_atomic
    from steering.dashboard import feature_views, read_feature_table
    from steering.mi import MiningError
    from steering.sae import load_sae

    rows, report = read_feature_table(cfg.mining)
    store_path = cfg.activations or (report.get("config") or {}).get("activations")
    if not store_path or not Path(store_path).is_file():
        raise MiningError(f"the activation store {store_path!r} of {cfg.mining} is not there; pass --activations")
    rows = sorted(rows, key=lambda r: (int(float(r.get("mi_rank") or 0)), int(r["site"])))
    if cfg.limit is not None:
        rows = rows[:cfg.limit]
    saes = {int(s): load_sae(v["ref"], base_dir=cfg.mining) for s, v in (report.get("sae") or {}).items()
            if int(s) in {int(r["site"]) for r in rows}}
    with open_store(store_path) as store:
        views = feature_views(store, saes, rows, n_contexts=cfg.contexts, window=cfg.window)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"html": out / "features.html", "json": out / "features.json"}
    files["html"].write_text(render_html(views, report, str(cfg.mining)), encoding="utf-8")
    write_json_atomic(files["json"], {"mining": str(cfg.mining), "activations": str(store_path),
                                      "features": [v.to_dict() for v in views]})
    return FeaturesJobResult(views, files)


_CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px}h2{font-size:17px;margin:28px 0 6px}table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f4f4f4}
.ctx{font-family:ui-monospace,monospace;font-size:13px;line-height:1.9;margin:3px 0;white-space:pre-wrap}
.tok{border-radius:3px;padding:1px 0}.peak{outline:2px solid #b00;outline-offset:1px}
.meta{color:#666;font-size:12px}.memory{color:#1f6f3f}.tool{color:#a33}"""


def _num(x: float, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _token_html(tok: str, value: float, top: float, peak: bool) -> str:
    alpha = 0.0 if top <= 0 else max(0.0, min(1.0, value / top))
    shown = html.escape(tok.replace("Ġ", " ").replace("Ċ", "\\n"))
    cls = "tok peak" if peak else "tok"
    return (f'<span class="{cls}" style="background:rgba(230,120,20,{alpha:.2f})" '
            f'title="{value:.3f}">{shown}</span>')


def render_html(views: Sequence[Any], report: dict[str, Any], mining: str) -> str:
    """The dashboard page: a summary table, then one section per latent."""
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Mined SAE features</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>Mined SAE features</h1>",
             f"<p class='meta'>mining {html.escape(mining)}; fit fold {html.escape(str(report.get('fit_fold')))}; "
             f"{len(views)} latents</p>"]
    unsplit = max((getattr(v, "unsplit_episodes", 0) for v in views), default=0)
    spans = ("question", "tool value", "rest") + (("unknown",) if unsplit else ())
    if unsplit:
        parts.append(f"<p class='meta unsplit'><b>Spans not split for {unsplit} episode(s)</b>: they have a tool "
                     "return but the activation store holds no <code>tool_span</code> rows for them, so their "
                     "tokens are counted as <i>unknown</i>, not as question or tool value (extract with "
                     "<code>--position-kinds last_input,all,tool_span</code> to split them)</p>")
    parts.append("<table><tr><th>site</th><th>latent</th><th>side</th><th>role</th><th>MI</th><th>MI rank</th>"
                 "<th>mean code: question</th>" + "".join(f"<th>{s}</th>" for s in spans[1:]) + "</tr>")
    for v in views:
        parts.append(f"<tr><td>{v.site}</td><td><a href='#f{v.site}-{v.feature}'>{v.feature}</a></td>"
                     f"<td class='{html.escape(v.side)}'>{html.escape(v.side)}</td><td>{html.escape(v.role)}</td>"
                     f"<td>{_num(v.mi, 4)}</td><td>{v.mi_rank}</td>"
                     + "".join(f"<td>{_num(v.by_span.get(s, {}).get('mean'))}</td>"
                               for s in spans) + "</tr>")
    parts.append("</table>")
    for v in views:
        parts.append(f"<h2 id='f{v.site}-{v.feature}'>site {v.site}, latent {v.feature} "
                     f"<span class='{html.escape(v.side)}'>({html.escape(v.side)} side, {html.escape(v.role)})</span>"
                     f"</h2><p class='meta'>MI {_num(v.mi, 4)} (rank {v.mi_rank})</p>")
        parts.append("<table><tr><th></th><th>mean code</th><th>firing rate</th><th>tokens</th></tr>")
        for label, stats in [*v.by_condition.items(),
                             *((f"span: {k}", s) for k, s in v.by_span.items() if k in spans)]:
            parts.append(f"<tr><th>{html.escape(label)}</th><td>{_num(stats['mean'])}</td>"
                         f"<td>{_num(stats['firing'])}</td><td>{stats['n_tokens']}</td></tr>")
        parts.append("</table>")
        top = max([c["value"] for c in v.contexts] + [0.0])
        if not v.contexts:
            parts.append("<p class='meta'>the latent never fires on the stored tokens</p>")
        for c in v.contexts:
            toks = "".join(_token_html(t, val, top, i == c["peak"]) for i, (t, val) in enumerate(c["tokens"]))
            parts.append(f"<div class='ctx'>{toks}</div><div class='meta'>{html.escape(c['episode_id'])} "
                         f"({html.escape(c['condition'])}), peak {_num(c['value'])}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)
