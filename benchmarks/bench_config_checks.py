"""Config-only checks before the weights load: for every command that loads a model, one error that the
model's configuration alone can refute (a site or block range outside the model, a bad bound), timed as a user
meets it: a fresh ``memtoc`` process on the default model, exit 2, and no weight-loading bar on stderr.

    .venv/bin/python benchmarks/bench_config_checks.py --rounds 3 --out bench_out/config_checks.json

Goal: under 5 s per command on the default model (process start and imports included). ``--run``: an evaluate run
of the default model that ``patch``, ``rank-table`` and ``judge`` read (made with ``--limit 1`` when missing).
The case table (:func:`walk_cases`) is also what ``tests/memtoc/cli/test_config_walk.py`` walks in-process, with the
loader replaced by a failure (no clock there); a case with a ``gap`` is a known check that still loads first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard

REPO = Path(__file__).resolve().parents[1]
#: stderr text of the weight loaders (transformers' GGUF conversion and its weight bar)
LOAD_MARKS = ("Converting and de-quantizing GGUF tensors", "Loading weights", "Loading checkpoint shards")


@dataclass(frozen=True)
class Case:
    """One command's config-only error: its argv (after ``memtoc``), a text the one-line error must hold, and the
    reason it is a known gap (still loads first) or None."""

    command: str
    argv: tuple[str, ...]
    needle: str
    gap: str | None = None


def write_site_edit(path: Path, site: int, width: int) -> Path:
    """A valid direction edit at ``site`` (outside the model when ``site`` > its blocks)."""
    import torch

    from steering.kinds.direction import DirectionEdit, save_direction_edit

    unit = torch.ones(width) / width ** 0.5
    edit = DirectionEdit.build(name="site-check", layers=[site], vectors={site: unit}, scale={site: 1.0},
                               toward="memory")
    return save_direction_edit(path, edit)


def walk_cases(tmp: Path, run: Path, edit: Path, model: str = "default") -> list[Case]:
    """Every model-loading command with one config-only error on ``model``; ``edit``: an edit at site 99."""
    t, r, e = str(tmp), str(run), str(edit)
    return [
        Case("evaluate", ("evaluate", "--model", model, "--benchmark", "demo", "--edit", e, "--out", f"{t}/ev"),
             "site(s) [99] do not exist"),
        Case("sweep", ("sweep", "--model", model, "--edit", e, "--strengths", "0,1", "--out", f"{t}/sw"),
             "site(s) [99] do not exist"),
        Case("codeexec evaluate", ("codeexec", "evaluate", "--model", model, "--edit", e, "--out", f"{t}/cx"),
             "site(s) [99] do not exist"),
        Case("codeexec sweep", ("codeexec", "sweep", "--model", model, "--edit", e, "--strengths=0,1",
                                "--out", f"{t}/cxs"), "site(s) [99] do not exist"),
        Case("patch", ("patch", "--model", model, "--run", r, "--layers", "99", "--out", f"{t}/pa"), "'99'"),
        Case("extract", ("extract", "--model", model, "--benchmark", "demo", "--layers", "99",
                         "--out", f"{t}/x.h5"), "99"),
        Case("codeexec extract", ("codeexec", "extract", "--model", model, "--layers", "99", "--out", f"{t}/cx.h5"),
             "99"),
        Case("lens fit", ("lens", "fit", "--model", model, "--layers", "99", "--out", f"{t}/l.safetensors"), "99"),
        Case("rank-table", ("rank-table", "--model", model, "--run", r, "--layers", "99", "--out", f"{t}/rt"), "99"),
        Case("serve", ("serve", "--model", model, "--port", "70000"), "--port"),
        Case("judge", ("judge", r, "--judge-model", model, "--batch-size", "0"), "--batch-size 0"),
        Case("agent evaluate", ("agent", "evaluate", "--model", model, "--temperature", "-1", "--out", f"{t}/ag"),
             "--temperature"),
        Case("finetune data", ("finetune", "data", "--model", model, "--limit", "0", "--out", f"{t}/fd"),
             "--limit 0"),
        Case("finetune train", ("finetune", "train", "--model", model, "--objective", "sft", "--r", "0",
                                "--out", f"{t}/ft"), "--r 0"),
        Case("finetune crossfit", ("finetune", "crossfit", "--model", model, "--r", "0", "--out", f"{t}/fc"),
             "--r 0"),
        Case("run-experiment", ("run-experiment", str(REPO / "experiments" / "probe_and_steer.toml"), "--quick",
                                "--model", model, "--set", "nonsense=1", "--out", f"{t}/re"), "'nonsense'"),
    ]


def _run_once(case: Case, env: dict[str, str], memtoc: list[str]) -> tuple[float, int, str]:
    import time

    t0 = time.perf_counter()
    p = subprocess.run([*memtoc, *case.argv], capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    return time.perf_counter() - t0, p.returncode, p.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--run", default=None, help="an evaluate run of the model (default: made with --limit 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma list of commands")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from memtoc.backends.preflight import model_shape

    tmp = Path(tempfile.mkdtemp(prefix="bench-config-"))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
    script = Path(sys.executable).parent / "memtoc"          # the console script a user runs
    memtoc = [str(script)] if script.exists() else [sys.executable, "-m", "memtoc.cli"]
    run = Path(args.run) if args.run else tmp / "run"
    if not run.exists():
        subprocess.run([*memtoc, "evaluate", "--model", args.model, "--benchmark", "demo", "--limit", "1",
                        "--conditions", "tool_right,tool_wrong", "--max-new-tokens", "8", "--no-progress",
                        "--out", str(run)], check=True, env=env, cwd=REPO, capture_output=True)
    shape = model_shape(args.model)
    edit = write_site_edit(tmp / "site99.json", 99, shape.d_model if shape else 576)
    cases = [c for c in walk_cases(tmp / "out", run, edit, args.model)
             if not args.only or c.command in args.only.split(",")]
    guard = _guard.Guard("bench_config_checks").__enter__()
    times: dict[str, list[float]] = {c.command: [] for c in cases}
    seen: dict[str, dict] = {}
    for r in range(_guard.check_rounds(args.rounds)):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for c in order:
            dt, rc, err = _run_once(c, env, memtoc)
            times[c.command].append(dt)
            lines = err.strip().splitlines()
            seen[c.command] = {"rc": rc, "loaded": any(m in err for m in LOAD_MARKS), "gap": c.gap,
                               "error": lines[-1] if lines else ""}
            shutil.rmtree(tmp / "out", ignore_errors=True)
    guard.__exit__(None, None, None)
    per = {k: {**_guard.summarize(v), **seen[k]} for k, v in times.items()}
    ok = [k for k, v in per.items() if v["rc"] == 2 and not v["loaded"]]
    res = {"model": args.model, "commands": per, "before_load": ok,
           "still_loading": [k for k in per if k not in ok], "goal_s": 5.0,
           "over_goal": [k for k in ok if per[k]["median"] >= 5.0]}
    figs = [_guard.figure(f"{k}: config-only error, exit 2 (fresh process)", per[k], unit="s", goal="< 5 s")
            for k in ok]
    guard.finish(res, figs)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1), encoding="utf-8")
    worst = max((per[k]["median"] for k in ok), default=float("nan"))
    print(f"HEADLINE ({res['load']['status']}): {len(ok)}/{len(per)} commands refuse before the weights load, "
          f"slowest median {worst:.2f} s; still loading first: {', '.join(res['still_loading']) or 'none'}")


if __name__ == "__main__":
    main()
