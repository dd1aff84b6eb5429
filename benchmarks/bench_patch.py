"""Patching costs and agreement: attribution patching (one forward + one backward per pair) against
exact patching of every cell (batched patched forwards), on the default model's demo pairs.

    .venv/bin/python benchmarks/bench_patch.py --run RUN --limit 4 --rounds 3 --out bench_out/patch.json

``--run``: an evaluate run of ``tool_right`` and ``tool_wrong`` on the model (``memtoc evaluate --conditions
tool_right,tool_wrong``). Reported: seconds per pair of each method, their ratio (per round), and how well the
attribution estimate ranks the cells exact patching measures (Spearman over every cell, and the share of exact's top
10 cells in attribution's top 10).
"""

from __future__ import annotations

import argparse
import json


import numpy as np

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--limit", type=int, default=4, help="pairs timed")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--components", default="resid,attn,mlp")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from scipy.stats import spearmanr

    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec
    from memtoc.jobs.patch import build_pairs
    from probes.patching import ROLES, attribution_patching, effect_table, exact_patching, hook_names_for

    backend = load_backend(ModelSpec(model=args.model, backend="hf", device="cpu", dtype="float32"))
    from pathlib import Path

    if not Path(args.run).exists():          # the pairs' run: tool_right and tool_wrong of the demo set
        from memtoc.core.values import build_config
        from memtoc.jobs.evaluate import EvaluationConfig, run_evaluate

        run_evaluate(build_config(EvaluationConfig, dict(
            model=args.model, benchmark="demo", conditions="tool_right,tool_wrong", limit=3 * args.limit,
            max_new_tokens=32, out=args.run, progress=False)), backend=backend)
    model = backend.parts                 # patching runs through the model's parts (probes.patching)
    names = hook_names_for(backend.parts.n_layers, args.components.split(","))
    pairs, skipped = build_pairs(backend, args.run, "tool_right", "tool_wrong", args.limit)
    if not pairs:
        raise SystemExit(f"no pairs in {args.run} (skipped: {skipped})")
    attribution_patching(model, pairs[0], names[:3])             # warm-up
    variants = {"attribution": lambda: [attribution_patching(model, p, names) for p in pairs],
                "exact": lambda: [exact_patching(model, p, names) for p in pairs]}
    guard = _guard.Guard("bench_patch").__enter__()
    times, outs = _guard.interleave(variants, args.rounds)
    guard.__exit__(None, None, None)
    a = effect_table(outs["attribution"], names, ROLES)
    e = effect_table(outs["exact"], names, ROLES)
    ok = ~np.isnan(a) & ~np.isnan(e)
    rho = float(spearmanr(np.abs(a[ok]), np.abs(e[ok])).statistic)
    mean_a, mean_e = np.nanmean(a, 0).ravel(), np.nanmean(e, 0).ravel()
    keep = ~np.isnan(mean_a) & ~np.isnan(mean_e)
    top = 10
    top_a = set(np.argsort(-np.abs(np.where(keep, mean_a, 0)))[:top])
    top_e = set(np.argsort(-np.abs(np.where(keep, mean_e, 0)))[:top])
    per_pair = {k: _guard.summarize([t / len(pairs) for t in v]) for k, v in times.items()}
    res = {"model": args.model, "n_pairs": len(pairs), "n_cells_per_pair": len(names) * len(ROLES),
           "n_blocks": backend.parts.n_layers, "components": args.components, "skipped": skipped,
           "seconds_per_pair": per_pair, "exact_over_attribution": _guard.ratios(times["exact"], times["attribution"]),
           "spearman_abs_effects_all_cells": round(rho, 3), "top10_overlap": len(top_a & top_e) / top}
    figs = [_guard.figure("exact / attribution seconds per pair", res["exact_over_attribution"]),
            _guard.figure("attribution seconds per pair", per_pair["attribution"], unit="s"),
            _guard.figure("exact seconds per pair (every cell)", per_pair["exact"], unit="s"),
            _guard.figure("attribution vs exact, Spearman |effect| over every cell",
                          _guard.summarize([rho]), unit=""),
            _guard.figure("attribution vs exact, share of exact's top 10 cells in attribution's top 10",
                          _guard.summarize([res["top10_overlap"]]), unit="")]
    guard.finish(res, figs)
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
    print(f"HEADLINE ({res['load']['status']}): attribution {per_pair['attribution']['median']:.2f} s/pair, exact "
          f"{per_pair['exact']['median']:.2f} s/pair ({res['exact_over_attribution']['median']:.1f}x); Spearman "
          f"{rho:.2f}, top-10 overlap {res['top10_overlap']:.1f}")



if __name__ == "__main__":
    main()
