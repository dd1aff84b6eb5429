"""Start-up cost of the code-executor sandbox with and without kernel isolation, side by side in one run.

    .venv/bin/python benchmarks/bench_sandbox.py --rounds 20

Variants (interleaved: every round runs each variant once, in a rotated order, so load changes hit all of
them alike); the code is the problem ``add-000``-style scripted call ``print(round(12.345 + 3.21, 3))``:

- ``bare_python``: ``python -I -B -c <code>``, no sandbox at all (the floor);
- ``hook_only``: :func:`run_python` with ``layers=()`` -- the executor as it was before kernel isolation
  (audit hook, rlimits, process group, scratch dir);
- ``netns`` / ``landlock`` / ``seccomp``: one kernel layer on top of ``hook_only``;
- ``isolated``: :func:`run_python` as it runs by default (all three layers);
- ``isolated_numpy``: the same with ``import numpy`` in the code (the prelude preloads it);
- ``bwrap_bare_python`` (only when ``bwrap`` is on PATH): ``bare_python`` inside
  ``bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --tmpfs /tmp``, to price the wrapper.

Reported per variant: median and 90th percentile of wall time, and the median CPU time of the child
processes (user + system, from ``RUSAGE_CHILDREN``; less disturbed by other jobs than wall time; not
measurable for bwrap, whose sandboxed process is reaped inside its PID namespace), and the ratio of
``isolated`` to ``hook_only``. Then the cost of applying each layer by itself, timed inside a forked child
with ``time.thread_time`` (CPU time of that thread, kernel work included: the least load-sensitive figure).
``--json`` writes the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time

from memtoc.tasks.codeexec import _kernel_layers as kernel
from memtoc.tasks.codeexec import isolation
from memtoc.tasks.codeexec.isolation import landlock_abi
from memtoc.tasks.codeexec.sandbox import isolation_status, run_python

CODE = "print(round(12.345 + 3.21, 3))\n"
NUMPY_CODE = "import numpy as np\nprint(np.round(np.float64(12.345) + 3.21, 3))\n"


try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _bare(prefix: list[str]) -> None:
    out = subprocess.run(prefix + [sys.executable, "-I", "-B", "-c", CODE], capture_output=True, text=True,
                         check=True).stdout
    assert out == "15.555\n", out


def _sandboxed(code: str, expected: str, **kw) -> None:
    r = run_python(code, timeout_s=60.0, cpu_s=30, **kw)
    assert r.ok and r.stdout == expected, r


def layer_cost(layer: str) -> float:
    """Thread CPU seconds to apply one layer (with this interpreter's default policy) in a forked child."""
    r, w = os.pipe()
    policy = isolation.default_policy("/tmp")
    libc = kernel._libc()
    pid = os.fork()
    if pid == 0:                                              # child: apply, time, report, exit
        os.close(r)
        t0 = time.thread_time()
        ok, detail = {"netns": lambda: kernel.apply_netns(libc),
                      "landlock": lambda: kernel.apply_landlock(libc, policy),
                      "seccomp": lambda: kernel.apply_seccomp(libc)}[layer]()
        os.write(w, f"{int(ok)} {time.thread_time() - t0}".encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 100).decode().split()
    os.close(r)
    os.waitpid(pid, 0)
    if data[0] != "1":
        return float("nan")
    return float(data[1])


def variants() -> dict:
    v = {
        "bare_python": lambda: _bare([]),
        "hook_only": lambda: _sandboxed(CODE, "15.555\n", layers=()),
        "netns": lambda: _sandboxed(CODE, "15.555\n", layers=("netns",)),
        "landlock": lambda: _sandboxed(CODE, "15.555\n", layers=("landlock",)),
        "seccomp": lambda: _sandboxed(CODE, "15.555\n", layers=("seccomp",)),
        "isolated": lambda: _sandboxed(CODE, "15.555\n"),
        "hook_only_numpy": lambda: _sandboxed(NUMPY_CODE, "15.555\n", layers=()),
        "isolated_numpy": lambda: _sandboxed(NUMPY_CODE, "15.555\n"),
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        v["bwrap_bare_python"] = lambda: _bare([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                                                "--dev", "/dev", "--tmpfs", "/tmp"])
    return v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", default=None, help="write the raw timings here")
    args = ap.parse_args()
    status = isolation_status()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"kernel {platform.release()}, Landlock ABI {landlock_abi()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {status.summary()}")
    print(f"uptime before: {uptime}")
    vs = variants()
    for fn in vs.values():                                   # warm the caches (policy, page cache)
        fn()
    wall: dict[str, list[float]] = {k: [] for k in vs}
    cpu: dict[str, list[float]] = {k: [] for k in vs}
    names = list(vs)
    guard = _guard.Guard("bench_sandbox").__enter__()
    for i in range(_guard.check_rounds(args.rounds)):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            c0, t0 = _children_cpu(), time.perf_counter()
            vs[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_children_cpu() - c0)
    guard.__exit__(None, None, None)
    print(f"uptime after:  {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    base_w, base_c = statistics.median(wall["hook_only"]), statistics.median(cpu["hook_only"])
    print(f"\n{'variant':<20} {'wall median':>12} {'wall p90':>10} {'child CPU median':>17} {'wall / hook_only':>17}"
          f" {'CPU / hook_only':>16}")
    rows = {}
    for name in names:
        w, c = sorted(wall[name]), cpu[name]
        med, p90, cmed = statistics.median(w), w[min(len(w) - 1, int(0.9 * len(w)))], statistics.median(c)
        rows[name] = {"wall_median_ms": round(med * 1e3, 1), "wall_p90_ms": round(p90 * 1e3, 1),
                      "cpu_median_ms": round(cmed * 1e3, 1)}
        cpu_text = (f"{'n/a':>17} {'n/a':>16}" if name.startswith("bwrap") else
                    f"{cmed * 1e3:>15.1f}ms {cmed / base_c:>15.2f}x")
        print(f"{name:<20} {med * 1e3:>10.1f}ms {p90 * 1e3:>8.1f}ms {cpu_text.split()[0]:>17} "
              f"{med / base_w:>16.2f}x {cpu_text.split()[1]:>16}")
    ratio = statistics.median(wall["isolated"]) / base_w
    print(f"\nisolated vs hook_only: {ratio:.2f}x wall, "
          f"{statistics.median(cpu['isolated']) / base_c:.2f}x child CPU "
          f"(+{(statistics.median(wall['isolated']) - base_w) * 1e3:.1f} ms wall per execution)")
    costs = {layer: statistics.median(layer_cost(layer) for _ in range(args.rounds))
             for layer in isolation.LAYERS}
    print("cost of applying each layer (thread CPU, median): "
          + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in costs.items()))
    rows["apply_cpu_ms"] = {k: round(v * 1e3, 3) for k, v in costs.items()}
    out = guard.finish({"rounds": args.rounds, "uptime": uptime, "status": status.summary(), "summary": rows,
                        "wall_s": wall, "cpu_s": cpu},
                       [_guard.figure("isolated vs hook_only, child CPU",
                                      _guard.ratios(cpu["isolated"], cpu["hook_only"])),
                        _guard.figure("isolated vs hook_only, wall",
                                      _guard.ratios(wall["isolated"], wall["hook_only"])),
                        _guard.figure("isolated, wall per execution", _guard.summarize(
                            [1e3 * x for x in wall["isolated"]]), unit="ms")])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
