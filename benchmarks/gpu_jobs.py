"""The user's jobs end to end on each device: ``memtoc`` commands as a user runs them, on CUDA and on the CPU of the
same machine, with the CPU as the reference. ``benchmarks/gpu_check.py`` proves the hooks' arithmetic on the
device; this proves the commands around them (episode planning, batching, HDF5 writing, edit files, scoring) run
there and agree with the CPU.

    python3 benchmarks/gpu_jobs.py --model MODEL --out DIR [--devices cuda,cpu] [--limit 2]

Each device runs, in float32, ``evaluate`` (closed-book first, then tool_wrong and tool_right), ``extract`` (sites
0, middle, last at ``last_input`` and ``tool_span``), ``sweep`` (a direction edit fitted by ``memtoc direction``
on the first device's store, strengths 0 and 16), ``rank-table`` (logit and JVP lenses) and ``patch``; the first
device also runs ``evaluate`` at its default dtype. Asserted: every command exits 0 on every device, ``evaluate``
stores as many episodes on each device as on the reference, and the stored residual stream of each device is
within ``STREAM_RTOL`` of the reference device's.
Reported: wall time per command, and how many responses, outcomes, sweep rows, rank cells and patch cells agree
(greedy decoding may take another token where two logits are within rounding: a count, not an assertion).
Writes ``DIR/gpu_jobs.json``; exits 1 naming each failed assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: max over rows of |h_dev - h_ref| / |h_ref| for float32 on two devices (different kernels, summation orders)
STREAM_RTOL = 1e-3
CONDITIONS = "tool_wrong,tool_right"


def _cli(args: list[str], log: Path) -> dict:
    """One ``memtoc`` command in a fresh process (as a user runs it): exit status, wall time, the log's tail."""
    t = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.call([sys.executable, "-m", "memtoc.cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                             cwd=REPO)
    tail = log.read_text(errors="replace")[-600:]
    return {"rc": rc, "wall_s": round(time.perf_counter() - t, 2), "tail": tail if rc else tail[-200:]}


def _by_episode(path: Path) -> dict:
    """A run's episode records by id (none when the run wrote no file)."""
    from memtoc.runs.runstore import read_jsonl

    return {r.get("episode_id"): r for _, r in read_jsonl(path, missing_ok=True).records}


def _agree(a: dict, b: dict, field: str) -> str:
    keys = sorted(set(a) & set(b), key=str)
    return f"{sum(a[k].get(field) == b[k].get(field) for k in keys)}/{len(keys)}"


def _stream_error(ref: Path, other: Path) -> dict:
    """Per site, the largest row-relative error of ``other``'s stored stream against ``ref``'s (rows matched by
    episode, position kind and token index)."""
    import numpy as np

    from activations.store import open_store

    out = {}
    with open_store(ref) as a, open_store(other) as b:
        def keys(s):
            i = s.index
            return list(zip(i["episode_id"], i["position_kind"], i["token_index"].tolist()))

        ka, kb = keys(a), keys(b)
        where = {k: n for n, k in enumerate(kb)}
        if set(ka) != set(kb):
            return {"rows": {"error": f"{len(set(ka) ^ set(kb))} rows stored on one device only"}}
        order = np.array([where[k] for k in ka])
        for site in a.layers:
            x = a.read(site).astype(np.float64)
            y = b.read(site)[order].astype(np.float64)
            rel = np.linalg.norm(x - y, axis=1) / np.maximum(np.linalg.norm(x, axis=1), 1e-30)
            out[f"site_{site}"] = {"rows": len(x), "max_rel": float(rel.max()), "median_rel": float(np.median(rel))}
    return out


def _table_agreement(a: Path, b: Path) -> dict:
    """Numeric leaves of two JSON tables: how many are equal, the largest absolute difference."""
    import math

    def leaves(x, key=""):
        if isinstance(x, dict):
            for k, v in x.items():
                yield from leaves(v, f"{key}/{k}")
        elif isinstance(x, list):
            for i, v in enumerate(x):
                yield from leaves(v, f"{key}/{i}")
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield key, float(x)

    if not (a.exists() and b.exists()):
        return {"error": f"missing: {a if not a.exists() else b}"}
    la, lb = dict(leaves(json.loads(a.read_text()))), dict(leaves(json.loads(b.read_text())))
    keys = [k for k in la if k in lb and not (math.isnan(la[k]) or math.isnan(lb[k]))]
    diffs = [abs(la[k] - lb[k]) for k in keys]
    return {"cells": len(keys), "equal": sum(d == 0 for d in diffs), "max_abs_diff": max(diffs, default=0.0),
            "only_in_one": len(set(la) ^ set(lb))}


def folders(out: Path, devices: list[str]) -> list[Path]:
    """One output folder per device run (the index keeps two runs on one device apart)."""
    return [out / f"{i}-{dev.replace(':', '_')}" for i, dev in enumerate(devices)]


def plan(model: str, out: Path, devices: list[str], limit: int, layers: int,
         max_new_tokens: int) -> list[tuple[str, str, str, list[str]]]:
    """The command lines, in order: (run label, device, job name, ``memtoc`` argv); the label (``0-cuda``) tells
    two runs on one device apart. The first device's store fits the edit every device's sweep reads."""
    common = ["--model", model, "--benchmark", "demo", "--limit", str(limit)]
    new = ["--max-new-tokens", str(max_new_tokens)]
    mid = layers // 2
    edit = str(out / "dir.json")
    steps: list[tuple[str, str, str, list[str]]] = []
    for i, (dev, d) in enumerate(zip(devices, folders(out, devices))):
        jobs: list[tuple[str, list[str]]] = []
        add = jobs.append
        on = ["--device", dev, "--dtype", "float32"]
        add(("evaluate", ["evaluate", *common, *on, "--conditions", CONDITIONS, *new, "--out", str(d / "eval")]))
        if i == 0:
            add(("evaluate_default_dtype", ["evaluate", *common, "--device", dev, "--conditions", CONDITIONS, *new,
                                            "--out", str(d / "eval-default-dtype")]))
        add(("extract", ["extract", *common, *on, "--conditions", CONDITIONS, "--layers", f"0,{mid},{layers}",
                         "--position-kinds", "last_input,tool_span", "--run", str(d / "eval"),
                         "--out", str(d / "acts.h5")]))
        if i == 0:
            add(("direction", ["direction", "--activations", str(d / "acts.h5"), "--contrast", "tool_wrong:tool_right",
                               "--layers", str(mid), "--all-questions", "--name", "dir", "--out", edit]))
        add(("sweep", ["sweep", *common, *on, "--edit", edit, "--strengths", "0,16", "--direction", "memory",
                       "--conditions", "tool_wrong", *new, "--out", str(d / "sweep")]))
        add(("rank_table", ["rank-table", "--model", model, *on, "--run", str(d / "eval"), "--lens", "logit,jvp",
                            "--out", str(d / "rank")]))
        add(("patch", ["patch", "--model", model, *on, "--run", str(d / "eval"), "--n-boot", "100", "--no-progress",
                       "--out", str(d / "patch")]))
        steps += [(d.name, dev, name, argv) for name, argv in jobs]
    return steps


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    devices = [d for d in args.devices.split(",") if d]
    res: dict = {"model": args.model, "devices": devices, "limit": args.limit, "jobs": {}, "agreement": {}}
    for label, _, name, argv in plan(args.model, out, devices, args.limit, args.layers, args.max_new_tokens):
        r = _cli(argv, out / f"{label}.{name}.log")
        res["jobs"].setdefault(label, {})[name] = r
        print(f"gpu_jobs: {label} {name} rc={r['rc']} ({r['wall_s']} s)", file=sys.stderr, flush=True)
    failed = [f"{label} {name}: exit {r['rc']}" for label, jobs in res["jobs"].items() for name, r in jobs.items()
              if r["rc"] != 0]
    res["agreement"], mismatched = compare(out, devices)
    res["failed"] = failed + mismatched
    return res


def compare(out: Path, devices: list[str]) -> tuple[dict, list[str]]:
    """Each device's outputs against the last device's: (agreement figures, failed assertions)."""
    failed: list[str] = []
    agreement: dict = {}
    ref = devices[-1]
    folder = folders(out, devices)
    rd = folder[-1]
    for dev, d in zip(devices[:-1], folder[:-1]):
        agree: dict = {}
        a, b = _by_episode(rd / "eval" / "episodes.jsonl"), _by_episode(d / "eval" / "episodes.jsonl")
        agree["evaluate"] = {"episodes": f"{len(b)}/{len(a)}", "responses_equal": _agree(a, b, "response"),
                             "outcomes_equal": _agree(a, b, "outcome")}
        if len(a) == 0 or len(a) != len(b):
            failed.append(f"{dev} evaluate: {len(b)} episodes against {len(a)} on {ref}")
        if (rd / "acts.h5").exists() and (d / "acts.h5").exists():
            err = _stream_error(rd / "acts.h5", d / "acts.h5")
            agree["extract"] = {"bound_max_rel": STREAM_RTOL, "sites": err}
            bad = [k for k, v in err.items() if "error" in v or v["max_rel"] > STREAM_RTOL]
            failed += [f"{dev} extract: {k} {err[k]}" for k in bad]
        agree["sweep"] = _table_agreement(rd / "sweep" / "sweep.json", d / "sweep" / "sweep.json")
        agree["rank_table"] = _table_agreement(rd / "rank" / "rank_table.json", d / "rank" / "rank_table.json")
        agree["patch"] = _table_agreement(rd / "patch" / "patch.json", d / "patch" / "patch.json")
        agreement[f"{dev} vs {ref}"] = agree
    return agreement, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .gguf file or a model directory")
    ap.add_argument("--out", required=True, help="output directory (gpu_jobs.json, one folder per device)")
    ap.add_argument("--devices", default="cuda,cpu", help="comma list; the last is the reference (default: cuda,cpu)")
    ap.add_argument("--limit", type=int, default=2, help="demo questions (default: 2; with 1, the default "
                    "model has no memory answer to patch and `patch` refuses, exit 2)")
    ap.add_argument("--layers", type=int, default=None, help="the model's blocks (sites 0..layers; default: read "
                    "from the model's config or GGUF header)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    for flag in ("limit", "layers", "max_new_tokens"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: at least 1")
    model, out = Path(args.model).resolve(), Path(args.out).resolve()
    if out == model or model in out.parents or out in model.parents:
        ap.error(f"--out {args.out} and --model {args.model} overlap: the runs go to a folder of their own")
    if args.layers is None:
        from memtoc.backends.preflight import model_shape
        from memtoc.core.errors import MemtocError

        try:
            shape = model_shape(args.model)
        except MemtocError as exc:
            ap.error(str(exc))
        if shape is None:
            ap.error(f"--layers: {args.model} states no block count; give it")
        args.layers = shape.n_layers
    os.environ.setdefault("PYTHONPATH", str(REPO))
    t = time.perf_counter()
    res = run(args)
    res["wall_s"] = round(time.perf_counter() - t, 1)
    (Path(args.out) / "gpu_jobs.json").write_text(json.dumps(res, indent=1))
    for f in res["failed"]:
        print(f"gpu_jobs: FAILED {f}", file=sys.stderr)
    print(f"gpu_jobs: {len(res['failed'])} failed ({res['wall_s']} s)", file=sys.stderr)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
