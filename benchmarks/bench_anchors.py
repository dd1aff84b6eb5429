"""This toolkit against the tools a researcher would use instead, on the same work and the same weights, in one run.

    .venv/bin/python benchmarks/bench_anchors.py --model default --out bench_out/anchors.json

Four rows, each run by this toolkit and by every anchor (TransformerLens ``HookedTransformer`` with the model's
weights converted by ``memtoc.backends.interop.hooked_transformer_from_hf``; nnsight ``LanguageModel`` over its own
copy of the transformers model, since nnsight replaces every module's ``forward``; the transformers model itself),
interleaved in rounds (order rotated every round), with the outputs checked to agree:

- ``capture``: the residual after every block at ``last_input`` and at every prompt position of ``--n-capture``
  demo prompts (``memtoc extract`` machinery: ``capture_batch`` + the HDF5 store's ``append``, float32); anchors:
  TL ``run_with_cache(names_filter=...)``, nnsight ``trace`` + ``.save()``, transformers ``output_hidden_states``
  (whose last state is after the final norm: compared with the final norm of ours). Every batch is one round.
  Agreement: max |difference| <= 1e-5 x max(1, max |value|) per site (two implementations of one function in
  float32 differ by round-off that grows with the residual's scale).
- ``patch``: exact activation patching of the residual after every block x the three roles of ``--n-pairs`` demo
  pairs, the decision metric ``logp(memory answer) - logp(tool value)`` (``probes.patching.exact_patching``, what
  ``memtoc patch --method exact`` runs); anchors: TL ``run_with_hooks`` once per cell (the
  ``get_act_patch_resid_pre`` loop), nnsight one ``trace`` per cell. Agreement: every effect within 1e-4.
  The pairs are the demo's ``tool_right`` / ``tool_wrong`` prompts with the gold answer as the memory answer
  (no evaluate run needed).
- ``steer``: a direction (a random unit vector x 4) added at one site at ``last_input``, ``--n-steer`` prompts x
  ``--new-tokens`` greedy tokens in batches of ``--batch-size`` (``backend.generate(..., edit=...)``, the
  ``evaluate --edit`` path); anchors: transformers ``generate`` + a forward hook, nnsight ``generate`` with the
  intervention, TL ``generate`` under ``hooks``. Agreement: identical tokens (up to the first end token).
- ``sweep``: the same edit at 4 strengths (``--strengths``) over ``--n-sweep`` prompts: this toolkit in one pass
  (the strengths as rows of one batch, what ``memtoc sweep`` runs); every anchor loops over the strengths.
  Agreement: identical tokens per strength.

Reported per row and anchor: seconds per round (median, range) and ``anchor s / toolkit s`` per round, plus the
ratio against the fastest anchor of each round (goal >= 1; >= 2 for patch and sweep). Guarded like every
script here (``benchmarks/_guard.py``): the load before/after is recorded and a loaded result is marked.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard

ANCHORS = ("tl", "nnsight", "hf")
ROWS = ("capture", "patch", "steer", "sweep")
GOALS = {"capture": 1.0, "patch": 2.0, "steer": 1.0, "sweep": 2.0}
CAPTURE_ATOL = 1e-5
PATCH_ATOL = 1e-4


@dataclass
class Models:
    """One set of weights, as each tool holds it (the anchors built on first use)."""

    backend: Any
    anchors: tuple[str, ...]
    _tl: Any = None
    _nns: Any = None

    @property
    def hf(self) -> Any:
        return self.backend.model

    @property
    def tl(self) -> Any:
        if self._tl is None:
            from memtoc.backends.interop import hooked_transformer_from_hf

            self._tl = hooked_transformer_from_hf(self.hf, self.backend.tokenizer)
        return self._tl

    @property
    def nns(self) -> Any:
        if self._nns is None:
            import nnsight

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")          # LanguageModel's deprecation notice (nnsight 0.8)
                self._nns = nnsight.LanguageModel(copy.deepcopy(self.hf), tokenizer=self.backend.tokenizer)
        return self._nns

    @property
    def n_blocks(self) -> int:
        return int(self.backend.parts.n_layers)

    def eos(self) -> list[int]:
        return sorted(self.backend._eos_ids())


@dataclass
class RowResult:
    """One row: per-path seconds per round, and what the agreement check found."""

    times: dict[str, list[float]] = field(default_factory=dict)
    agreement: dict[str, Any] = field(default_factory=dict)
    agree: bool = True
    sizes: dict[str, Any] = field(default_factory=dict)


def _rotate(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[:r % len(names)]


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _episodes(n: int, conditions: tuple[str, ...] = ("tool_wrong", "tool_right", "no_tool")) -> list[Any]:
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",), conditions=conditions)
    return eps[:n]


# -- capture ----------------------------------------------------------------------------------------------------

def _capture_anchor(m: Models, who: str, ids: torch.Tensor, mask: torch.Tensor, last: bool) -> dict[int, Any]:
    """Site -> the residual after block site-1 (``[B, d]`` at the last column, or ``[B, S, d]``)."""
    L = m.n_blocks
    pick = (lambda t: t[:, -1]) if last else (lambda t: t)
    with torch.no_grad():
        if who == "tl":
            _, cache = m.tl.run_with_cache(ids, attention_mask=mask,
                                           names_filter=lambda n: n.endswith("hook_resid_post"))
            return {s: pick(cache[f"blocks.{s - 1}.hook_resid_post"]) for s in range(1, L + 1)}
        if who == "nnsight":
            layers = m.nns.model.layers
            saved: list[Any] = []                       # filled inside the trace (nnsight runs its body apart)
            with m.nns.trace({"input_ids": ids, "attention_mask": mask}):
                for s in range(1, L + 1):
                    saved.append((layers[s - 1].output[:, -1] if last else layers[s - 1].output).save())
            return dict(zip(range(1, L + 1), saved))
        out = m.hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return {s: pick(out.hidden_states[s]) for s in range(1, L + 1)}


def _capture_diff(m: Models, who: str, block: Any, got: dict[int, Any], mask: torch.Tensor, eps: list[Any],
                  last: bool) -> float:
    """The largest per-site |difference| / max(1, max |ours|) between our rows and an anchor's."""
    L = m.n_blocks
    pos = {e.episode_id: i for i, e in enumerate(eps)}
    rows = torch.tensor([pos[e] for e in block.index["episode_id"]])
    n_tok = mask.sum(1)
    cols = torch.as_tensor(np.asarray(block.index["token_index"], dtype=np.int64))
    cols = mask.shape[1] - n_tok[rows] + cols
    worst = 0.0
    for s in range(1, L + 1):
        ours = torch.as_tensor(block.acts[s]).float()
        theirs = got[s][rows] if last else got[s][rows, cols]
        if who == "hf" and s == L:                     # output_hidden_states' last state is after the final norm
            with torch.no_grad():
                ours = m.backend.parts.final_norm(ours)
        scale = max(1.0, float(ours.abs().max()))
        worst = max(worst, float((ours - theirs.float()).abs().max()) / scale)
    return worst


