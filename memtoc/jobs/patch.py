"""The patching job (``memtoc patch``, ``mt.patch``): where the memory-versus-tool decision is made.

For every question of a run with both conditions of the pair (default ``tool_right`` clean, ``tool_wrong``
corrupt), the two prompts run with ``FINAL: `` teacher-forced, and each hook point x role of the clean run is
patched into the corrupt one (:mod:`probes.patching`). The metric is ``log p(memory answer) - log p(tool value)``
at the first answer token (the memory answer is the run's closed-book span, the tool value the corrupt
condition's). Roles: ``question`` (the user prompt before the tool output), ``tool_span`` (the tool output, aligned
from its end when the two values differ in length) and ``final`` (the last token of the teacher-forced prefix).

``method``: ``attribution`` (one backward per pair, every cell), ``exact`` (every cell patched), or ``both``
(attribution everywhere, exact on the ``top_cells`` cells of largest mean |attribution|, and their agreement).
Output: ``patch.json`` / ``patch.csv``, ``patch_pairs.csv``, ``patch.png`` (heat map), ``patch.md``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from memtoc.core.options import opt, option

__all__ = ["PatchConfig", "PatchJobResult", "run_patch"]

METHODS = ("both", "attribution", "exact")


@dataclass
class PatchConfig:
    """``memtoc patch``: activation patching of a clean/corrupt condition pair over a run's questions."""

    run: str = field(default="", metadata=opt("run directory (memtoc evaluate --out) whose closed-book answers "
                                              "give the memory answer", required=True, role="input-run"))
    out: str = field(default="patch", metadata=opt("output directory (patch.json / .csv / .md / .png, "
                                                   "patch_pairs.csv)", required=True, role="output-dir"))
    model: str = field(default="default", metadata=option("model"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="float32", metadata=opt("float32 (default: gradients) | bfloat16 | float16"))
    pair: str = field(default="tool_right:tool_wrong", metadata=opt(
        "CLEAN:CORRUPT conditions of one question and formulation; the clean run is patched into the corrupt"))
    components: str = field(default="resid,attn,mlp", metadata=opt(
        "comma list of resid (block output), attn (attention output), mlp (MLP output)"))
    layers: str = field(default="all", metadata=opt(
        "sites to patch, numbered as every command numbers them (s = output of block s-1, so site s patches block "
        "s-1's residual output, attention and MLP): all | N | N-M, comma separated; 1..L"))
    roles: str = field(default="question,tool_span,final", metadata=opt("comma list of question, tool_span, "
                                                                         "final"))
    method: str = field(default="both", metadata=opt("attribution (fast, first order), exact (every cell), or "
                                                     "both (attribution, then exact on the top cells)",
                                                     choices=METHODS))
    top_cells: int = field(default=12, metadata=opt("cells exact patching confirms with --method both", low=1))
    limit: int | None = field(default=None, metadata=option("limit"))
    batch_rows: int = field(default=32, metadata=opt("patched variants per forward", low=1))
    seed: int = field(default=0, metadata=opt("seed of the bootstrap intervals", low=0))
    n_boot: int = field(default=1000, metadata=option("n_boot"))
    progress: bool = field(default=True, metadata=option("progress"))
    heads: bool = field(default=True, metadata=opt("skip the per-head tables (attention from the answer position "
                                                   "to the tool span; direct logit attribution)",
                                                   flag="--no-heads"))


@dataclass
class PatchJobResult:
    table: list[dict[str, Any]]          # one row per hook name x role
    pairs: list[dict[str, Any]]          # one row per pair x name x role x method
    meta: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)
    attention: list[dict[str, Any]] = field(default_factory=list)   # block x head x condition
    dla: list[dict[str, Any]] = field(default_factory=list)         # component (and head) x condition

    def to_pandas(self) -> Any:
        import pandas as pd

        return pd.DataFrame(self.table)


def _split(text: str, allowed: Sequence[str], what: str) -> list[str]:
    from memtoc.core.values import ConfigError

    items = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise ConfigError(f"--{what} {text!r}: choose from {', '.join(allowed)}")
    return items


