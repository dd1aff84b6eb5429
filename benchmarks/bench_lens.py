"""Lens costs in one run: rank-table reading vs the forward, lens-fit time and memory, the fit estimators.

    .venv/bin/python benchmarks/bench_lens.py --model default [--lens-file lens.safetensors] [--out bench.json]

1. Rank-table reading: the plain batched forward through the backend that produces the band's states at the final
   input position, then the lens reading (one mat-vec per site, the final norm + head, ranks of ~20 token ids),
   timed per part (transport, unembed, ranks). Reported as reading / forward (goal <= 0.3), per round. The ranks
   are also counted the way they were before (a broadcast ``[S, K, V]`` comparison) in the same rounds, which
   gives the before/after ratio of the change under the same conditions.
2. The three fit estimators (``replicate`` and ``vmap`` with ``--batch-rows`` cotangents per backward,
   ``one_row``) on one corpus sequence of median length, all source sites, ``--fit-rows`` output rows each, in
   ``--rounds`` interleaved rounds; the per-row time of each, their ratios, the estimator ``memtoc lens fit
   --mode auto`` would choose, and the ratio of the fastest to the compute bound (FLOPs of one backward per
   output row, ``probes.fit.backward_flops``, at the throughput of a float32 1024^3 matmul measured here).
   Scaled to all ``d_model`` rows per sequence and to 100 sequences. Peak memory = the process's peak resident
   set (VmHWM, reset before the first fit) minus the resident set before it.

Every comparison runs in interleaved rounds with the machine's load recorded before and after
(``benchmarks/_guard.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from memtoc.backends.factory import load_backend
from memtoc.core.runtime import ModelSpec
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from probes.fit import backward_flops, fixed_estimator, read_corpus, sequence_jacobians, tokenize_sequence
from probes.lens import JacobianLens, LensCapture
from probes.lenses import LensInputs, lens_class
from probes.model import parse_sites, token_ranks

try:
    from benchmarks import _guard
    from benchmarks.bench_lens_corpus import matmul_gflops
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard
    from bench_lens_corpus import matmul_gflops


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


def ranks_broadcast(logits: torch.Tensor, ids, n_vocab: int) -> torch.Tensor:
    """The rank count as it was before (a ``[S, K, V]`` comparison mask): the "before" of the reading figure."""
    z = logits[..., :n_vocab].float()
    t = torch.gather(z, -1, torch.as_tensor(ids).expand(*z.shape[:-1], len(ids)))
    return 1 + (z.unsqueeze(-2) > t.unsqueeze(-1)).sum(-1)


def bench_reading(backend, parts, prompts, sites, lens, batch_size, rounds):
    """Per round: seconds of the forward, the transport, the unembedding, the ranks (now) and the ranks (before)."""
    ids = list(range(0, 20000, 1000))       # ~20 token ids: answer, variants and controls
    keys = ("forward", "transport", "unembed", "ranks", "ranks_before")
    transport = lens_class("jacobian")()
    transport.artifact = lens
    out = {k: [] for k in keys}
    for _ in range(_guard.check_rounds(rounds)):
        t = dict.fromkeys(keys, 0.0)
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            cap = LensCapture(parts, sites)
            t0 = time.perf_counter()
            backend.forward(chunk, capture=cap)
            t1 = time.perf_counter()
            vecs = transport.read(LensInputs(parts, cap, sites))
            t["forward"] += t1 - t0
            t["transport"] += time.perf_counter() - t1
            for j in range(len(chunk)):
                t0 = time.perf_counter()
                z = parts.unembed(torch.stack([vecs[s][j] for s in sites]))
                t1 = time.perf_counter()
                token_ranks(z, ids, parts.n_vocab).min(0)
                t2 = time.perf_counter()
                ranks_broadcast(z, ids, parts.n_vocab).min(0)
                t3 = time.perf_counter()
                t["unembed"] += t1 - t0
                t["ranks"] += t2 - t1
                t["ranks_before"] += t3 - t2
        for k in keys:
            out[k].append(t[k])
    return out


def reading_part(backend, parts, sites, lens, args) -> tuple[dict, list[dict]]:
    """1. rank-table reading vs the forward, with the ranks counted now and as before, in the same rounds."""
    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",), conditions=("tool_wrong",))
    prompts = [e.prompt for e in eps[: args.n]]
    backend.forward(prompts[:2], capture=LensCapture(parts, sites))   # warm-up
    rd = bench_reading(backend, parts, prompts, sites, lens, args.batch_size, args.rounds)
    now = [a + b + c for a, b, c in zip(rd["transport"], rd["unembed"], rd["ranks"])]
    before = [a + b + c for a, b, c in zip(rd["transport"], rd["unembed"], rd["ranks_before"])]
    read_now, read_before = _guard.ratios(now, rd["forward"]), _guard.ratios(before, rd["forward"])
    out = {"n_prompts": len(prompts), "batch_size": args.batch_size, "sites": f"{sites[0]}-{sites[-1]}",
           "lens": "fitted" if args.lens_file else "random matrices (timing only)",
           "seconds_rounds": {k: _guard.summarize(v) for k, v in rd.items()},
           "reading_over_forward": read_now, "reading_over_forward_before": read_before}
    return out, [_guard.figure("lens reading / forward (after)", read_now, goal="≤ 0.3×"),
                 _guard.figure("lens reading / forward (before: broadcast ranks)", read_before)]


def fit_part(backend, parts, args) -> tuple[dict, list[dict]]:
    """2. the three fit estimators on one median-length corpus sequence, all source sites, interleaved."""
    L, d = parts.n_layers, parts.d_model
    texts, _, _ = read_corpus(None)
    toks = [tokenize_sequence(backend.tokenizer, t, max_seq_len=128, force_bos=True) for t in texts]
    lengths = [len(t) for t in toks]
    med = sorted(toks, key=len)[len(toks) // 2]
    ids = torch.tensor(med)
    src = list(range(L))
    ests = {n: fixed_estimator(n, args.batch_rows) for n in ("replicate", "vmap", "one_row")}
    for e in ests.values():   # warm-up
        sequence_jacobians(parts, ids, src, skip_first=16, batch_rows=min(2, e.batch_rows), rows=range(2), mode=e.mode)
    rss0 = _proc_status("VmRSS")
    peak_ok = _reset_peak()

    def fit_rows(e):
        return lambda: sequence_jacobians(parts, ids, src, skip_first=16, batch_rows=e.batch_rows,
                                          rows=range(args.fit_rows), mode=e.mode)
    times, _ = _guard.interleave({n: fit_rows(e) for n, e in ests.items()}, args.rounds)
    peak = _proc_status("VmHWM")
    gflops = matmul_gflops()
    per_row = {n: _guard.summarize([t / args.fit_rows for t in ts]) for n, ts in times.items()}
    fastest = min(per_row, key=lambda n: per_row[n]["min"])
    bound = backward_flops(parts, len(med)) / (gflops * 1e9)
    seq_s = per_row[fastest]["median"] * d
    out = {"sequence_tokens": len(med), "corpus_tokens_median": statistics.median(lengths),
           "corpus_tokens_mean": round(statistics.mean(lengths), 1), "source_sites": f"0-{L - 1}",
           "batch_rows": args.batch_rows, "rows_timed": args.fit_rows,
           "s_per_row": per_row, "fastest": fastest,
           "one_row_over_replicate": _guard.ratios(times["replicate"], times["one_row"]),
           "one_row_over_vmap": _guard.ratios(times["vmap"], times["one_row"]),
           "matmul_gflops": round(gflops, 1), "compute_bound_s_per_row": round(bound, 4),
           "fastest_over_compute_bound": round(per_row[fastest]["median"] / bound, 2),
           "seconds_per_sequence_scaled": round(seq_s, 1),
           "hours_per_100_sequences_scaled": round(seq_s * 100 / 3600, 2),
           "rss_before_fit_mib": round(rss0 / 2 ** 20, 1),
           "peak_rss_during_fit_mib": round(peak / 2 ** 20, 1) if peak_ok else None,
           "peak_extra_mib": round((peak - rss0) / 2 ** 20, 1) if peak_ok else None}
    return out, [
        _guard.figure("one_row speed vs replicate (replicate s / one_row s)", out["one_row_over_replicate"]),
        _guard.figure("one_row speed vs vmap (vmap s / one_row s)", out["one_row_over_vmap"]),
        _guard.figure(f"fit s per output row, fastest ({fastest})", per_row[fastest], unit="s"),
        _guard.figure("fastest estimator / compute bound", {"median": out["fastest_over_compute_bound"], "n": 1})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--lens-file", default=None, help="a fitted lens (default: random matrices; timing only)")
    ap.add_argument("--n", type=int, default=16, help="prompts for the reading benchmark")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", "--repeats", type=int, default=3, help="interleaved rounds of every comparison")
    ap.add_argument("--naive-rows", type=int, default=None, help="(kept for old command lines; every estimator is "
                    "now timed on --fit-rows rows)")
    ap.add_argument("--parts", default="reading,fit", help="which comparisons to run: reading, fit or both")
    ap.add_argument("--fit-rows", type=int, default=32, help="output rows timed per estimator and round")
    ap.add_argument("--batch-rows", type=int, default=32)
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
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

    want = {p.strip() for p in args.parts.split(",") if p.strip()}
    res = {"model": args.model, "n_layers": L, "d_model": d, "torch_threads": torch.get_num_threads(),
           "model_load_s": round(load_s, 1), "rounds": args.rounds}
    figures: list[dict] = []
    with _guard.Guard("bench_lens") as guard:
        if "reading" in want:
            res["reading"], figs = reading_part(backend, parts, sites, lens, args)
            figures += figs
        if "fit" in want:
            res["fit"], figs = fit_part(backend, parts, args)
            figures += figs
    guard.finish(res, figures)
    print(json.dumps(res, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