def row_capture(m: Models, args: argparse.Namespace, tmp: Path) -> RowResult:
    from activations.batches import capture_batch
    from activations.positions import PositionSelector
    from activations.store import ActivationWriter

    L = m.n_blocks
    sites = tuple(range(1, L + 1))
    eps = sorted(_episodes(args.n_capture), key=lambda e: len(e.prompt))
    batches = [eps[i:i + args.batch_size] for i in range(0, len(eps), args.batch_size)]
    modes = [mo for mo in ("last_input", "all") if mo in args.capture_modes.split(",")]
    prov = m.backend.provenance()
    writers = {mo: ActivationWriter.open(tmp / f"capture_{mo}.h5", identity={"bench": f"anchors-{mo}"},
                                         provenance={"model_id": prov["model"]}, sites=sites,
                                         d_model=m.backend.parts.d_model, storage_dtype="float32")
               for mo in modes}
    selectors = {mo: PositionSelector.parse(mo) for mo in modes}
    paths = [f"{who}:{mo}" for mo in modes for who in ("toolkit", *m.anchors)]
    res = RowResult(times={p: [] for p in paths})
    worst = {p: 0.0 for p in paths if not p.startswith("toolkit")}
    rows_written = {mo: 0 for mo in modes}
    _guard.check_rounds(len(batches))
    for r, b in enumerate(batches):
        enc = m.backend.encode([e.prompt for e in b])
        ids, mask = enc["input_ids"], enc["attention_mask"]
        blocks, got = {}, {}
        for p in _rotate(paths, r):
            who, mo = p.split(":")
            if who == "toolkit":
                def ours(mo: str = mo, b: list[Any] = b) -> Any:
                    blk = capture_batch(m.backend, b, sites, selectors[mo])
                    writers[mo].append(blk)
                    return blk
                dt, blocks[mo] = _timed(ours)
                rows_written[mo] += blocks[mo].n_rows
            else:
                dt, got[p] = _timed(lambda who=who, mo=mo, ids=ids, mask=mask:
                                    _capture_anchor(m, who, ids, mask, mo == "last_input"))
            res.times[p].append(dt)
        for p, vals in got.items():
            who, mo = p.split(":")
            worst[p] = max(worst[p], _capture_diff(m, who, blocks[mo], vals, mask, b, mo == "last_input"))
    for w in writers.values():
        w.finish(planned=[e.episode_id for e in eps])
        w.close()
    res.agreement = {p: {"max_rel_diff": float(f"{v:.3g}"), "ok": v <= CAPTURE_ATOL} for p, v in worst.items()}
    res.agree = all(v["ok"] for v in res.agreement.values())
    res.sizes = {"prompts": len(eps), "batch_size": args.batch_size, "sites": L, "modes": modes,
                 "rows_written": rows_written,
                 "prompt_tokens": int(sum(len(m.backend.encode([e.prompt])["input_ids"][0]) for e in eps))}
    return res


