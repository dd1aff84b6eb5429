"""The memory-answer rank table (``memtoc rank-table``).

For every episode of a run's arbitration cell (memory right, tool wrong) the residual stream at the final input
position is read at every site of a band and each lens turns it into vocabulary logits. An episode's score is
the rank of its memory answer's first token among the real vocabulary, minimised over the band, beside spelling
variants and a control (other questions' answers at the same position); aggregated per behaviour and by whether
the answer occurs in the prompt. Definitions and formats: ``docs/probes.md``.
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from memtoc.backends.factory import require_readout
from memtoc.core.fileio import write_json_atomic
from memtoc.runs.runstore import RunStore
from memtoc.scoring.normalize import normalize
from probes.answer import ANSWER_PREFIX, AnswerToken, answer_token
from probes.lens import LensCapture
from probes.lenses import Lens, LensInputs, load_lenses, make_lenses, parse_lens_option, read_all
from probes.lenses.registry import needs_factors
from probes.model import ModelParts, ProbeError, default_band, parse_sites, token_ranks
from memtoc.core.vocab import BEHAVIOURS, CONFLICT_CONDITION

SPLITS = ("all", "in_prompt", "not_in_prompt")


@dataclass
class RankTableConfig:
    """What the table reads, under the names of the job's config (``memtoc.jobs.rank_table.RankTableJobConfig``,
    which :func:`build_rank_table` takes as it is)."""

    run: str
    layers: str | Sequence[int] | None = None          # None / "default": round(0.25 L) .. round(0.9 L)
    lens: Sequence[str] = ("jacobian",)      # NAME or NAME=FILE (probes.lenses); logit is always added
    lens_file: str | None = None             # the file of every lens that needs one and names none
    batch_size: int = 8
    top_k: int = 20
    condition: str = CONFLICT_CONDITION
    cell: str = "arb"
    controls: bool = True
    check_model: bool = True
    answer: str = "memory"     # "memory": the closed-book memory span (primary); "gold": the gold answer (diagnostic)


@dataclass
class RankTable:
    meta: dict[str, Any]
    episodes: list[dict[str, Any]]
    summary: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "summary": self.summary, "episodes": self.episodes}


def _behaviour(outcome: str | None) -> str:
    return outcome if outcome in ("followed_tool", "kept_memory") else "other"


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def select_episodes(store: RunStore, condition: str, cell: str) -> list[dict[str, Any]]:
    """The run's episodes of ``condition`` and ``cell``; either may be ``all`` (every condition / cell)."""
    eps = [r for r in store.episodes.records() if condition in ("all", r.get("condition"))
           and cell in ("all", r.get("cell"))]
    return sorted(eps, key=lambda r: str(r["episode_id"]))


def _control_pool(backend: Any, store: RunStore, answer: str = "memory") -> dict[str, list[tuple[str, int]]]:
    """formulation -> [(question_id, first answer token id)] of every other answer that can serve as a control:
    every closed-book memory answer (after its own prompt), or with ``answer == "gold"`` every question's gold
    answer (after one of its episode prompts)."""
    sources: list[tuple[str, str, str, Any]] = []      # (formulation, question_id, prompt, answer text)
    if answer == "gold":
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for rec in sorted(store.episodes.records(), key=lambda r: str(r["episode_id"])):
            seen.setdefault((rec["formulation"], str(rec["question_id"])), rec)
        sources = [(form, qid, rec["prompt"], rec.get("gold_answer")) for (form, qid), rec in sorted(seen.items())]
    else:
        sources = [(rec["formulation"], str(rec["question_id"]), rec["prompt"], rec["memory_span"])
                   for rec in sorted(store.closed_book.records(), key=lambda r: str(r["key"]))
                   if not rec.get("mem_absent") and (rec.get("memory_span") or "").strip()]
    pool: dict[str, dict[str, int]] = {}
    for form, qid, prompt, text in sources:
        tok = answer_token(backend, prompt, text)
        if tok.token_id is not None:
            pool.setdefault(form, {})[qid] = tok.token_id
    return {f: sorted(d.items()) for f, d in pool.items()}


