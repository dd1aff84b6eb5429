"""MI estimators for feature mining, side by side in one run: sklearn's kNN vs the vectorized kNN vs binned.

    .venv/bin/python benchmarks/bench_mining.py --features 16384 --episodes 1000

Synthetic SAE-like codes (sparse, non-negative; each latent fires with its own probability) with ``--planted``
latents whose firing depends on the behaviour label (strength varying from strong to weak). Reports the wall time
of each estimator, how many planted latents each puts in its top 20 / top 50, the overlap of its top-20 / top-50
with the sklearn kNN ranking, and (for knn-fast) the largest difference from sklearn's MI values.
``--sklearn-features N`` times sklearn on the first N latents only and extrapolates (marked "est.").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np
import torch

from steering.mi import mi_binned, mi_knn_fast, mi_knn_sklearn
from steering.mining_select import rank_order, topk_agreement

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def synthetic(n_eps: int, n_feat: int, n_planted: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n_eps // 2)
    y = np.concatenate([y, np.zeros(n_eps - len(y), dtype=y.dtype)])
    rng.shuffle(y)
    p = np.exp(rng.uniform(np.log(0.002), np.log(0.3), n_feat))
    z = np.zeros((n_eps, n_feat), dtype=np.float32)
    for i in range(0, n_feat, 2048):                       # bounded temporaries
        sl = slice(i, min(i + 2048, n_feat))
        fire = rng.random((n_eps, sl.stop - sl.start)) < p[sl]
        z[:, sl] = fire * rng.gamma(2.0, 1.0, fire.shape)
    planted = rng.choice(n_feat, n_planted, replace=False)
    for r, j in enumerate(planted):
        lift = 0.5 - 0.35 * r / max(1, n_planted - 1)      # firing-probability gap 0.5 (strong) .. 0.15 (weak)
        base = rng.uniform(0.05, 0.3)
        side = r % 2
        prob = np.where(y == side, base + lift, base)
        fire = rng.random(n_eps) < prob
        z[:, j] = fire * (rng.gamma(2.0, 1.0, n_eps) + 0.5 * (y == side))
    return z, y, planted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", type=int, default=16384)
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--planted", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sklearn-features", type=int, default=None, help="time sklearn on the first N latents only")
    ap.add_argument("--threads", type=int, default=None, help="torch threads for knn-fast / binned")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three estimators")
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    z, y, planted = synthetic(args.episodes, args.features, args.planted, args.seed)
    print(f"data: {args.episodes} episodes x {args.features} latents, {args.planted} planted; "
          f"{(z > 0).mean():.3f} active; built in {time.perf_counter() - t0:.1f} s", flush=True)

    results: dict[str, dict] = {}
    sk_n = args.sklearn_features or args.features
    est = sk_n < args.features
    with _guard.Guard("bench_mining") as guard:
        times, mis = _guard.interleave({"knn (sklearn)": lambda: mi_knn_sklearn(z[:, :sk_n], y, random_state=0),
                                        "knn-fast": lambda: mi_knn_fast(z, y, random_state=0),
                                        "binned": lambda: mi_binned(z, y)}, args.rounds)
    ref = mis["knn (sklearn)"]
    times["knn (sklearn)"] = [t * args.features / sk_n for t in times["knn (sklearn)"]]
    for name, ts in times.items():
        st = _guard.summarize(ts)
        results[name] = {"seconds": round(st["median"], 1), "seconds_rounds": st,
                         "estimated": est and name == "knn (sklearn)",
                         "features_timed": sk_n if name == "knn (sklearn)" else args.features}
        print(f"{name}: {st['median']:.1f} s (median of {st['n']}, spread {st['spread']})", flush=True)

    planted_set = set(int(j) for j in planted)
    ref_order = rank_order(ref)
    for name, mi in mis.items():
        order = rank_order(mi[:sk_n])             # overlaps: on the latents sklearn scored
        full = rank_order(mi)                     # planted recovery: on every latent this estimator scored
        r = results[name]
        r["planted_in_top20"] = len(planted_set & set(full[:20].tolist()))
        r["planted_in_top50"] = len(planted_set & set(full[:50].tolist()))
        r["top20_overlap_with_sklearn"] = topk_agreement(order, ref_order, 20)["overlap"]
        r["top50_overlap_with_sklearn"] = topk_agreement(order, ref_order, 50)["overlap"]
        if name == "knn-fast":
            diff = np.abs(mi[:sk_n] - ref)
            r["max_abs_diff_vs_sklearn"] = float(diff.max())
            r["share_identical_1e-9"] = float((diff <= 1e-9).mean())
    head = (f"{'estimator':<15} {'seconds':>9} {'planted@20':>11} {'planted@50':>11} {'top20∩sk':>9} {'top50∩sk':>9}")
    print("\n" + head)
    for name, r in results.items():
        sec = f"{r['seconds']:.1f}" + (" est." if r["estimated"] else "")
        print(f"{name:<15} {sec:>9} {r['planted_in_top20']:>8}/{args.planted:<2} {r['planted_in_top50']:>8}/"
              f"{args.planted:<2} {r['top20_overlap_with_sklearn']:>6}/20 {r['top50_overlap_with_sklearn']:>6}/50")
    fast = results["knn-fast"]
    print(f"\nknn-fast vs sklearn: max |ΔMI| = {fast['max_abs_diff_vs_sklearn']:.2e} nats, "
          f"{100 * fast['share_identical_1e-9']:.2f}% of latents within 1e-9")
    speed = _guard.ratios(times["knn (sklearn)"], times["knn-fast"])
    info = {"episodes": args.episodes, "features": args.features, "planted": args.planted, "seed": args.seed,
            "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0), "results": results,
            "knn_fast_speedup_rounds": speed}
    guard.finish(info, [_guard.figure(f"knn-fast vs sklearn kNN ({args.features} latents × {args.episodes})", speed),
                        _guard.figure("knn-fast seconds", results["knn-fast"]["seconds_rounds"], unit="s",
                                      goal="< 60 s")])
    print(json.dumps({k: v for k, v in info.items() if k != "results"}))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(info, fh, indent=2)


if __name__ == "__main__":
    main()