def check_patch_config(cfg: PatchConfig) -> tuple[str, str, list[str], list[str]]:
    """Everything checkable without the model: the pair, components and roles (one line each)."""
    from memtoc.core.values import ConfigError
    from memtoc.core.vocab import ALL_CONDITIONS
    from probes.patching import COMPONENTS, ROLES

    clean, _, corrupt = cfg.pair.partition(":")
    if not corrupt or clean not in ALL_CONDITIONS or corrupt not in ALL_CONDITIONS or clean == corrupt:
        raise ConfigError(f"--pair {cfg.pair!r}: give two different conditions CLEAN:CORRUPT of "
                          f"{', '.join(ALL_CONDITIONS)}")
    return clean, corrupt, _split(cfg.components, tuple(COMPONENTS), "components"), _split(cfg.roles, ROLES, "roles")


def _episodes(run_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(episode_id -> planned Episode, episode_id -> scored record) of the run: the prompts exactly as run."""
    from types import SimpleNamespace

    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import plan_episodes
    from memtoc.runs.runstore import RunStore

    store = RunStore.read(run_dir, warn=None)
    conf = (store.run_info().get("config") or {})
    selection = ("question_set", "limit", "formulations", "conditions")
    intervention = ("frame", "prompt_intervention", "closed_book")
    ns = SimpleNamespace(selection=SimpleNamespace(**{k: conf.get(k) for k in selection}),
                         intervention=SimpleNamespace(**{k: conf.get(k) for k in intervention}))
    eps = {e.episode_id: e for e in plan_episodes(ns, load_benchmark(conf.get("benchmark") or "demo"))}
    return eps, {str(r["episode_id"]): r for r in store.episodes.records()}


def _tokens(backend: Any, text: str) -> tuple[list[int], np.ndarray]:
    from memtoc.backends.chat import add_special_tokens

    enc = backend.tokenizer(text, add_special_tokens=add_special_tokens(backend.chat), return_offsets_mapping=True)
    return list(enc["input_ids"]), np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)


def _covering(offsets: np.ndarray, start: int, end: int) -> list[int]:
    return [i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start]


def _sequence(backend: Any, ep: Any, memory: str, tool_value: str) -> dict[str, Any] | None:
    """The episode's prompt with ``FINAL: `` teacher-forced: ids, role positions, the two answer tokens (None when
    the two answers do not share that prefix's tokenization, or a span does not map)."""
    from activations.positions import PositionSpecError, user_span_in_text
    from probes.answer import ANSWER_PREFIX

    text = backend.format_prompt(ep.prompt)
    cut = len(text) + len(ANSWER_PREFIX)
    heads = []
    for answer in (memory, tool_value):
        ids, offs = _tokens(backend, text + ANSWER_PREFIX + answer)
        k = next((i for i, (a, b) in enumerate(offs) if b > a and b > cut), None)
        if k is None or k == 0:
            return None
        heads.append((ids[:k], ids[k], offs[:k]))
    (ids_a, a, offs), (ids_b, b, _) = heads
    if ids_a != ids_b or a == b:
        return None
    roles: dict[str, list[int]] = {"final": [len(ids_a) - 1], "tool_span": [], "question": []}
    if ep.tool_output_span is not None:
        try:
            t0, t1 = user_span_in_text(text, ep.prompt, tuple(ep.tool_output_span))
        except PositionSpecError:
            return None
        roles["tool_span"] = _covering(offs, t0, t1)
        u0 = text.find(ep.prompt)
        roles["question"] = [i for i in _covering(offs, max(u0, 0), t0) if i not in roles["tool_span"]]
    return {"ids": ids_a, "a": a, "b": b, "roles": roles}


def build_pairs(backend: Any, run_dir: str, clean: str, corrupt: str, limit: int | None = None
                ) -> tuple[list[Any], dict[str, int]]:
    """The run's clean/corrupt pairs (:class:`probes.patching.PatchPair`) and why the others were skipped."""
    from probes.patching import PatchPair, align_positions

    eps, recs = _episodes(run_dir)
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for eid, ep in eps.items():
        if eid in recs and ep.arm in (clean, corrupt):
            by_key.setdefault((str(ep.question.id), ep.formulation), {})[ep.arm] = ep
    skipped = {"memory absent": 0, "no tool value": 0, "answers share no prefix": 0}
    pairs = []
    for (qid, form), both in sorted(by_key.items()):
        if clean not in both or corrupt not in both:
            continue
        rc = recs[both[corrupt].episode_id]
        memory = "" if rc.get("mem_absent") else str(rc.get("memory_span") or "").strip()
        tool_value = both[corrupt].tool_value
        if not memory:
            skipped["memory absent"] += 1
            continue
        if not tool_value:
            skipped["no tool value"] += 1
            continue
        c, k = (_sequence(backend, both[x], memory, tool_value) for x in (clean, corrupt))
        if c is None or k is None or (c["a"], c["b"]) != (k["a"], k["b"]):
            skipped["answers share no prefix"] += 1
            continue
        positions = {r: align_positions(c["roles"][r], k["roles"][r]) for r in c["roles"]}
        pairs.append(PatchPair(f"{qid}|{form}", c["ids"], k["ids"], positions, (c["a"], k["b"]),
                               meta={"question_id": qid, "formulation": form, "memory": memory,
                                     "tool_value": tool_value, "cell": rc.get("cell")}))
        if limit is not None and len({p.meta["question_id"] for p in pairs}) >= limit:
            break
    return pairs, skipped


def parse_blocks(spec: str, n_blocks: int) -> tuple[int, ...] | None:
    """``--layers`` (``all`` | N | N-M, comma separated: residual sites, site s = output of block s - 1, the
    numbering of extract, rank-table and edits) -> the blocks whose outputs they are (None: every block); one line
    naming the range. Site 0, the embedding output, is no block's output."""
    from memtoc.backends.parts import SiteSpecError, parse_sites
    from memtoc.core.values import ConfigError

    if str(spec).strip() == "all":
        return None
    try:
        sites = parse_sites(spec, n_blocks + 1)
    except SiteSpecError:
        sites = (0,)
    if 0 in sites:
        raise ConfigError(f"--layers {spec!r}: this model has sites 1..{n_blocks} to patch (site s = output of "
                          "block s-1; site 0, the embedding output, is no block's; all | N | N-M, comma separated)")
    return tuple(s - 1 for s in sites)


def _bootstrap(values: np.ndarray, groups: Sequence[str], n_boot: int, seed: int) -> tuple[float, float]:
    ok = ~np.isnan(values)
    if ok.sum() < 2:
        return float("nan"), float("nan")
    vals, grp = values[ok], np.asarray(groups)[ok]
    uniq = sorted(set(grp))
    by = [vals[grp == g] for g in uniq]
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    for i in range(n_boot):
        pick = rng.integers(0, len(by), len(by))
        means[i] = np.concatenate([by[j] for j in pick]).mean()
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def run_patch(cfg: PatchConfig, *, backend: Any = None, edit: Any = None,
              log: Callable[[str], None] | None = None) -> PatchJobResult:
    """Patch ``cfg.pair`` over the run's questions and write the table, the per-pair frame and the heat map."""
    from memtoc.core.values import ConfigError
    from probes.patching import attribution_patching, exact_patching, hook_names_for

    log = log or (lambda s: print(s, file=sys.stderr))
    if edit is not None:
        raise ConfigError("patch reads the untreated model; it takes no edit")
    clean, corrupt, components, roles = check_patch_config(cfg)
    from memtoc.backends.preflight import model_shape

    shape = model_shape(cfg.model) if backend is None else None
    if shape is not None:
        parse_blocks(cfg.layers, shape.n_layers)         # a block range outside the model: before the weights load
    if backend is None:
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        backend = load_backend(ModelSpec(model=cfg.model, backend="hf", device=cfg.device, dtype=cfg.dtype))
    from memtoc.backends.factory import require_inspectable

    backend = require_inspectable(backend, "patching")
    parts = backend.parts               # the model's parts: patching's forwards and hooks go through them
    blocks = parse_blocks(cfg.layers, parts.n_layers)
    names = hook_names_for(parts.n_layers, components, blocks)
    pairs, skipped = build_pairs(backend, cfg.run, clean, corrupt, cfg.limit)
    if not pairs:
        raise ConfigError(f"{cfg.run}: no {clean}/{corrupt} pair with a memory answer and a tool value to patch "
                          f"(skipped: {', '.join(f'{k} {v}' for k, v in skipped.items() if v) or 'none found'})")
    from tqdm import tqdm

    results: dict[str, list[Any]] = {"attribution": [], "exact": []}
    for p in tqdm(pairs, desc="patch", unit="pair", file=sys.stderr, disable=not cfg.progress):
        if cfg.method in ("both", "attribution"):
            results["attribution"].append(attribution_patching(parts, p, names, roles))
        if cfg.method == "exact":
            results["exact"].append(exact_patching(parts, p, names, roles, batch_rows=cfg.batch_rows))
    cells_exact: list[tuple[str, str]] = []
    if cfg.method == "both":
        mean_attr = {(n, r): np.nanmean([res.effects[n][r] for res in results["attribution"]])
                     for n in names for r in roles}
        ranked = sorted((c for c in mean_attr if not np.isnan(mean_attr[c])), key=lambda c: -abs(mean_attr[c]))
        cells_exact = ranked[:cfg.top_cells]
        exact_names = list(dict.fromkeys(n for n, _ in cells_exact))
        exact_roles = list(dict.fromkeys(r for _, r in cells_exact))
        for p in pairs:
            results["exact"].append(exact_patching(parts, p, exact_names, exact_roles, batch_rows=cfg.batch_rows))
    table, rows = _tables(pairs, results, names, roles, cfg)
    measured = results["attribution"] or results["exact"]
    meta = {"run": str(cfg.run), "pair": {"clean": clean, "corrupt": corrupt}, "method": cfg.method,
            "metric": "log p(memory answer) - log p(tool value) at the first answer token after 'FINAL: '",
            "roles": roles, "components": components, "n_pairs": len(pairs), "skipped": skipped,
            "n_questions": len({p.meta["question_id"] for p in pairs}), "n_blocks": parts.n_layers,
            "mean_clean_metric": float(np.mean([r.clean_metric for r in measured])),
            "mean_corrupt_metric": float(np.mean([r.corrupt_metric for r in measured]))}
    if cfg.method == "both":
        meta["agreement"] = _agreement(table, cells_exact)
    res = PatchJobResult(table, rows, meta)
    if cfg.heads:
        res.attention, res.dla = component_tables(parts, pairs, clean, corrupt)
    res.files = write_patch(res, cfg.out)
    return res


def component_tables(parts: Any, pairs: Sequence[Any], clean: str, corrupt: str
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per head: the attention from the answer position to the tool span, and each component's (and head's)
    direct logit attribution to the metric, averaged over pairs, for both conditions."""
    from probes.patching import attention_mass, direct_logit_attribution

    mass: dict[str, list[np.ndarray]] = {clean: [], corrupt: []}
    comp: dict[str, list[dict[str, float]]] = {clean: [], corrupt: []}
    heads: dict[str, list[np.ndarray]] = {clean: [], corrupt: []}
    for p in pairs:
        for cond, ids, which in ((clean, p.clean_ids, 0), (corrupt, p.corrupt_ids, 1)):
            keys = p.positions.get("tool_span", ([], []))[which]
            mass[cond].append(attention_mass(parts, ids, len(ids) - 1, keys))
            c, h, _ = direct_logit_attribution(parts, ids, *p.answer_ids)
            comp[cond].append(c)
            heads[cond].append(h)
    attention, dla = [], []
    for cond in (clean, corrupt):
        m = np.mean(mass[cond], axis=0)
        hd = np.mean(heads[cond], axis=0)
        for b in range(m.shape[0]):
            for h in range(m.shape[1]):
                attention.append({"block": b, "head": h, "condition": cond, "attention_to_tool_span": float(m[b, h])})
                dla.append({"component": f"blocks.{b}.attn.head{h}", "block": b, "head": h, "condition": cond,
                            "dla": float(hd[b, h])})
        for name in comp[cond][0]:
            dla.append({"component": name, "block": None if name == "embed" else int(name.split(".")[1]),
                        "head": None, "condition": cond, "dla": float(np.mean([c[name] for c in comp[cond]]))})
    return attention, dla


def _tables(pairs: Sequence[Any], results: dict[str, list[Any]], names: Sequence[str], roles: Sequence[str],
            cfg: PatchConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    groups = [p.meta["question_id"] for p in pairs]
    rows: list[dict[str, Any]] = []
    table: list[dict[str, Any]] = []
    for n in names:
        for r in roles:
            block = int(n.split(".")[1])
            row: dict[str, Any] = {"name": n, "site": block + 1, "block": block, "component": n.rsplit(".", 1)[1],
                                   "role": r}
            for method, res in results.items():
                if not res or r not in next(iter(res)).effects.get(n, {}):
                    continue
                vals = np.array([x.effects[n][r] for x in res], dtype=float)
                gaps = np.array([x.gap for x in res], dtype=float)
                if np.all(np.isnan(vals)):
                    continue
                lo, hi = _bootstrap(vals, groups, cfg.n_boot, cfg.seed)
                with np.errstate(invalid="ignore", divide="ignore"):
                    norm = np.where(np.abs(gaps) > 1e-6, vals / gaps, np.nan)
                row.update({f"{method}_effect": float(np.nanmean(vals)), f"{method}_ci_low": lo,
                            f"{method}_ci_high": hi, f"{method}_normalised": float(np.nanmean(norm))
                            if not np.all(np.isnan(norm)) else float("nan")})
                for p, x, v in zip(pairs, res, vals):
                    rows.append({"pair_id": p.pair_id, "question_id": p.meta["question_id"],
                                 "formulation": p.meta["formulation"], "name": n, "role": r, "method": method,
                                 "effect": float(v), "clean_metric": x.clean_metric,
                                 "corrupt_metric": x.corrupt_metric})
            table.append(row)
    return table, rows


def _agreement(table: Sequence[dict[str, Any]], cells: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """How well attribution ranks the cells exact patching measured: Spearman rank correlation over them, and
    how many of exact's top half attribution also puts in its top half."""
    from scipy.stats import spearmanr

    got = [(r["attribution_effect"], r["exact_effect"]) for r in table
           if (r["name"], r["role"]) in set(cells) and "exact_effect" in r]
    if len(got) < 3:
        return {"n_cells": len(got), "spearman": None, "top_half_overlap": None}
    a, e = np.array(got).T
    half = max(1, len(got) // 2)
    top_a, top_e = set(np.argsort(-np.abs(a))[:half]), set(np.argsort(-np.abs(e))[:half])
    rho = spearmanr(np.abs(a), np.abs(e)).statistic
    return {"n_cells": len(got), "spearman": float(rho), "top_half_overlap": len(top_a & top_e) / half}


def write_patch(res: PatchJobResult, out: str | Path) -> dict[str, Path]:
    from memtoc.core.fileio import json_ready, write_json_atomic, write_records_csv_atomic, write_text_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": out / "patch.json", "csv": out / "patch.csv", "pairs": out / "patch_pairs.csv",
             "markdown": out / "patch.md", "plot": out / "patch.png"}
    if res.attention:
        files.update(attention=out / "attention.csv", dla=out / "dla.csv")
    # NaN (a cell or CI with nothing behind it) as null: the writer is strict JSON
    write_json_atomic(files["json"], json_ready({"meta": res.meta, "table": res.table}))
    for path, rows in ((files["csv"], res.table), (files["pairs"], res.pairs), (files.get("attention"), res.attention),
                       (files.get("dla"), res.dla)):
        if path is not None:
            write_records_csv_atomic(path, rows)
    write_text_atomic(files["markdown"], to_markdown(res))
    plot_patch(res, files["plot"])
    return files


def _fmt(x: Any) -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:+.3f}"


