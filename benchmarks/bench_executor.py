"""The same 4-strength sweep through ``--executor local`` (one process) and ``--executor ray`` (2 workers), plus
the executor's own per-task overhead.

    .venv/bin/python benchmarks/bench_executor.py --model default --limit 4 --max-new-tokens 24

- ``local``: ``memtoc sweep --strengths 2,4,8`` (with the baseline 0: four strengths), in this process, one model
  load, the closed book once and the strengths as rows: what a user gets without Ray;
- ``ray``: the same command with ``--executor ray --cpus-per-arm 1`` on a local Ray instance with 2 CPUs: the
  command starts 2 actors (each loads the model once), runs the closed book, then 2 groups of strengths as rows,
  one per actor, then assembles the table without loading the model itself;
- ``ray_kept``: the same sweep through one Ray executor kept open across the rounds (the actors and their models
  stay: what a study of many sweeps on one executor, or a long-lived cluster, pays per sweep);
- the sweeps' records are compared (they must be identical: same greedy decoding on the same CPU);
- overhead: ``--n-noop`` tasks that do nothing, through each executor, per task (submit + schedule + return).

The headline is the speed of Ray against local (``local s / ray s``; goal >= 0.9 with 2 workers on 2 cores).

The two sweeps run in ``--rounds`` interleaved rounds (``benchmarks/_guard.py``: load before/after, median and
spread, "loaded" when the load exceeds the CPUs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def noop() -> int:
    return 0


def _unit(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def _records(sweep_dir: Path) -> dict[str, list[dict]]:
    out = {}
    for run in sorted(sweep_dir.glob("strength_*")):
        recs = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines() if x.strip()]
        out[run.name] = sorted(({k: r[k] for k in ("episode_id", "response", "outcome")} for r in recs),
                               key=lambda r: r["episode_id"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--d-model", type=int, default=576, help="residual width of --model (576: SmolLM2-135M)")
    ap.add_argument("--site", type=int, default=15)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--conditions", default="tool_wrong,no_conflict")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--n-noop", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the two sweeps (order rotated)")
    ap.add_argument("--work-dir", default=None, help="keep the sweeps here (default: a temporary folder)")
    ap.add_argument("--out", "--output", dest="output", default=None, help="write the result JSON here")
    args = ap.parse_args()

    import ray

    try:
        from benchmarks import _guard
    except ImportError:          # run as a script: benchmarks/ is on sys.path
        import _guard
    from memtoc.cli import main as memtoc
    from memtoc.cli.parse import parse_config
    from memtoc.jobs.executor import RayExecutor, Resources, WorkUnit, init_ray, run_tasks
    from memtoc.jobs.sweep import run_sweep, sweep_waves
    from steering import DirectionEdit
    from steering.kinds.direction import save_direction_edit

    guard = _guard.Guard("bench_executor").__enter__()
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_executor_"))
    root.mkdir(parents=True, exist_ok=True)
    edit = DirectionEdit.build(name="bench", layers=[args.site], vectors={args.site: _unit(args.d_model, 0)},
                               scale={args.site: 4.0}, positions="from_tool_return", strength=1.0, toward="tool")
    spec = save_direction_edit(root / "edit.json", edit)
    common = ["sweep", "--model", args.model, "--edit", str(spec), "--strengths", "2,4,8", "--benchmark", "demo",
              "--formulations", "reference", "--conditions", args.conditions, "--limit", str(args.limit),
              "--max-new-tokens", str(args.max_new_tokens), "--n-boot", "200", "--no-progress", "--no-plot"]
    result: dict = {"workers": args.workers, "rounds": args.rounds}

    t0 = time.perf_counter()
    init_ray(ray, num_cpus=args.workers, log_to_driver=False)
    result["ray_init_s"] = round(time.perf_counter() - t0, 1)

    def sweep(kind: str) -> None:
        shutil.rmtree(root / kind, ignore_errors=True)
        extra = ["--executor", "ray", "--cpus-per-arm", "1"] if kind == "ray" else []
        assert memtoc([*common, "--out", str(root / kind), *extra]) == 0

    # phase 1: local against Ray started per command (its actors hold the CPUs only while the command runs)
    times, _ = _guard.interleave({"local": lambda: sweep("local"), "ray": lambda: sweep("ray")}, args.rounds)
    # phase 2: local against one executor kept open (its actors hold both CPUs' reservations throughout)
    kept = RayExecutor(Resources(cpus=1))

    def sweep_kept() -> None:
        shutil.rmtree(root / "ray_kept", ignore_errors=True)
        cfg = parse_config([*common, "--out", str(root / "ray_kept")])[1]
        for wave in sweep_waves(cfg, kept.slots):
            assert run_tasks(wave, kept, log=lambda s: None).ok
        run_sweep(cfg, log=lambda s: None)

    sweep_kept()                 # the kept actors start and load the model once, before the timed rounds
    times2, _ = _guard.interleave({"local": lambda: sweep("local"), "ray_kept": sweep_kept}, args.rounds)
    kept.close()
    times["local_phase2"], times["ray_kept"] = times2["local"], times2["ray_kept"]
    for k in times:
        result[f"{k}_s"] = _guard.summarize(times[k])
    ratio = _guard.ratios(times["local"], times["ray"])
    ratio_kept = _guard.ratios(times2["local"], times2["ray_kept"])
    result["ratio_local_over_ray"], result["ratio_local_over_ray_kept"] = ratio, ratio_kept
    a, b, c = _records(root / "local"), _records(root / "ray"), _records(root / "ray_kept")
    result["identical_records"] = a == b == c
    result["n_records"] = sum(len(v) for v in a.values())

    # per-task overhead: no-op tasks (the actors are already up: this is scheduling, not process start-up)
    tasks = [WorkUnit(f"noop{i}", f"noop{i}", noop) for i in range(args.n_noop)]
    ex = RayExecutor(Resources(cpus=1))
    ex.run(tasks[:2], log=lambda s: None)      # the actors start here, outside the timing
    t0 = time.perf_counter()
    ex.run(tasks, log=lambda s: None)
    result["ray_noop_batch_ms_per_task"] = round(1000 * (time.perf_counter() - t0) / args.n_noop, 1)
    one = []
    for t in tasks[:10]:
        t0 = time.perf_counter()
        ex.run([t], log=lambda s: None)
        one.append(time.perf_counter() - t0)
    result["ray_noop_roundtrip_ms_median"] = round(1000 * statistics.median(one), 1)
    t0 = time.perf_counter()
    run_tasks(tasks, "local", log=lambda s: None)
    result["local_noop_ms_per_task"] = round(1000 * (time.perf_counter() - t0) / args.n_noop, 3)
    ex.close()
    ray.shutdown()
    guard.finish(result, [_guard.figure("sweep speed, Ray with 2 workers vs local (local s / Ray s)", ratio,
                                        goal="≥ 0.9"),
                          _guard.figure("sweep speed, Ray kept across sweeps vs local (local s / Ray s)", ratio_kept,
                                        goal="≥ 0.9"),
                          _guard.figure("Ray no-op task round trip", _guard.summarize([1000 * m for m in one]),
                                        unit=" ms")])
    print(json.dumps(result, indent=1))
    load = result["load"]
    print(f"HEADLINE sweep speed Ray / local ({load['status']}, load {load['before']['load_1m']} -> "
          f"{load['after']['load_1m']} on {load['before']['cpus']} CPUs): per command {ratio['median']:.3f}x, "
          f"actors kept {ratio_kept['median']:.3f}x; identical records: {result['identical_records']}")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