def rank_lenses(cfg: Any) -> list[Lens]:
    """The lenses of ``cfg.lens`` (``NAME`` or ``NAME=FILE``; ``cfg.lens_file`` for those that name none), the logit
    lens first as the baseline."""
    return make_lenses(parse_lens_option(["logit", *cfg.lens]), default_file=cfg.lens_file)


def build_rank_table(backend: Any, cfg: Any, *, lenses: Sequence[Lens] | None = None,
                     progress: bool = False) -> RankTable:
    """The table of ``cfg`` (a :class:`RankTableConfig`, or the job's config: the same fields) on ``backend``;
    ``lenses``: :func:`rank_lenses` of ``cfg`` when the caller has them already."""
    store = RunStore.read(cfg.run)
    info = store.run_info()
    readout = require_readout(backend, "the rank table")
    L = readout.n_layers
    sites, band_source = resolve_band(cfg.layers, readout.model_type, L)
    lenses = list(lenses) if lenses is not None else rank_lenses(cfg)
    kinds = [ln.name for ln in lenses]
    if readout.readout_only:
        refuse_module_lenses(lenses, getattr(backend, "name", type(backend).__name__))
    if cfg.check_model:
        _check_run_model(backend, info, cfg.run)
    load_lenses(lenses, readout, sites)
    artifacts = [ln for ln in lenses if ln.needs_artifact]

    if cfg.answer not in ("memory", "gold"):
        raise ProbeError(f"unknown --answer {cfg.answer!r}; choose memory or gold")
    episodes = select_episodes(store, cfg.condition, cfg.cell)
    if not episodes:
        import warnings

        warnings.warn(f"{cfg.run}: no episodes of condition {cfg.condition!r} in cell {cfg.cell!r}: the rank table is "
                      "empty (--cell all / cell='all' takes every cell)", stacklevel=2)
    pool = _control_pool(backend, store, cfg.answer) if cfg.controls else {}
    rows: list[dict[str, Any]] = []
    todo = [(ep, answer_token(backend, ep["prompt"], _answer_text(ep, cfg.answer))) for ep in episodes]

    bar = None
    if progress:
        import sys
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="rank-table", unit="episode", file=sys.stderr)
    for i in range(0, len(todo), cfg.batch_size):
        chunk = todo[i:i + cfg.batch_size]
        prompts = [ep["prompt"] for ep, _ in chunk]
        vectors = lens_vectors(backend, readout, prompts, sites, lenses)
        for j, (ep, tok) in enumerate(chunk):
            rows.append(_episode_row(readout, ep, tok, {k: {s: v[s][j] for s in sites} for k, v in vectors.items()},
                                     sites, pool.get(ep["formulation"], []), cfg.top_k, cfg.answer))
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()

    meta = {
        "run": str(cfg.run), "model": (info.get("identity") or {}).get("model"),
        "weights_sha256": (info.get("identity") or {}).get("weights_sha256"),
        "n_layers": L, "sites": list(sites), "band": band_source, "model_type": readout.model_type,
        "site_convention": "s = output of block s-1 (0 = embedding output; "
        f"{L} = raw output of the last block)", "default_band": list(default_band(L)),
        "lenses": kinds, "lens_file": artifacts[0].file if artifacts else cfg.lens_file,
        "lens_meta": artifacts[0].artifact_meta() if artifacts else None,
        "condition": cfg.condition, "cell": cfg.cell, "top_k": cfg.top_k, "answer_prefix": ANSWER_PREFIX,
        "answer": cfg.answer,
        "position": "final input position (last prompt token; generation starts after it)",
        "n_episodes": len(rows), "n_vocab": readout.n_vocab, "backend": getattr(backend, "name", None),
        "readout": "the model's own final norm and head" if not readout.readout_only else
        "the final norm and head loaded from the checkpoint the engine serves; states captured by the engine",
    }
    if len(artifacts) > 1:      # lens_file / lens_meta describe the first; every lens's file is listed here
        meta["lens_files"] = {ln.name: ln.file for ln in artifacts}
    # each fitted lens's provenance by name: Table 8 labels a lens fitted on a smoke-size corpus as such
    meta["lens_metas"] = {ln.name: ln.artifact_meta() for ln in artifacts}
    table = RankTable(meta=meta, episodes=rows)
    table.summary = summarize(rows, kinds, cfg.top_k)
    return table


