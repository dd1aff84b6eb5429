"""Batched vs one-at-a-time greedy generation with the hf backend, side by side in one run.

    .venv/bin/python benchmarks/bench_generate.py --model default --n 16 --batch-size 16

Reports wall time, generated tokens per second, the speed-up of the batched path (shared-prefix prefill and
row compaction, ``memtoc.backends.decode``) and of the same batches run statically, and what the
machine's compute limit implies (about 2 x parameters FLOPs per generated token). The three paths run in
``--rounds`` interleaved rounds (order rotated); speed-ups are per-round ratios, reported as median and spread,
with the machine's load before and after (``benchmarks/_guard.py``).
"""

from __future__ import annotations

import argparse
import json
import resource

import torch

from memtoc.core.runtime import GenerationConfig, ModelSpec
from memtoc.backends.factory import load_backend
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--n", type=int, default=16, help="number of prompts")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three paths")
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
    args = ap.parse_args()

    backend = load_backend(ModelSpec(model=args.model, backend="hf", device="cpu", dtype="float32"))
    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",),
                         conditions=("tool_wrong", "tool_right"))
    prompts = [e.prompt for e in eps[: args.n]]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens)
    backend.generate(prompts[:2], cfg)  # warm-up

    def run_batches() -> list:
        out = []
        for i in range(0, len(prompts), args.batch_size):
            out += backend.generate(prompts[i:i + args.batch_size], cfg)
        return out

    def run_static() -> list:
        backend.fast_decoding = False   # the same batches as a static batch (what model.generate runs)
        try:
            return run_batches()
        finally:
            backend.fast_decoding = True

    with _guard.Guard("bench_generate") as guard:
        times, outs = _guard.interleave({"single": lambda: [backend.generate([p], cfg)[0] for p in prompts],
                                         "batched": run_batches, "static": run_static}, args.rounds)
    single, batched, static = outs["single"], outs["batched"], outs["static"]
    t_single, t_batched, t_static = (_guard.summarize(times[k])["median"] for k in ("single", "batched", "static"))
    speed = _guard.ratios(times["single"], times["batched"])
    speed_static = _guard.ratios(times["single"], times["static"])
    n_tok = sum(g.n_new_tokens for g in batched)
    n_params = sum(p.numel() for p in backend.parts.model.parameters())
    same = sum(a.text == b.text == c.text for a, b, c in zip(single, batched, static))
    res = {
        "model": args.model, "n_prompts": len(prompts), "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads(),
        "generated_tokens": n_tok, "single_s": round(t_single, 2), "batched_s": round(t_batched, 2),
        "speedup": speed["median"], "speedup_rounds": speed,
        "static_batched_s": round(t_static, 2), "static_speedup": speed_static["median"],
        "static_speedup_rounds": speed_static, "seconds_rounds": {k: _guard.summarize(v) for k, v in times.items()},
        "single_tok_per_s": round(n_tok / t_single, 1), "batched_tok_per_s": round(n_tok / t_batched, 1),
        "identical_answers": f"{same}/{len(prompts)}",
        "params": n_params,
        "achieved_gflops_batched": round(2 * n_params * n_tok / t_batched / 1e9, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    guard.finish(res, [_guard.figure(f"batched vs one at a time ({len(prompts)} prompts / {args.batch_size})",
                                     speed, goal="≥ 3×"),
                       _guard.figure("static batch vs one at a time", speed_static)])
    print(json.dumps(res, indent=1))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