# -- exact patching ---------------------------------------------------------------------------------------------

def demo_pairs(backend: Any, n: int) -> list[Any]:
    """``tool_right`` (clean) / ``tool_wrong`` (corrupt) pairs of the demo questions, the gold answer as the memory
    answer, built as ``memtoc patch`` builds them (``memtoc.jobs.patch``)."""
    from memtoc.jobs.patch import _sequence
    from probes.patching import PatchPair, align_positions

    by_q: dict[str, dict[str, Any]] = {}
    for ep in _episodes(10_000, ("tool_right", "tool_wrong")):
        by_q.setdefault(str(ep.question.id), {})[ep.arm] = ep
    pairs = []
    for qid, both in by_q.items():
        if len(both) < 2 or not both["tool_wrong"].tool_value:
            continue
        memory = str(both["tool_right"].question.gold_answer).strip()
        c, k = (_sequence(backend, both[x], memory, both["tool_wrong"].tool_value) for x in ("tool_right",
                                                                                             "tool_wrong"))
        if c is None or k is None or (c["a"], c["b"]) != (k["a"], k["b"]):
            continue
        positions = {r: align_positions(c["roles"][r], k["roles"][r]) for r in c["roles"]}
        pairs.append(PatchPair(f"{qid}|reference", c["ids"], k["ids"], positions, (c["a"], k["b"])))
        if len(pairs) >= n:
            break
    return pairs


def _metric(logits: torch.Tensor, a: int, b: int) -> float:
    from probes.patching import decision_metric

    return float(decision_metric(logits, a, b))


def _patch_tl(m: Models, pair: Any, roles: tuple[str, ...], blocks: list[int]) -> dict[tuple[int, str], float]:
    tl, (a, b) = m.tl, pair.answer_ids
    names = {k: f"blocks.{k}.hook_resid_post" for k in blocks}
    with torch.no_grad():
        _, clean = tl.run_with_cache(torch.tensor([pair.clean_ids]), names_filter=lambda n: n in names.values())
        corrupt = torch.tensor([pair.corrupt_ids])
        base = _metric(tl(corrupt)[0, -1], a, b)
        out = {}
        for k, name in names.items():
            for r in roles:
                c_pos, k_pos = pair.positions.get(r) or ([], [])
                if not c_pos:
                    continue

                def hook(act: torch.Tensor, hook: Any, _n: str = name, _c: list = c_pos, _k: list = k_pos) -> Any:
                    act[0, _k] = clean[_n][0, _c]
                    return act
                logits = tl.run_with_hooks(corrupt, fwd_hooks=[(name, hook)])
                out[(k, r)] = _metric(logits[0, -1], a, b) - base
    return out


