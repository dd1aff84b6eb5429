"""A 4-strength sweep against one untreated evaluation of the same prompts, in one run.

    .venv/bin/python benchmarks/bench_sweep.py --model default --limit 4 --max-new-tokens 24 --rounds 3

Three paths over the same episodes, one model load, interleaved ``--rounds`` times (order rotated), each into a
fresh directory:

- ``untreated``: one evaluation without an edit (its closed-book pass, then the tool pass);
- ``sweep``: ``run_sweep`` over strengths 0 and ``--strengths`` (four in all by default): the untreated closed
  book once, then the tool pass of all strengths as rows of the same batches
  (``memtoc.tasks.memtoc.task.evaluate_strengths``);
- ``separate``: one full evaluation per strength, each with its own closed-book pass and its own
  tool pass (``--no-separate`` skips it).

The headline is ``sweep / untreated`` (goal <= 2x), with ``separate / untreated`` beside it; the sweep's records
are checked against the separate evaluations' (they must be equal). The edit is a direction edit with a random unit
vector at ``--site`` from the tool return on (every tool-output token and every generated token).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def _unit(d: int, seed: int) -> torch.Tensor:
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def _episodes(run: Path) -> list[dict]:
    from memtoc.runs.runstore import iter_jsonl

    recs = iter_jsonl(run / "episodes.jsonl")
    keep = ("episode_id", "response", "outcome")
    return sorted(({k: r[k] for k in keep} for r in recs), key=lambda r: r["episode_id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--site", type=int, default=15)
    ap.add_argument("--edit-positions", "--positions", dest="positions", default="from_tool_return",
                    choices=("last_input", "tool_span", "from_tool_return"))
    ap.add_argument("--strengths", default="2,4,8", help="besides 0")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--conditions", default="tool_wrong,tool_right")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-separate", action="store_true", help="skip the one-evaluation-per-strength path")
    ap.add_argument("--out", "--output", dest="output", default=None, help="write the result JSON here")
    args = ap.parse_args()

    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec
    from memtoc.core.values import build_config
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig
    from steering import DirectionEdit
    from memtoc.jobs.sweep import run_sweep
    from memtoc.tasks.memtoc.sweep import SweepConfig
    from memtoc.tasks.sweep_format import parse_strengths

    backend = load_backend(ModelSpec(model=args.model, backend="hf", device=args.device, dtype=args.dtype))
    d = backend.parts.d_model
    edit = DirectionEdit.build(name="bench-sweep", layers=[args.site], vectors={args.site: _unit(d, 0)},
                               scale={args.site: 4.0}, positions=args.positions, strength=1.0, toward="memory")
    strengths = [0.0] + [s for s in parse_strengths(args.strengths) if s != 0]
    common = dict(model=args.model, device=args.device, dtype=args.dtype, benchmark="demo", formulations="reference",
                  conditions=args.conditions, limit=args.limit, batch_size=args.batch_size,
                  max_new_tokens=args.max_new_tokens, progress=False)
    root = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    quiet = lambda s: None  # noqa: E731

    def fresh(name: str) -> Path:
        p = root / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    def untreated() -> None:
        evaluate(build_config(EvaluationConfig, {**common, "out": str(fresh("untreated"))}), backend=backend,
                 log=quiet)

    def sweep() -> None:
        cfg = build_config(SweepConfig, {**common, "out": str(fresh("sweep")), "direction": "memory", "n_boot": 50,
                                         "strengths": ",".join(f"{s:g}" for s in strengths), "plot": False})
        run_sweep(cfg, backend=backend, edit=edit, log=quiet)

    def separate() -> None:
        base = fresh("separate")
        for s in strengths:
            evaluate(build_config(EvaluationConfig, {**common, "out": str(base / f"strength_{s:g}")}), backend=backend,
                     edit=edit.steer("memory", s), log=quiet)

    variants = {"untreated": untreated, "sweep": sweep}
    if not args.no_separate:
        variants["separate"] = separate
    untreated()                  # warm-up (and the demo data's caches)
    guard = _guard.Guard("bench_sweep").__enter__()
    times, _ = _guard.interleave(variants, args.rounds)
    guard.__exit__(None, None, None)
    res: dict = {"model": args.model, "device": args.device, "strengths": strengths, "positions": args.positions,
                 "limit": args.limit, "conditions": args.conditions, "batch_size": args.batch_size,
                 "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                 "n_episodes": len(_episodes(root / "untreated")),
                 "wall_s": {k: _guard.summarize(v) for k, v in times.items()},
                 "ratio_sweep_over_untreated": _guard.ratios(times["sweep"], times["untreated"])}
    figs = [_guard.figure(f"{len(strengths)}-strength sweep / one untreated evaluation",
                          res["ratio_sweep_over_untreated"], goal="≤ 2")]
    if "separate" in times:
        res["ratio_separate_over_untreated"] = _guard.ratios(times["separate"], times["untreated"])
        figs.append(_guard.figure(f"{len(strengths)} separate evaluations (before) / one untreated evaluation",
                                  res["ratio_separate_over_untreated"]))
        res["sweep_records_equal_separate"] = all(
            _episodes(root / "sweep" / f"strength_{s:g}") == _episodes(root / "separate" / f"strength_{s:g}")
            for s in strengths)
    res["strength_0_equals_untreated"] = _episodes(root / "sweep" / "strength_0") == _episodes(root / "untreated")
    guard.finish(res, figs)
    print(json.dumps(res, indent=1))
    load = res["load"]
    line = (f"HEADLINE sweep / untreated ({load['status']}, load {load['before']['load_1m']} -> "
            f"{load['after']['load_1m']} on {load['before']['cpus']} CPUs): "
            f"{res['ratio_sweep_over_untreated']['median']:.3f}x")
    if "separate" in times:
        line += f" (before: {res['ratio_separate_over_untreated']['median']:.3f}x)"
    print(line)
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