def module_lenses(lenses: Sequence[Lens]) -> list[str]:
    """The lenses that need the model's module tree (sub-block factors, or passes of their own), which a backend
    with a readout only (vLLM) cannot serve."""
    return [ln.name for ln in lenses if ln.needs_factors or not ln.reads_capture]


def refuse_module_lenses(lenses: Sequence[Lens], backend_name: str) -> None:
    bad = module_lenses(lenses)
    if bad:
        raise ProbeError(f"--lens {','.join(bad)} reads the model's blocks, which the {backend_name} backend runs "
                         "out of reach (it captures states and has the readout only: logit and jacobian lenses); "
                         "use --backend hf for these")


def resolve_band(spec: str | Sequence[int] | None, model_type: str, n_layers: int) -> tuple[tuple[int, ...], str]:
    """The rank table's sites and where they came from. ``default`` / ``paper`` / None: the paper's band for the
    model's family (App. H; ``memtoc.bench.paper_protocol``), rescaled to another depth; a family the paper did
    not study falls back to ``depth``: ``round(0.25 L) .. round(0.9 L)``. Anything else: explicit sites."""
    from memtoc.bench.paper_protocol import family_of, lens_sites

    if spec is not None and not isinstance(spec, str):
        return parse_sites(spec, n_layers), "explicit"       # a list of sites, as given
    key = (spec or "default").strip()
    if key in ("default", "paper"):
        fam = family_of(model_type)
        if fam is not None:
            from memtoc.bench.paper_protocol import protocol

            paper_depth = protocol()["families"][fam]["paper_n_blocks"]
            label = (f"paper band ({fam} family)" if n_layers == paper_depth else
                     f"the paper's {fam} band ({paper_depth} blocks) rescaled to this model's {n_layers} blocks "
                     "(a model the paper did not study)")
            return lens_sites(model_type, n_layers), label
        if key == "paper":
            raise ProbeError(f"the paper has no lens band for model type {model_type!r}; give --layers")
        key = "depth"
    if key == "depth":
        return parse_sites("default", n_layers), "depth rule round(0.25 L)..round(0.9 L)"
    return parse_sites(spec, n_layers), "explicit"


def _check_run_model(backend: Any, info: Mapping[str, Any], run: str) -> None:
    want = (info.get("identity") or {}).get("weights_sha256")
    if not want:
        return
    have = ((backend.provenance() or {}).get("weights") or {}).get("sha256")
    if have and have != want:
        raise ProbeError(f"run {run} was made with another model (weights sha256 {want[:12]}…, this model "
                         f"{have[:12]}…); the rank table must read the model that produced the run's answers")


def lens_vectors(backend: Any, parts: ModelParts, prompts: Sequence[str], sites: Sequence[int],
                 lenses: Sequence[Lens]) -> dict[str, dict[int, torch.Tensor]]:
    """``lens name -> site -> [B, d]`` transported vectors at each prompt's final input position (one captured
    forward shared by every lens that reads it)."""
    cap = LensCapture(parts, sites, detached=needs_factors(lenses))
    backend.forward(list(prompts), capture=cap)
    return read_all(lenses, LensInputs(parts=parts, capture=cap, sites=sites, backend=backend, prompts=prompts))


def _answer_text(ep: Mapping[str, Any], answer: str) -> str:
    return (ep.get("gold_answer") if answer == "gold" else ep.get("memory_span")) or ""