def _patch_nnsight(m: Models, pair: Any, roles: tuple[str, ...], blocks: list[int]
                   ) -> dict[tuple[int, str], float]:
    lm, (a, b) = m.nns, pair.answer_ids
    layers = lm.model.layers
    clean_in = {"input_ids": torch.tensor([pair.clean_ids])}
    corrupt_in = {"input_ids": torch.tensor([pair.corrupt_ids])}
    with torch.no_grad():
        saved: list[Any] = []
        with lm.trace(clean_in):
            for k in blocks:
                saved.append(layers[k].output.save())
        clean = dict(zip(blocks, saved))
        with lm.trace(corrupt_in):
            base_logits = lm.output.logits[0, -1].save()
        base = _metric(base_logits, a, b)
        out = {}
        for k in blocks:
            for r in roles:
                c_pos, k_pos = pair.positions.get(r) or ([], [])
                if not c_pos:
                    continue
                with lm.trace(corrupt_in):
                    layers[k].output[0, k_pos] = clean[k][0, c_pos]
                    logits = lm.output.logits[0, -1].save()
                out[(k, r)] = _metric(logits, a, b) - base
    return out


def row_patch(m: Models, args: argparse.Namespace) -> RowResult:
    from probes.patching import ROLES, exact_patching, hook_names_for

    pairs = demo_pairs(m.backend, args.n_pairs)
    if not pairs:
        raise SystemExit("no demo pair maps its answers onto one token (memtoc.jobs.patch._sequence)")
    blocks = list(range(0, m.n_blocks, args.patch_every))
    names = hook_names_for(m.n_blocks, ["resid"], blocks)
    patch_anchors = [a for a in m.anchors if a in ("tl", "nnsight")]

    def toolkit() -> list[dict[tuple[int, str], float]]:
        outs = []
        for p in pairs:
            res = exact_patching(m.backend.parts, p, names, ROLES)
            outs.append({(int(n.split(".")[1]), r): v for n, d in res.effects.items() for r, v in d.items()
                         if not np.isnan(v)})
        return outs

    fns = {"tl": _patch_tl, "nnsight": _patch_nnsight}
    variants: dict[str, Callable[[], Any]] = {"toolkit": toolkit}
    for a in patch_anchors:
        variants[a] = lambda a=a: [fns[a](m, p, ROLES, blocks) for p in pairs]
    times, outs = _guard.interleave(variants, args.rounds)
    res = RowResult(times=times)
    for a in patch_anchors:
        diffs = [abs(ours[key] - theirs[key]) if key in theirs else float("inf")
                 for ours, theirs in zip(outs["toolkit"], outs[a]) for key in ours]
        same_cells = all(set(o) == set(t) for o, t in zip(outs["toolkit"], outs[a]))
        worst = max(diffs, default=0.0)
        res.agreement[a] = {"max_abs_diff": float(f"{worst:.3g}"), "cells": len(diffs),
                            "ok": same_cells and worst <= PATCH_ATOL}
    res.agree = all(v["ok"] for v in res.agreement.values())
    res.sizes = {"pairs": len(pairs), "blocks": blocks, "cells_per_pair": [len(o) for o in outs["toolkit"]],
                 "tokens_per_pair": [len(p.corrupt_ids) for p in pairs]}
    return res


# -- steered generation and the sweep ---------------------------------------------------------------------------

def _edit(m: Models, site: int, scale: float) -> Any:
    from steering import DirectionEdit

    d = m.backend.parts.d_model
    v = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return DirectionEdit.build(name="bench-anchors", layers=[site], vectors={site: v / v.norm()},
                               scale={site: scale}, positions="last_input", strength=1.0, toward="memory")


def _cut(ids: Any, eos: set[int]) -> tuple[int, ...]:
    out = []
    for t in ids:
        if int(t) in eos:
            break
        out.append(int(t))
    return tuple(out)


