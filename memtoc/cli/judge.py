"""``memtoc judge`` and ``memtoc ack {car,export,import}``, plus the layer helpers ``metrics``/``compare`` call."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memtoc.scoring.judge.layer import LAYERS, LayerRecords, layer_records, run_dir_of, same_judge
from memtoc.scoring.judge.store import JUDGE_FILE


def load_layer(path: str, layer: str, judge_file: str = JUDGE_FILE) -> LayerRecords:
    """Records of a run directory (or a records file inside one) in a layer."""
    from memtoc.runs.runstore import RunStore, iter_jsonl

    p = Path(path)
    records = RunStore.read(p).episodes.records() if p.is_dir() else list(iter_jsonl(p))
    return layer_records(records, layer, run_dir=run_dir_of(p), judge_file=judge_file)


def cmd_metrics_layer(args: argparse.Namespace) -> int:
    """``memtoc metrics`` for a layer (or both side by side)."""
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.judge.ack import car_table, format_car_table
    from memtoc.scoring.metrics import metric_table

    src = args.run or args.input
    if src is None:
        from memtoc.core.errors import MemtocError

        raise MemtocError("give a run directory or --input records")
    layers = LAYERS if args.layer == "both" else (args.layer,)
    tables, out = {}, {}
    for layer in layers:
        lr = load_layer(src, layer, args.judge_file)
        tables[layer] = metric_table(lr.records, n_boot=args.n_boot, seed=args.seed)
        out[layer] = {"metrics": tables[layer].to_dict()}
        if layer == "judged":
            out[layer].update(judge=lr.judge, changes=lr.changes.to_dict())
            if args.layer == "judged":
                print(tables[layer].format_text())
            j = lr.judge or {}
            print(f"\njudge: {j.get('model')} (prompts {j.get('prompt_version')}); "
                  f"changes: {json.dumps(lr.changes.to_dict())}")
            rows = car_table([(Path(run_dir_of(src)).name, lr.records)])
            out[layer]["car"] = rows
            print(format_car_table(rows))
        elif args.layer == "deterministic":
            print(tables[layer].format_text())
    if args.layer == "both":
        from memtoc.scoring.judge.sidebyside import side_by_side_text

        print()
        print(side_by_side_text(tables["deterministic"], tables["judged"]))
    if args.output:
        write_json_atomic(args.output, out if args.layer == "both" else out[args.layer]["metrics"]
                          if args.layer == "deterministic" else out["judged"])
    return 0


def compare_layer_records(run_a: str, run_b: str, layer: str, judge_file: str = JUDGE_FILE
                          ) -> tuple[list[dict], list[dict]]:
    """Both arms in a layer; judged arms must share one judge."""
    a, b = load_layer(run_a, layer, judge_file), load_layer(run_b, layer, judge_file)
    if layer == "judged":
        same_judge(a, b, run_a, run_b)
    return a.records, b.records


def cmd_judge(args: argparse.Namespace) -> int:
    from memtoc.jobs.judge import JudgeConfig, run_judge
    from memtoc.scoring.judge.store import read_judge_records

    cfg = JudgeConfig(run_dir=args.run_dir, judge_model=args.judge_model, backend=args.backend, device=args.device,
                      dtype=args.dtype, batch_size=args.batch_size, prompts=args.prompts, output=args.output,
                      progress=not args.no_progress, tensor_parallel_size=args.tensor_parallel_size,
                      gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len)
    res = run_judge(cfg)
    recs = read_judge_records(res.path)
    status: dict[str, int] = {}
    for r in recs.values():
        v = r["verdict"]
        s = f"{r['kind']}:{v['status'] if 'status' in v else {True: 'yes', False: 'no', None: 'none'}[v['ack']]}"
        status[s] = status.get(s, 0) + 1
    print(f"{res.path}: {res.n_requests} requests ({', '.join(f'{k} {v}' for k, v in res.counts.items())}); "
          f"{res.n_new} judged now")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(status.items())))
    return 0


def cmd_ack_car(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.judge.ack import car_table, format_car_table

    arms = [load_layer(r, "judged", args.judge_file) for r in args.runs]
    for r, lr in zip(args.runs[1:], arms[1:]):
        same_judge(arms[0], lr, args.runs[0], r)
    rows = car_table([(Path(r).name, lr.records) for r, lr in zip(args.runs, arms)])
    print(format_car_table(rows))
    if args.output:
        write_json_atomic(args.output, rows)
    return 0


def cmd_ack_export(args: argparse.Namespace) -> int:
    from memtoc.scoring.judge.ack import export_sheet

    layer = "judged" if args.detector == "llm" else args.layer
    arms = [(Path(r).name, r, load_layer(r, layer, args.judge_file).records) for r in args.runs]
    key = args.key or str(Path(args.sheet).with_suffix(".key.json"))
    info = export_sheet(arms, sheet=args.sheet, key=key, per_stratum=args.per_stratum, detector=args.detector,
                        seed=args.seed)
    print(f"{info['n_items']} items -> {args.sheet} (blinded; fill the 'ack' column with yes/no); key -> {key}")
    for arm, c in info["screen"].items():
        print(f"  {arm}: {c['k']} of {c['n']} flagged by the {args.detector} detector")
    return 0


def cmd_ack_import(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.judge.ack import import_labels

    res = import_labels(args.key, args.labels, seed=args.seed)
    print(json.dumps(res, indent=1))
    if args.output:
        write_json_atomic(args.output, res)
    return 0


def add_layer_args(p: argparse.ArgumentParser, *, both: bool = False) -> None:
    p.add_argument("--layer", choices=(*LAYERS, "both") if both else LAYERS, default="deterministic",
                   help="deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run)"
                   + ("; both = side by side with the difference" if both else ""))
    p.add_argument("--judge-file", default=JUDGE_FILE, help="judge records file inside the run directory")


def add_judge_parsers(sub: Any) -> None:
    p = sub.add_parser("judge", help="run the release's judge requests (extract / ack) of a finished run")
    p.add_argument("run_dir")
    p.add_argument("--judge-model", default="default", help="as --model of evaluate ('default' = embedded SmolLM2)")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--prompts", default=None, help="judge prompt file (default: memtoc/data/judge_prompts.json)")
    p.add_argument("--output", default=JUDGE_FILE, help="file name in the run directory (a second judge: its own "
                   "file)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None)
    p.set_defaults(func=cmd_judge)

    ack = sub.add_parser("ack", help="conflict acknowledgment: CAR table, annotation export / import")
    asub = ack.add_subparsers(dest="ack_command", required=True)
    p = asub.add_parser("car", help="CAR by arm and cell (judge, regex, proxy)")
    p.add_argument("runs", nargs="+")
    p.add_argument("--judge-file", default=JUDGE_FILE)
    p.add_argument("--output")
    p.set_defaults(func=cmd_ack_car)
    p = asub.add_parser("export", help="blinded, flag-stratified annotation sheet (CSV) plus its key")
    p.add_argument("runs", nargs="+")
    p.add_argument("--sheet", required=True)
    p.add_argument("--key", default=None, help="default: SHEET with .key.json")
    p.add_argument("--per-stratum", type=int, default=20, help="answers per arm x detector-flag stratum")
    p.add_argument("--detector", choices=("llm", "regex"), default="llm", help="the screening detector")
    p.add_argument("--layer", choices=LAYERS, default="judged", help="cells from this layer (llm: judged)")
    p.add_argument("--judge-file", default=JUDGE_FILE)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_ack_export)
    p = asub.add_parser("import", help="labels back: kappa, detector precision/recall, two-stage prevalence")
    p.add_argument("key")
    p.add_argument("--labels", action="append", required=True, help="an annotated sheet; twice for two annotators")
    p.add_argument("--output")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_ack_import)