def _episode_row(parts: ModelParts, ep: Mapping[str, Any], tok: AnswerToken,
                 vectors: Mapping[str, Mapping[int, torch.Tensor]], sites: Sequence[int],
                 pool: Sequence[tuple[str, int]], top_k: int, answer: str = "memory") -> dict[str, Any]:
    span = _answer_text(ep, answer)
    in_prompt = bool(normalize(span)) and normalize(span) in normalize(ep.get("prompt") or "")
    controls = sorted({t for q, t in pool if q != str(ep["question_id"]) and t != tok.token_id})
    row: dict[str, Any] = {
        "episode_id": ep["episode_id"], "question_id": ep["question_id"], "formulation": ep.get("formulation"),
        "outcome": ep.get("outcome"), "behaviour": _behaviour(ep.get("outcome")), "memory_span": ep.get("memory_span"),
        "answer_text": span,
        "tool_value": ep.get("tool_value"), "answer_token_id": tok.token_id, "answer_token": tok.token_str,
        "variant_token_ids": tok.variant_ids, "prompt_prefix_ok": tok.prompt_prefix_ok,
        "answer_subtoken_ids": tok.subtoken_ids,
        "answer_in_prompt": in_prompt, "n_controls": len(controls), "lenses": {},
    }
    if tok.token_id is None:
        return row
    subs = [t for t in tok.subtoken_ids if t not in tok.variant_ids]
    ids = tok.variant_ids + subs + controls
    n_var = len(tok.variant_ids)
    n_sub = len(subs)
    for kind, per_site in vectors.items():
        stacked = torch.stack([per_site[s] for s in sites])                       # [S, d]
        logits = parts.unembed(stacked.to(parts.lm_head.weight.device))          # [S, V]
        ranks = token_ranks(logits, ids, parts.n_vocab).cpu()                   # [S, K]
        band_min, arg = ranks.min(0)                                             # [K]
        own = ranks[:, 0]
        ctrl = band_min[n_var + n_sub:].tolist()
        sub_cols = [i for i, t in enumerate(ids[:n_var + n_sub]) if t in tok.subtoken_ids] or [0]
        row["lenses"][kind] = {
            "rank": int(band_min[0]), "best_site": int(sites[int(arg[0])]),
            "rank_variant": int(band_min[:n_var].min()),
            "rank_subtoken": int(band_min[sub_cols].min()),
            "control_median": _median(ctrl), "control_top_k_rate": (sum(r <= top_k for r in ctrl) / len(ctrl)
                                                                    if ctrl else None),
            "ranks_by_site": {str(s): int(r) for s, r in zip(sites, own.tolist())},
        }
    return row


def summarize(rows: Sequence[Mapping[str, Any]], kinds: Sequence[str], top_k: int) -> list[dict[str, Any]]:
    """Per lens, behaviour and prompt split: n, median rank, count in the top k, variant and control columns."""
    out = []
    for kind in kinds:
        for split in SPLITS:
            for beh in (*BEHAVIOURS, "all"):
                sel = [r for r in rows if kind in r["lenses"]
                       and (beh == "all" or r["behaviour"] == beh)
                       and (split == "all" or r["answer_in_prompt"] == (split == "in_prompt"))]
                ranks = [r["lenses"][kind]["rank"] for r in sel]
                var = [r["lenses"][kind]["rank_variant"] for r in sel]
                sub = [r["lenses"][kind].get("rank_subtoken", r["lenses"][kind]["rank"]) for r in sel]
                ctrl = [r["lenses"][kind]["control_median"] for r in sel
                        if r["lenses"][kind]["control_median"] is not None]
                out.append({"lens": kind, "split": split, "behaviour": beh, "n": len(sel),
                            "median_rank": _median(ranks), f"top{top_k}": sum(x <= top_k for x in ranks),
                            "median_rank_variant": _median(var), f"top{top_k}_variant": sum(x <= top_k for x in var),
                            "median_rank_subtoken": _median(sub),
                            f"top{top_k}_subtoken": sum(x <= top_k for x in sub),
                            "control_median": _median(ctrl)})
    return out


# -- output ---------------------------------------------------------------------------------------------------