def _anchor_generate(m: Models, who: str, texts: list[str], site: int, delta: torch.Tensor, n_new: int
                     ) -> list[tuple[int, ...]]:
    """Greedy tokens of ``texts`` with ``delta`` added to the residual after block ``site - 1`` at the last prompt
    position (the prefill only), by an anchor's own generation loop."""
    eos = m.eos()
    tok = m.backend.tokenizer
    enc = m.backend.encode_formatted(texts)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    width = ids.shape[1]
    with torch.no_grad():
        if who == "hf":
            def hook(mod: Any, inp: Any, out: Any) -> Any:
                h = out[0] if isinstance(out, tuple) else out
                if h.shape[1] > 1:                       # the prefill: the last column is the last prompt token
                    h[:, -1] += delta
                return out
            handle = m.hf.model.layers[site - 1].register_forward_hook(hook)
            try:
                gen = m.hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, do_sample=False,
                                    eos_token_id=eos, pad_token_id=tok.pad_token_id)
            finally:
                handle.remove()
            new = gen[:, width:]
        elif who == "nnsight":
            lm = m.nns
            with lm.generate({"input_ids": ids, "attention_mask": mask}, max_new_tokens=n_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=tok.pad_token_id) as tracer:
                lm.model.layers[site - 1].output[:, -1] += delta     # the first step (the prefill) only
                gen = tracer.result.save()                           # generate's ids: prompt + new tokens
            new = gen[:, width:]
        else:
            def tl_hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
                if act.shape[1] > 1:
                    act[:, -1] += delta
                return act
            with m.tl.hooks(fwd_hooks=[(f"blocks.{site - 1}.hook_resid_post", tl_hook)]):
                gen = m.tl.generate(texts, max_new_tokens=n_new, do_sample=False, verbose=False,
                                    eos_token_id=eos, return_type="tokens", padding_side="left")
            new = gen[:, width:]                         # its own left-padded tokenization: the same width
    eos_set = set(eos)
    return [_cut(row.tolist(), eos_set) for row in new]


def _chunks(xs: list[Any], n: int) -> list[list[Any]]:
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def row_steer(m: Models, args: argparse.Namespace) -> RowResult:
    from memtoc.core.runtime import GenerationConfig

    site = min(args.site, m.n_blocks)
    edit = _edit(m, site, args.scale)
    delta = edit.delta(site).to(torch.float32)
    prompts = [e.prompt for e in _episodes(args.n_steer)]
    texts = [m.backend.format_prompt(p) for p in prompts]
    cfg = GenerationConfig(max_new_tokens=args.new_tokens, stop_at_final_line=False)
    eos = set(m.eos())

    def toolkit() -> list[tuple[int, ...]]:
        out = []
        for chunk in _chunks(prompts, args.batch_size):
            out += [_cut(g.token_ids, eos) for g in m.backend.generate(chunk, cfg, edit=edit)]
        return out

    variants: dict[str, Callable[[], Any]] = {"toolkit": toolkit}
    for a in m.anchors:
        variants[a] = lambda a=a: [t for c in _chunks(texts, args.batch_size)
                                   for t in _anchor_generate(m, a, c, site, delta, args.new_tokens)]
    times, outs = _guard.interleave(variants, args.rounds)
    res = RowResult(times=times)
    for a in m.anchors:
        same = sum(x == y for x, y in zip(outs["toolkit"], outs[a]))
        res.agreement[a] = {"identical_rows": same, "rows": len(prompts), "ok": same == len(prompts)}
    res.agree = all(v["ok"] for v in res.agreement.values())
    res.sizes = {"prompts": len(prompts), "new_tokens": args.new_tokens, "batch_size": args.batch_size,
                 "site": site, "generated": sum(len(t) for t in outs["toolkit"])}
    return res