def to_markdown(res: PatchJobResult, top: int = 15) -> str:
    m = res.meta
    key = "exact_effect" if any("exact_effect" in r for r in res.table) else "attribution_effect"
    rows = sorted((r for r in res.table if key in r), key=lambda r: -abs(r[key]))[:top]
    lines = [f"# Activation patching: {m['pair']['clean']} -> {m['pair']['corrupt']}", "",
             f"{m['n_pairs']} pairs of {m['n_questions']} questions; metric: {m['metric']}; mean clean "
             f"{m['mean_clean_metric']:+.3f}, mean corrupt {m['mean_corrupt_metric']:+.3f}.", "",
             "| hook point | role | exact | 95% CI | attribution | normalised |", "|---|---|---|---|---|---|"]
    for r in rows:
        ci = (f"[{_fmt(r.get('exact_ci_low'))}, {_fmt(r.get('exact_ci_high'))}]" if "exact_effect" in r else "–")
        lines.append(f"| {r['name']} | {r['role']} | {_fmt(r.get('exact_effect'))} | {ci} | "
                     f"{_fmt(r.get('attribution_effect'))} | {_fmt(r.get(key.replace('effect', 'normalised')))} |")
    if res.attention:
        corrupt = m["pair"]["corrupt"]
        top = sorted((r for r in res.attention if r["condition"] == corrupt),
                     key=lambda r: -r["attention_to_tool_span"])[:5]
        lines += ["", f"Heads attending most from the answer position to the tool span ({corrupt}): " + ", ".join(
            f"L{r['block']}H{r['head']} {r['attention_to_tool_span']:.2f}" for r in top) + "."]
        dl = sorted((r for r in res.dla if r["condition"] == corrupt and r["head"] is None),
                    key=lambda r: -abs(r["dla"]))[:5]
        lines += [f"Largest direct logit attributions ({corrupt}): " + ", ".join(
            f"{r['component']} {r['dla']:+.2f}" for r in dl) + "."]
    if m.get("agreement"):
        ag = m["agreement"]
        lines += ["", f"Attribution vs exact, confirmed-cell Spearman (|attribution| vs |exact| over the "
                      f"{ag['n_cells']} cells attribution ranked highest, so a restricted range: not the all-cell "
                      f"Spearman of docs/BENCHMARKS.md): {_fmt(ag['spearman'])}; top-half overlap "
                      f"{_fmt(ag['top_half_overlap'])}."]
    return "\n".join(lines) + "\n"


