"""Lens costs in one run: rank-table reading vs the forward, lens-fit time and memory, batched vs naive cotangents.

    .venv/bin/python benchmarks/bench_lens.py --model default [--lens-file lens.safetensors] [--output bench.json]

1. Rank-table reading: the plain batched forward through the backend that produces the band's states at the final
   input position, then the lens reading (one mat-vec per site, the final norm + head, ranks of ~20 token ids).
   Reported as reading / forward (goal <= 1.5).
2. ``memtoc lens fit`` per sequence: the batched-cotangent estimator on one corpus sequence of median length, all
   source sites, timed on ``--fit-rows`` output rows and scaled to all ``d_model`` rows (the cost is linear in
   rows: one backward pass per ``--batch-rows`` rows), then to 100 sequences. Peak memory = the process's peak
   resident set (VmHWM, reset before the fit) minus the resident set before it.
3. The same rows one at a time (``batch_rows=1``, the naive loop) -> speed-up of the batched estimator (goal >= 5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from memtoc.backends.factory import load_backend
from memtoc.backends.spec import ModelSpec
from memtoc.benchmark import load_benchmark
from memtoc.episodes import build_episodes
from probes.fit import read_corpus, sequence_jacobians, tokenize_sequence
from probes.lens import JacobianLens, LensCapture, read_lenses
from probes.model import parse_sites, token_ranks


def _proc_status(key: str) -> int:
    """A /proc/self/status memory field in bytes (Linux); -1 where unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_reading(backend, parts, prompts, sites, lens, batch_size, repeats):
    ids = list(range(0, 20000, 1000))       # ~20 token ids: answer, variants and controls
    fwd, read = [], []
    for _ in range(repeats):
        t_f = t_r = 0.0
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            cap = LensCapture(parts, sites)
            t0 = time.perf_counter()
            backend.forward(chunk, capture=cap)
            t1 = time.perf_counter()
            vecs = read_lenses(parts, cap, ["jacobian"], lens)["jacobian"]
            for j in range(len(chunk)):
                z = parts.unembed(torch.stack([vecs[s][j] for s in sites]))
                token_ranks(z, ids, parts.n_vocab).min(0)
            t_f += t1 - t0
            t_r += time.perf_counter() - t1
        fwd.append(t_f)
        read.append(t_r)
    return min(fwd), min(read)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--lens-file", default=None, help="a fitted lens (default: random matrices; timing only)")
    ap.add_argument("--n", type=int, default=16, help="prompts for the reading benchmark")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fit-rows", type=int, default=64, help="output rows timed for the batched estimator")
    ap.add_argument("--naive-rows", type=int, default=8, help="output rows timed one at a time")
    ap.add_argument("--batch-rows", type=int, default=32)
    ap.add_argument("--output", help="write the figures as JSON")
    args = ap.parse_args()

    t0 = time.perf_counter()
    backend = load_backend(ModelSpec(model=args.model, backend="hf", device="cpu", dtype="float32"))
    load_s = time.perf_counter() - t0
    parts = backend.parts
    L, d = parts.n_layers, parts.d_model
    sites = list(parse_sites(None, L))
    if args.lens_file:
        lens = JacobianLens.load(args.lens_file, model=parts.model)
    else:
        g = torch.Generator().manual_seed(0)
        lens = JacobianLens(matrices={s: torch.randn(d, d, generator=g) / d ** 0.5 for s in range(L)})

    # 1. rank-table reading vs forward
    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",), conditions=("tool_wrong",))
    prompts = [e.prompt for e in eps[: args.n]]
    backend.forward(prompts[:2], capture=LensCapture(parts, sites))   # warm-up
    t_fwd, t_read = bench_reading(backend, parts, prompts, sites, lens, args.batch_size, args.repeats)

    # 2. lens fit on one median-length corpus sequence (all source sites, as `memtoc lens fit` does by default)
    texts, _, _ = read_corpus(None)
    toks = [tokenize_sequence(backend.tokenizer, t, max_seq_len=128, force_bos=True) for t in texts]
    lengths = [len(t) for t in toks]
    med = sorted(toks, key=len)[len(toks) // 2]
    ids = torch.tensor(med)
    src = list(range(L))
    sequence_jacobians(parts, ids, src, skip_first=16, batch_rows=args.batch_rows, rows=range(2))   # warm-up
    rss0 = _proc_status("VmRSS")
    peak_ok = _reset_peak()
    t0 = time.perf_counter()
    sequence_jacobians(parts, ids, src, skip_first=16, batch_rows=args.batch_rows, rows=range(args.fit_rows))
    t_batched = time.perf_counter() - t0
    peak = _proc_status("VmHWM")
    t0 = time.perf_counter()
    sequence_jacobians(parts, ids, src, skip_first=16, batch_rows=1, rows=range(args.naive_rows))
    t_naive = time.perf_counter() - t0

    per_row_b = t_batched / args.fit_rows
    per_row_n = t_naive / args.naive_rows
    seq_s = per_row_b * d
    res = {
        "model": args.model, "n_layers": L, "d_model": d, "torch_threads": torch.get_num_threads(),
        "load_average_1min": round(os.getloadavg()[0], 2), "model_load_s": round(load_s, 1),
        "reading": {"n_prompts": len(prompts), "batch_size": args.batch_size, "sites": f"{sites[0]}-{sites[-1]}",
                    "lens": "fitted" if args.lens_file else "random matrices (timing only)",
                    "forward_s": round(t_fwd, 3), "lens_reading_s": round(t_read, 3),
                    "reading_over_forward": round(t_read / t_fwd, 3),
                    "forward_plus_reading_over_forward": round((t_fwd + t_read) / t_fwd, 3)},
        "fit": {"sequence_tokens": len(med), "corpus_tokens_median": statistics.median(lengths),
                "corpus_tokens_mean": round(statistics.mean(lengths), 1), "source_sites": f"0-{L - 1}",
                "batch_rows": args.batch_rows, "rows_timed": args.fit_rows,
                "batched_s_per_row": round(per_row_b, 4),
                "seconds_per_sequence_scaled": round(seq_s, 1),
                "hours_per_100_sequences_scaled": round(seq_s * 100 / 3600, 2),
                "rss_before_fit_mib": round(rss0 / 2 ** 20, 1),
                "peak_rss_during_fit_mib": round(peak / 2 ** 20, 1) if peak_ok else None,
                "peak_extra_mib": round((peak - rss0) / 2 ** 20, 1) if peak_ok else None},
        "naive_vs_batched": {"naive_rows_timed": args.naive_rows, "naive_s_per_row": round(per_row_n, 4),
                             "batched_s_per_row": round(per_row_b, 4), "speedup": round(per_row_n / per_row_b, 2)},
    }
    print(json.dumps(res, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