def row_sweep(m: Models, args: argparse.Namespace) -> RowResult:
    from memtoc.core.runtime import GenerationConfig

    site = min(args.site, m.n_blocks)
    edit = _edit(m, site, args.scale)
    strengths = [float(s) for s in args.strengths.split(",")]
    prompts = [e.prompt for e in _episodes(args.n_sweep)]
    texts = [m.backend.format_prompt(p) for p in prompts]
    cfg = GenerationConfig(max_new_tokens=args.new_tokens, stop_at_final_line=False)
    eos = set(m.eos())

    def toolkit() -> dict[float, list[tuple[int, ...]]]:
        out: dict[float, list[tuple[int, ...]]] = {s: [] for s in strengths}
        for chunk in _chunks(prompts, args.batch_size):          # every strength of a chunk: rows of one batch
            rows = [p for _ in strengths for p in chunk]
            st = [s for s in strengths for _ in chunk]
            gens = m.backend.generate(rows, cfg, edit=edit.bind(rows, None, strengths=st))
            for s, g in zip(st, gens):
                out[s].append(_cut(g.token_ids, eos))
        return out

    def anchor(a: str) -> dict[float, list[tuple[int, ...]]]:
        return {s: [t for c in _chunks(texts, args.batch_size)
                    for t in _anchor_generate(m, a, c, site, edit.with_strength(s).delta(site).float(),
                                              args.new_tokens)]
                for s in strengths}

    variants: dict[str, Callable[[], Any]] = {"toolkit": toolkit}
    for a in m.anchors:
        variants[a] = lambda a=a: anchor(a)
    times, outs = _guard.interleave(variants, args.rounds)
    res = RowResult(times=times)
    for a in m.anchors:
        same = {f"{s:g}": sum(x == y for x, y in zip(outs["toolkit"][s], outs[a][s])) for s in strengths}
        res.agreement[a] = {"identical_rows_per_strength": same, "rows": len(prompts),
                            "ok": all(v == len(prompts) for v in same.values())}
    res.agree = all(v["ok"] for v in res.agreement.values())
    changed = sum(x != y for s in strengths[1:] for x, y in zip(outs["toolkit"][s], outs["toolkit"][strengths[0]]))
    res.sizes = {"prompts": len(prompts), "strengths": strengths, "new_tokens": args.new_tokens,
                 "batch_size": args.batch_size, "site": site, "rows_changed_by_the_edit": changed}
    return res


# -- the report -------------------------------------------------------------------------------------------------

