"""How many corpus sequences the default model's Jacobian lens needs, and what each costs on this machine.

    .venv/bin/python benchmarks/bench_lens_corpus.py --model default --sequences 40 --rows 32 --out corpus.json

1. Calibration as ``memtoc lens fit --mode auto`` runs it (``probes.fit.calibrate_estimator``, here with 3
   interleaved rounds): seconds per output row of each estimator on the corpus's median-length sequence.
2. The chosen estimator on the first ``--sequences`` corpus lines, ``--rows`` output rows each (a fixed random
   subset of the ``d_model`` rows; rows are independent, so the subset samples the matrices' error): seconds per
   sequence, scaled to all rows, and the ratio to the compute bound (FLOPs of one backward per output row,
   ``probes.fit.backward_flops``, at the throughput of a float32 matmul measured here).
3. Quality of an N-sequence lens from the per-sequence contributions ``C_i`` (the lens is their mean):
   the expected relative Frobenius difference between an N-sequence fit and an M-sequence fit,
   ``sqrt(tr Var(C) (1/N - 1/M)) / ||mean C||``, for M = the whole shipped corpus and M = infinity, per source
   site (median and max over sites reported); and a direct split-half check (two disjoint halves of the fitted
   sequences, ``||mean A - mean B|| / ||mean||``, which the variance formula predicts as ``sqrt(4/K) ...``).
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
from probes.fit import (backward_flops, calibrate_estimator, fixed_estimator, read_corpus, sequence_jacobians,
                        tokenize_sequence,
                        valid_positions)

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def matmul_gflops(rounds: int = 5, n: int = 1024) -> float:
    """Throughput of a float32 ``n x n`` matmul here (the best of ``rounds``): the machine's compute bound."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(rounds))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rel_error(contribs: list[torch.Tensor], n: int, m: float) -> float:
    """Expected ``||Jbar_N - Jbar_M|| / ||Jbar||`` from per-sequence contributions (rows of one site)."""
    c = torch.stack(contribs)                                    # [K, R, d]
    mean = c.mean(0)
    var = c.var(0, unbiased=True).sum()
    frac = 1.0 / n - (0.0 if m == float("inf") else 1.0 / m)
    return float((var * max(frac, 0.0)).sqrt() / mean.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--sequences", type=int, default=40, help="corpus lines fitted (on --rows rows each)")
    ap.add_argument("--rows", type=int, default=32, help="output rows per sequence (a fixed random subset)")
    ap.add_argument("--batch-rows", type=int, default=32)
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--skip-first", type=int, default=16)
    ap.add_argument("--sizes", default="4,12,24,48", help="corpus sizes N to report the quality of")
    ap.add_argument("--mode", default="auto", help="auto (calibrate, as memtoc lens fit does) or a fixed estimator")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = load_backend(ModelSpec(model=args.model, backend="hf", device="cpu", dtype="float32"))
    parts = backend.parts
    L, d = parts.n_layers, parts.d_model
    texts, _, _ = read_corpus(None)
    toks = [tokenize_sequence(backend.tokenizer, t, max_seq_len=args.max_seq_len, force_bos=True) for t in texts]
    usable = [t for t in toks if valid_positions(len(t), args.skip_first)]
    med = sorted(usable, key=len)[len(usable) // 2]
    src = list(range(L))
    rows = sorted(torch.randperm(d, generator=torch.Generator().manual_seed(0))[:args.rows].tolist())

    with _guard.Guard("bench_lens_corpus") as guard:
        choice = (calibrate_estimator(parts, torch.tensor(med), src, skip_first=args.skip_first,
                                      batch_rows=args.batch_rows, rounds=3) if args.mode == "auto"
                  else fixed_estimator(args.mode, args.batch_rows))
        print(f"calibration: {choice.name} chosen; s per row {choice.seconds_per_row}", flush=True)
        contribs: dict[int, list[torch.Tensor]] = {s: [] for s in src}
        per_seq, lengths = [], []
        for i, ids in enumerate(toks[:args.sequences]):
            t0 = time.perf_counter()
            c = sequence_jacobians(parts, torch.tensor(ids), src, skip_first=args.skip_first,
                                   batch_rows=choice.batch_rows, rows=rows, mode=choice.mode)
            dt = time.perf_counter() - t0
            if c is None:
                continue
            for s in src:
                contribs[s].append(c[s])
            per_seq.append(dt * d / len(rows))
            lengths.append(len(ids))
            print(f"sequence {i}: {len(ids)} tokens, {dt:.1f} s for {len(rows)} rows -> {per_seq[-1]:.0f} s "
                  "for all rows", flush=True)
        gflops = matmul_gflops()

    K = len(per_seq)
    full_corpus = len(usable)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    quality = {}
    for n in sizes:
        vs_full = [rel_error(contribs[s], n, full_corpus) for s in src]
        vs_inf = [rel_error(contribs[s], n, float("inf")) for s in src]
        quality[str(n)] = {"rel_diff_vs_full_corpus_median": round(statistics.median(vs_full), 4),
                           "rel_diff_vs_full_corpus_max": round(max(vs_full), 4),
                           "rel_err_vs_infinite_median": round(statistics.median(vs_inf), 4),
                           "rel_err_vs_infinite_max": round(max(vs_inf), 4)}
    half = K // 2
    split = []
    for s in src:
        a = torch.stack(contribs[s][:half]).mean(0)
        b = torch.stack(contribs[s][half:2 * half]).mean(0)
        split.append(float((a - b).norm() / ((a + b) / 2).norm()))
    flops_med = backward_flops(parts, len(med))
    row_s = choice.seconds_per_row.get(choice.name) or statistics.median(
        p / d for p in per_seq)                                   # fixed mode: from the fitted sequences
    sec_per_token = statistics.median(p / n for p, n in zip(per_seq, lengths))
    res = {
        "model": args.model, "n_layers": L, "d_model": d, "torch_threads": torch.get_num_threads(),
        "calibration": choice.meta()["estimator_calibration"], "estimator": choice.name,
        "calibration_sequence_tokens": len(med),
        "matmul_gflops": round(gflops, 1), "backward_gflop_per_row_median_sequence": round(flops_med / 1e9, 2),
        "compute_bound_s_per_row": round(flops_med / (gflops * 1e9), 4), "measured_s_per_row": row_s,
        "ratio_to_compute_bound": round(row_s / (flops_med / (gflops * 1e9)), 2),
        "sequences_fitted": K, "rows_per_sequence": len(rows),
        "seconds_per_sequence_all_rows": _guard.summarize(per_seq),
        "tokens": {"median": statistics.median(lengths), "mean": round(statistics.mean(lengths), 1)},
        "corpus_lines": len(texts), "corpus_usable_lines": full_corpus,
        "projected_minutes": {str(n): round(sum(per_seq[:n]) / 60 if n <= K else
                                            sec_per_token * sum(len(t) for t in usable[:n]) / 60, 1)
                              for n in sizes + [full_corpus]},
        "quality": quality,
        "split_half_rel_diff": {"halves_of": half, "median": round(statistics.median(split), 4),
                                "max": round(max(split), 4)},
    }
    guard.finish(res, [
        _guard.figure("lens fit, s per sequence (all rows, chosen estimator)", res["seconds_per_sequence_all_rows"],
                      unit="s"),
        _guard.figure("lens fit, measured / compute bound per row", {"median": res["ratio_to_compute_bound"],
                                                                      "n": 1})])
    print(json.dumps(res, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
