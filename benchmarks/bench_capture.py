"""Capture overhead: plain batched forward vs forward + capture + HDF5 write, on one model, in one run.

Modes (same prompts, same batches, same process):

- ``plain``: ``backend.forward(prompts)`` with no capture;
- ``last_input_all_layers``: capture of every site at ``last_input``, written to an HDF5 store;
- ``all_positions_4_layers``: capture of 4 sites at every prompt token, written to an HDF5 store.

Reported per mode: wall time, overhead ratio vs ``plain``, bytes written, HDF5 write throughput (time inside
``ActivationWriter.append``: encode + write + flush) vs a plain sequential file write of the same bytes in the
same pieces, and peak RSS while that mode ran (``/proc/self/clear_refs`` resets the high-water mark before
every step where the kernel allows it; otherwise the process peak so far). Modes are interleaved batch by batch
(order rotated every batch) so that load from other processes affects all of them alike; every batch is one
round: the overhead is also reported as the median and spread of the per-batch ratios, with the machine's load
before and after (``benchmarks/_guard.py``; at least 3 batches).

    .venv/bin/python benchmarks/bench_capture.py --model default --n-prompts 24 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from activations.batches import capture_batch  # noqa: E402
from activations.positions import PositionSelector  # noqa: E402
from activations.store import ActivationWriter, storage_report  # noqa: E402
from benchmarks import _guard  # noqa: E402


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _batches(items, size):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _plain_write(path: Path, pieces: list[int]) -> float:
    """Seconds to write ``pieces`` bytes sequentially (one write + flush per batch, like the store's commits)."""
    import numpy as np

    blob = np.random.default_rng(0).bytes(max(pieces) if pieces else 0)
    t0 = time.perf_counter()
    with path.open("wb") as fh:
        for n in pieces:
            fh.write(blob[:n])
            fh.flush()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    import torch

    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    t0 = time.perf_counter()
    backend = load_backend(ModelSpec(model=args.model, backend="hf", device=args.device, dtype=args.dtype))
    load_s = time.perf_counter() - t0
    torch.set_num_threads(args.threads or torch.get_num_threads())
    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",),
                         conditions=("tool_wrong", "tool_right", "no_tool"))[: args.n_prompts]
    eps = sorted(eps, key=lambda e: len(e.prompt))
    batches = list(_batches(eps, args.batch_size))
    L = backend.parts.n_layers
    four = sorted({0, L // 3, 2 * L // 3, L})
    modes = {
        "plain": None,
        "last_input_all_layers": (tuple(range(L + 1)), "last_input"),
        "all_positions_4_layers": (tuple(four), "all"),
    }
    # Warm-up (allocator, kernels) outside the timings.
    backend.forward([e.prompt for e in batches[0]])
    prov = backend.provenance()
    d_model = backend.parts.d_model
    storage = prov["dtype"] if prov["dtype"] in ("float32", "float16", "bfloat16") else "float32"
    results: dict = {"model": prov["model"], "device": prov["device"], "dtype": prov["dtype"],
                     "n_layers": L, "d_model": d_model, "n_prompts": len(eps), "batch_size": args.batch_size,
                     "n_tokens": 0, "load_s": round(load_s, 1), "threads": torch.get_num_threads(), "modes": {}}
    tmp = Path(tempfile.mkdtemp(prefix="bench_capture_"))
    # Modes are interleaved batch by batch, so load from other processes hits every mode alike.
    state = {name: {"wall": 0.0, "write": 0.0, "pieces": [], "rows": 0, "peak": 0.0, "reset": True, "rounds": []}
             for name in modes}
    _guard.check_rounds(len(batches))
    writers = {}
    for name, spec in modes.items():
        if spec is not None:
            writers[name] = ActivationWriter.open(tmp / f"{name}.h5", identity={"bench": name},
                                                  provenance={"model_id": prov["model"]}, sites=spec[0],
                                                  d_model=d_model, storage_dtype=storage)
    selectors = {name: PositionSelector.parse(spec[1]) for name, spec in modes.items() if spec is not None}
    names = list(modes)
    for r, b in enumerate(batches):
        for name in names[r % len(names):] + names[:r % len(names)]:
            spec = modes[name]
            st = state[name]
            st["reset"] &= _reset_peak_rss()
            t0 = time.perf_counter()
            if spec is None:
                out = backend.forward([e.prompt for e in b])
                results["n_tokens"] += int(out["attention_mask"].sum())
            else:
                block = capture_batch(backend, b, spec[0], selectors[name])
                tw = time.perf_counter()
                writers[name].append(block)
                st["write"] += time.perf_counter() - tw
                st["rows"] += block.n_rows
                st["pieces"].append(block.n_rows * d_model * len(spec[0]) * (4 if storage == "float32" else 2))
            st["rounds"].append(time.perf_counter() - t0)
            st["wall"] += st["rounds"][-1]
            st["peak"] = max(st["peak"], _peak_rss_mb())
    for name, spec in modes.items():
        st = state[name]
        entry = {"wall_s": round(st["wall"], 3), "peak_rss_mb": round(st["peak"], 1), "peak_rss_reset": st["reset"]}
        if spec is not None:
            tf = time.perf_counter()
            writers[name].finish(planned=[e.episode_id for e in eps])
            writers[name].close()
            entry["finish_s"] = round(time.perf_counter() - tf, 3)
            n_bytes = sum(st["pieces"])
            t_plain = _plain_write(tmp / f"{name}.bin", st["pieces"])
            rep = storage_report(tmp / f"{name}.h5")
            entry.update({
                "sites": list(spec[0]), "positions": spec[1], "rows": st["rows"], "activation_bytes": n_bytes,
                "file_bytes": rep["file_bytes"], "hdf5_write_s": round(st["write"], 3),
                "hdf5_MBps": round(n_bytes / 1e6 / st["write"], 1) if st["write"] else None,
                "plain_write_s": round(t_plain, 4),
                "plain_MBps": round(n_bytes / 1e6 / t_plain, 1) if t_plain else None,
            })
        results["modes"][name] = entry
    base = results["modes"]["plain"]["wall_s"]
    for name, entry in results["modes"].items():
        entry["overhead_vs_plain"] = round(entry["wall_s"] / base, 3)
        entry["overhead_rounds"] = _guard.ratios(state[name]["rounds"], state["plain"]["rounds"])
    import shutil

    shutil.rmtree(tmp)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--n-prompts", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    with _guard.Guard("bench_capture") as guard:
        res = run(args)
    guard.finish(res, [_guard.figure(f"capture overhead, {name} (× plain forward)", e["overhead_rounds"], goal="≤ 1.15")
                       for name, e in res["modes"].items() if name != "plain"])
    print(f"model {res['model']} on {res['device']} ({res['dtype']}), {res['n_layers']} blocks, d={res['d_model']}, "
          f"{res['n_prompts']} prompts / {res['n_tokens']} tokens in batches of {res['batch_size']}, "
          f"{res['threads']} threads")
    print(f"{'mode':24s} {'wall s':>8s} {'x plain':>8s} {'rows':>7s} {'MB':>8s} {'h5 MB/s':>8s} "
          f"{'file MB/s':>9s} {'peak RSS MB':>11s}")
    for name, e in res["modes"].items():
        mb = e.get("activation_bytes", 0) / 1e6
        print(f"{name:24s} {e['wall_s']:8.2f} {e['overhead_vs_plain']:8.3f} {e.get('rows', 0):7d} {mb:8.2f} "
              f"{e.get('hdf5_MBps') or 0:8.1f} {e.get('plain_MBps') or 0:9.1f} {e['peak_rss_mb']:11.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    else:
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