def summarize_row(name: str, res: RowResult) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per-path seconds, per-anchor ratios (anchor s / toolkit s, per round) and the ratio to the fastest anchor."""
    out: dict[str, Any] = {"sizes": res.sizes, "agreement": res.agreement, "agree": res.agree,
                           "seconds": {p: _guard.summarize(v) for p, v in res.times.items()}, "ratios": {}}
    figs = []
    groups: dict[str, list[str]] = {}
    for p in res.times:
        who, _, mode = p.partition(":")
        groups.setdefault(mode, []).append(who)
    for mode, whos in groups.items():
        key = (lambda w, mode=mode: f"{w}:{mode}") if mode else (lambda w: w)
        tk = res.times[key("toolkit")]
        label = f"{name} ({mode})" if mode else name
        anchors = [w for w in whos if w != "toolkit"]
        for a in anchors:
            out["ratios"][key(a)] = _guard.ratios(res.times[key(a)], tk)
        if anchors:
            fastest = [min(res.times[key(a)][i] for a in anchors) / tk[i] for i in range(len(tk))]
            out["ratios"][key("fastest")] = _guard.summarize(fastest)
            figs.append(_guard.figure(f"{label}: fastest anchor s / toolkit s", out["ratios"][key("fastest")],
                                      goal=f"≥ {GOALS[name]:g}"))
            for a in anchors:
                figs.append(_guard.figure(f"{label}: {a} s / toolkit s", out["ratios"][key(a)]))
        figs.append(_guard.figure(f"{label}: toolkit s per round", out["seconds"][key("toolkit")], unit="s"))
    return out, figs


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "transformers", "transformer_lens", "nnsight"):
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def markdown(res: dict[str, Any]) -> str:
    """The table for docs/BENCHMARKS.md: one line per row (and capture mode)."""
    names = {"tl": "TransformerLens", "nnsight": "nnsight", "hf": "transformers"}
    anchors = res["anchors"]
    head = ("| work | toolkit s | " + " | ".join(f"{names[a]} s (× toolkit)" for a in anchors)
            + " | vs fastest anchor (range) | goal | agreement |")
    lines = [head, "|---|---:|" + "---:|" * len(anchors) + "---:|---|---|"]
    for row, r in res["rows"].items():
        modes = sorted({p.partition(":")[2] for p in r["seconds"]})
        for mode in modes:
            key = (lambda w, mode=mode: f"{w}:{mode}") if mode else (lambda w: w)
            cells = []
            for a in anchors:
                if key(a) in r["seconds"]:
                    cells.append(f"{r['seconds'][key(a)]['median']:.2f} ({r['ratios'][key(a)]['median']:.2f}×)")
                else:
                    cells.append("–")
            f = r["ratios"].get(key("fastest"), {})
            agree = "yes" if r["agree"] else "**no**"
            lines.append(f"| {row}{' ' + mode if mode else ''} | {r['seconds'][key('toolkit')]['median']:.2f} | "
                         + " | ".join(cells) + f" | **{f.get('median', 0):.2f}×** ({f.get('min', 0):.2f}–"
                         f"{f.get('max', 0):.2f}) | ≥ {GOALS[row]:g} | {agree} |")
    load = res["load"]
    lines.append("")
    lines.append(f"{res['status']}: load {load['before']['load_1m']} → {load['after']['load_1m']} on "
                 f"{load['before']['cpus']} CPUs; {res['threads']} threads; versions "
                 + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--anchors", default=",".join(ANCHORS), help=f"comma list of {', '.join(ANCHORS)}")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the patch, steer and sweep rows")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per batch (capture: one round per batch)")
    ap.add_argument("--n-capture", type=int, default=64)
    ap.add_argument("--capture-modes", default="last_input,all")
    ap.add_argument("--n-pairs", type=int, default=1)
    ap.add_argument("--patch-every", type=int, default=1, help="patch the residual after every k-th block")
    ap.add_argument("--n-steer", type=int, default=32)
    ap.add_argument("--n-sweep", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--site", type=int, default=15, help="the steered site (clipped to the model's blocks)")
    ap.add_argument("--scale", type=float, default=4.0, help="the direction's norm at strength 1")
    ap.add_argument("--strengths", default="0,2,4,8")
    ap.add_argument("--out", default=None, help="write the result JSON here (and the table beside it, .md)")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    anchors = tuple(a for a in args.anchors.split(",") if a)
    bad = [r for r in rows if r not in ROWS] + [a for a in anchors if a not in ANCHORS]
    if bad:
        ap.error(f"unknown row(s)/anchor(s) {bad}; rows: {', '.join(ROWS)}; anchors: {', '.join(ANCHORS)}")

    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    torch.set_num_threads(args.threads)
    backend = load_backend(ModelSpec(model=args.model, backend="hf", device="cpu", dtype="float32"))
    m = Models(backend, anchors)
    for a in anchors:                                     # build (and warm) every anchor before any timing
        if a != "hf":
            getattr(m, "tl" if a == "tl" else "nns")
    warm = _episodes(2)
    for a in (*anchors, "toolkit"):
        if a == "toolkit":
            backend.forward([e.prompt for e in warm])
        else:
            enc = backend.encode([e.prompt for e in warm])
            _capture_anchor(m, a, enc["input_ids"], enc["attention_mask"], True)
    tmp = Path(tempfile.mkdtemp(prefix="bench_anchors_"))
    result: dict[str, Any] = {"model": args.model, "dtype": "float32", "threads": torch.get_num_threads(),
                              "anchors": list(anchors), "versions": versions(), "rows": {}}
    figures: list[dict[str, Any]] = []
    guard = _guard.Guard("bench_anchors").__enter__()
    for row in rows:
        t0 = time.perf_counter()
        if row == "capture":
            res = row_capture(m, args, tmp)
        elif row == "patch":
            res = row_patch(m, args)
        elif row == "steer":
            res = row_steer(m, args)
        else:
            res = row_sweep(m, args)
        result["rows"][row], figs = summarize_row(row, res)
        result["rows"][row]["wall_s"] = round(time.perf_counter() - t0, 1)
        figures += figs
        ratios = ", ".join(f"{k} {v['median']:.2f}x" for k, v in result["rows"][row]["ratios"].items())
        print(f"bench_anchors: {row} done in {result['rows'][row]['wall_s']} s, agree={res.agree}; anchor s / "
              f"toolkit s: {ratios}; agreement {json.dumps(res.agreement)}", file=sys.stderr, flush=True)
    guard.__exit__(None, None, None)
    guard.finish(result, figures)
    result["status"] = result["load"]["status"]
    result["agree"] = all(r["agree"] for r in result["rows"].values())
    table = markdown(result)
    print(json.dumps(result, indent=1))
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        Path(args.out).with_suffix(".md").write_text(table, encoding="utf-8")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["agree"] else 1)