#: the heat map's panel rows: one per kind of value, never mixed in one panel
HEAT_KINDS: tuple[tuple[str, str], ...] = (("attribution_effect", "attribution (first-order estimate)"),
                                           ("exact_effect", "exact (patched)"))


def heat_panels(res: PatchJobResult) -> list[dict[str, Any]]:
    """The heat map's panels: one per component and kind of value (attribution estimate, exact effect), each a
    sites x roles grid of that kind only (NaN: not measured), so an estimate never sits beside a measurement
    in one colour field."""
    comps = list(dict.fromkeys(r["component"] for r in res.table))
    roles = list(dict.fromkeys(r["role"] for r in res.table))
    sites = sorted({r["site"] for r in res.table})
    panels = []
    for key, label in HEAT_KINDS:
        if not any(r.get(key) is not None for r in res.table):
            continue
        for comp in comps:
            grid = np.full((len(sites), len(roles)), np.nan)
            for r in res.table:
                if r["component"] == comp and r.get(key) is not None:
                    grid[sites.index(r["site"]), roles.index(r["role"])] = r[key]
            panels.append({"component": comp, "kind": key, "title": f"{comp}: {label}", "grid": grid,
                           "sites": sites, "roles": roles})
    return panels


def plot_patch(res: PatchJobResult, path: Path) -> list[str]:
    """Heat map: a row of panels (one per component) per kind of value, attribution estimates and exact effects
    apart, each row on its own colour scale; grey cells were not measured by that method. Returns the panel
    titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = heat_panels(res)
    kinds = list(dict.fromkeys(p["kind"] for p in panels))
    comps = list(dict.fromkeys(p["component"] for p in panels))
    sites = panels[0]["sites"] if panels else []
    fig, axes = plt.subplots(len(kinds), len(comps), squeeze=False,
                             figsize=(3 + 2.2 * len(comps), (1.5 + 0.22 * len(sites)) * len(kinds)))
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#d9d9d9")
    for i, kind in enumerate(kinds):
        row = [p for p in panels if p["kind"] == kind]
        vmax = max([float(np.nanmax(np.abs(p["grid"]))) for p in row if np.isfinite(p["grid"]).any()] + [1e-9])
        im = None
        for ax, p in zip(axes[i], row):
            im = ax.imshow(np.ma.masked_invalid(p["grid"]), aspect="auto", cmap=cmap, vmin=-vmax, vmax=vmax,
                           origin="lower")
            ax.set_xticks(range(len(p["roles"])), p["roles"], rotation=30, ha="right")
            ax.set_yticks(range(len(p["sites"])), [str(b) for b in p["sites"]], fontsize=6)
            ax.set_title(p["title"], fontsize=9)
            ax.set_ylabel("site (output of block site-1)")
        fig.colorbar(im, ax=axes[i].tolist(), label=f"{dict(HEAT_KINDS)[kind].split(' ')[0]}: effect on\n"
                                                      "log p(memory) - log p(tool)")
    fig.suptitle(f"patching {res.meta['pair']['clean']} -> {res.meta['pair']['corrupt']} "
                 f"({res.meta['n_pairs']} pairs; grey: not measured by that method)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [p["title"] for p in panels]