def episode_csv_rows(table: RankTable) -> tuple[list[str], list[list[Any]]]:
    kinds = table.meta["lenses"]
    head = ["episode_id", "question_id", "formulation", "outcome", "behaviour", "answer_in_prompt", "answer_text",
            "answer_token_id", "answer_token", "prompt_prefix_ok", "n_controls"]
    for k in kinds:
        head += [f"{k}_rank", f"{k}_best_site", f"{k}_rank_variant", f"{k}_rank_subtoken", f"{k}_control_median"]
    body = []
    for r in table.episodes:
        line = [r["episode_id"], r["question_id"], r["formulation"], r["outcome"], r["behaviour"],
                r["answer_in_prompt"], r["answer_text"], r["answer_token_id"], r["answer_token"],
                r["prompt_prefix_ok"], r["n_controls"]]
        for k in kinds:
            d = r["lenses"].get(k)
            line += ([d["rank"], d["best_site"], d["rank_variant"], d.get("rank_subtoken"), d["control_median"]]
                     if d else ["", "", "", "", ""])
        body.append(line)
    return head, body


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def _summary(table: RankTable, kind: str, split: str, beh: str) -> Mapping[str, Any]:
    for s in table.summary:
        if s["lens"] == kind and s["split"] == split and s["behaviour"] == beh:
            return s
    return {}


def table8_rows(table: RankTable) -> list[dict[str, Any]]:
    """The paper's Table 8 columns per lens: median rank and top-k count (k/n) after following the tool and after
    keeping memory, the control median; the restricted top-k counts on episodes whose answer is not in the
    prompt (App. H, second caveat); and the all-subtoken medians (App. H's tokenization check)."""
    k = table.meta["top_k"]
    out = []
    for kind in table.meta["lenses"]:
        f, m = _summary(table, kind, "all", "followed_tool"), _summary(table, kind, "all", "kept_memory")
        fr = _summary(table, kind, "not_in_prompt", "followed_tool")
        mr = _summary(table, kind, "not_in_prompt", "kept_memory")
        allb = _summary(table, kind, "all", "all")
        out.append({
            "lens": kind,
            "followed_median": f.get("median_rank"), "followed_top": f"{f.get(f'top{k}', 0)}/{f.get('n', 0)}",
            "kept_median": m.get("median_rank"), "kept_top": f"{m.get(f'top{k}', 0)}/{m.get('n', 0)}",
            "control_median": allb.get("control_median"),
            "followed_top_not_in_prompt": f"{fr.get(f'top{k}', 0)}/{fr.get('n', 0)}",
            "kept_top_not_in_prompt": f"{mr.get(f'top{k}', 0)}/{mr.get('n', 0)}",
            "followed_median_subtoken": f.get("median_rank_subtoken"),
            "kept_median_subtoken": m.get("median_rank_subtoken"),
        })
    return out


TABLE8_COLUMNS = ("followed_median", "followed_top", "kept_median", "kept_top", "control_median",
                  "followed_top_not_in_prompt", "kept_top_not_in_prompt", "followed_median_subtoken",
                  "kept_median_subtoken")


def lens_row_label(table: RankTable, lens: str) -> str:
    """A run's Table 8 row label: the lens, and for a fitted one its corpus size, marked as a smoke fit (not
    comparable with the paper's rows) below the default fit's size."""
    from probes.fit import DEFAULT_CORPUS_LINES

    meta = (table.meta.get("lens_metas") or {}).get(lens) or {}
    n = meta.get("n_sequences")
    if n is None:
        return f"this run, {lens} lens"
    corpus = f"{int(n)}-sequence corpus" + (f" `{Path(str(meta['corpus'])).name}`" if meta.get("corpus") else "")
    if int(n) < DEFAULT_CORPUS_LINES:
        return (f"this run, {lens} lens (SMOKE FIT: {corpus}, under the default {DEFAULT_CORPUS_LINES}; not "
                "comparable with the paper's rows)")
    return f"this run, {lens} lens ({corpus})"


