"""Re-measure every timing figure of docs/BENCHMARKS.md in one command and write a fresh markdown table.

    .venv/bin/python benchmarks/run_all.py [--out bench_out] [--only lens,generate] [--model default]
    make bench

Runs each benchmark script with the command documented in docs/BENCHMARKS.md (one after another: never two at
once on the machine being measured), collects the ``figures`` and ``load`` every script writes through
``benchmarks/_guard.py``, and writes ``OUT/BENCHMARKS_latest.md`` (one row per figure: median, min-max over the
interleaved rounds, the load average before/after, and "loaded" where the load exceeded the CPU count) next to
each script's JSON and log. Paste the rows into docs/BENCHMARKS.md; a "loaded" row is not a quiet figure.

The fault-injection sweeps (``fault_inject_store.py``) are correctness checks taking hours and are not run here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: name -> (script, arguments, the flag that takes the JSON path); the commands of docs/BENCHMARKS.md
BENCHES: dict[str, tuple[str, list[str], str]] = {
    "generate": ("bench_generate.py", ["--n", "16", "--batch-size", "16", "--max-new-tokens", "64"], "--out"),
    "capture": ("bench_capture.py", ["--n-prompts", "24", "--batch-size", "8"], "--json"),
    "mining": ("bench_mining.py", ["--features", "16384", "--episodes", "1000", "--threads", "1"], "--out"),
    "lens": ("bench_lens.py", [], "--out"),
    "lens_corpus": ("bench_lens_corpus.py", ["--sequences", "40", "--rows", "32"], "--out"),
    "edit": ("bench_edit.py", ["--n", "8", "--max-new-tokens", "48", "--rounds", "4"], "--out"),
    "patch": ("bench_patch.py", ["--run", "bench_out/patch_run", "--limit", "4", "--rounds", "3"], "--out"),
    "config_checks": ("bench_config_checks.py", ["--rounds", "3"], "--out"),
    "model_load": ("bench_model_load.py", ["--rounds", "3"], "--out"),
    "sweep": ("bench_sweep.py", ["--limit", "4", "--max-new-tokens", "24", "--rounds", "3"], "--out"),
    "sandbox": ("bench_sandbox.py", ["--rounds", "20"], "--json"),
    "constrained": ("bench_constrained.py", ["--n-prompts", "4", "--rounds", "5", "--max-new-tokens", "96"],
                    "--out"),
    "executor": ("bench_executor.py", ["--limit", "1", "--max-new-tokens", "16", "--conditions", "tool_wrong"],
                 "--out"),
    # this toolkit against TransformerLens, nnsight and transformers on the same work (needs the interop extra)
    "anchors": ("bench_anchors.py", ["--rounds", "3", "--n-capture", "32", "--patch-every", "3", "--n-steer", "16",
                                     "--n-sweep", "4"], "--out"),
    # each backend in its own process (vLLM's CPU threads spin); needs `make vllm`
    "vllm": ("bench_vllm.py", ["--n", "32", "--max-new-tokens", "64", "--rounds", "3"], "--out"),
}
MODEL_FREE = {"mining", "sandbox"}


def _fmt(x) -> str:
    if x is None:
        return "–"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def table(results: dict[str, dict]) -> str:
    lines = ["| benchmark | figure | median | min – max | rounds | goal | load 1 min before → after (CPUs) | status |",
             "|---|---|---:|---:|---:|---|---|---|"]
    for name, res in results.items():
        if "error" in res:
            lines.append(f"| {name} | (failed: {res['error']}) | | | | | | |")
            continue
        load = res.get("load", {})
        b, a = load.get("before", {}), load.get("after", {})
        ld = f"{_fmt(b.get('load_1m'))} → {_fmt(a.get('load_1m'))} ({b.get('cpus')})"
        for f in res.get("figures", []):
            unit = f.get("unit", "")
            rng = (f"{_fmt(f.get('min'))} – {_fmt(f.get('max'))}" if f.get("min") is not None else "–")
            lines.append(f"| {name} | {f['figure']} | **{_fmt(f.get('median'))}{unit}** | {rng} | {_fmt(f.get('n'))} "
                         f"| {f.get('goal', '')} | {ld} | {load.get('status', '?')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_out", help="folder for the JSON, logs and BENCHMARKS_latest.md")
    ap.add_argument("--only", default="", help=f"comma list of: {', '.join(BENCHES)} (default: all)")
    ap.add_argument("--model", default="default")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for name in names:
        script, extra, flag = BENCHES[name]
        js = out / f"{name}.json"
        cmd = [sys.executable, str(HERE / script), *extra, flag, str(js)]
        if name not in MODEL_FREE:
            cmd += ["--model", args.model]
        print(f"run_all: {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        with (out / f"{name}.log").open("w") as log:
            rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
        if rc != 0 or not js.exists():
            results[name] = {"error": f"exit {rc}, see {out / (name + '.log')}"}
        else:
            results[name] = json.loads(js.read_text())
        print(f"run_all: {name}: done in {time.time() - t0:.0f} s (exit {rc})", flush=True)
        (out / "BENCHMARKS_latest.md").write_text("# Benchmark figures (benchmarks/run_all.py)\n\n" + table(results))
    print((out / "BENCHMARKS_latest.md").read_text())
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