def table8_markdown(table: RankTable) -> list[str]:
    """Table 8 of the paper with this run's rows (one per lens) under the paper's own rows."""
    from memtoc.bench.paper_protocol import table8

    k = table.meta["top_k"]
    heads = ("Followed: median", f"Followed: top-{k}", "Kept: median", f"Kept: top-{k}", "Control median",
             f"Followed: top-{k}, answer not in prompt", f"Kept: top-{k}, answer not in prompt",
             "Followed: median, all subtokens", "Kept: median, all subtokens")
    lines = ["## Table 8 (MemToC App. H): rank of the memory answer at the final input position, by behaviour", "",
             "| row | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for r in table8_rows(table):
        lines.append(f"| {lens_row_label(table, r['lens'])} | " + " | ".join(_fmt(r[c]) for c in TABLE8_COLUMNS)
                     + " |")
    for r in table8():
        lines.append(f"| paper: {r['model']} | " + " | ".join(_fmt(r.get(c)) for c in TABLE8_COLUMNS) + " |")
    lines += ["", "The paper's rows are its Jacobian lens on its models (its band); all-subtoken medians are given "
              "only where the paper reports them (Qwen). Restricted counts: episodes whose answer string does not "
              "occur in the prompt.", ""]
    return lines


def to_markdown(table: RankTable) -> str:
    m = table.meta
    k = m["top_k"]
    lines = ["# Memory-answer rank table", "",
             f"- run: `{m['run']}` (model `{m['model']}`), {m['n_episodes']} episodes "
             f"(condition `{m['condition']}`, cell `{m['cell']}`)",
             f"- position: {m['position']}; answer token: first token of the "
             f"{'memory (closed-book)' if m.get('answer') == 'memory' else 'gold'} answer written after "
             f"`{m['answer_prefix'].strip()}` (see docs/probes.md)",
             f"- sites {m['sites'][0]}..{m['sites'][-1]} ({m['site_convention']}); rank = 1 + number of real "
             f"vocabulary tokens with a strictly larger logit, minimised over the sites",
             f"- lenses: {', '.join(m['lenses'])}" + (f"; lens file `{m['lens_file']}`" if m.get("lens_file") else ""),
             f"- band: {m.get('band', 'explicit')}", ""]
    lines += table8_markdown(table)
    for kind in m["lenses"]:
        lines += [f"## {kind} lens", "",
                  f"| split | behaviour | n | median rank | top-{k} | median rank (variants) | top-{k} (variants) | "
                  f"median rank (all subtokens) | top-{k} (all subtokens) | control median |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in table.summary:
            if s["lens"] != kind or s["n"] == 0 and s["behaviour"] != "all":
                continue
            lines.append(f"| {s['split']} | {s['behaviour']} | {s['n']} | {_fmt(s['median_rank'])} | {s[f'top{k}']} | "
                         f"{_fmt(s['median_rank_variant'])} | {s[f'top{k}_variant']} | "
                         f"{_fmt(s['median_rank_subtoken'])} | {s[f'top{k}_subtoken']} | {_fmt(s['control_median'])} |")
        lines.append("")
    head, body = episode_csv_rows(table)
    lines += ["## Episodes", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in body:
        lines.append("| " + " | ".join(_fmt(x).replace("|", "\\|").replace("\n", " ") for x in b) + " |")
    return "\n".join(lines) + "\n"


def write_rank_table(table: RankTable, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "rank_table.json", "markdown": out / "rank_table.md", "csv": out / "rank_table.csv",
             "summary_csv": out / "rank_summary.csv"}
    write_json_atomic(paths["json"], table.to_dict())
    paths["markdown"].write_text(to_markdown(table), encoding="utf-8")
    head, body = episode_csv_rows(table)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    w.writerows(body)
    paths["csv"].write_text(buf.getvalue(), encoding="utf-8")
    buf = io.StringIO()
    if table.summary:
        w = csv.DictWriter(buf, fieldnames=list(table.summary[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(table.summary)
    paths["summary_csv"].write_text(buf.getvalue(), encoding="utf-8")
    return paths
