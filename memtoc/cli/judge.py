"""``memtoc judge`` and ``memtoc ack {car,export,import}``, plus the layer options ``sweep`` takes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memtoc.scoring.judge.layer import LAYERS, load_layer, same_judge
from memtoc.scoring.judge.store import JUDGE_FILE


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
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from memtoc.scoring.judge.ack import car_table, check_distinct_runs, format_car_table

    check_outputs({"--out": args.output}, args.runs)
    check_distinct_runs(args.runs)
    arms = [load_layer(r, "judged", args.judge_file, args.allow_partial) for r in args.runs]
    for r, lr in zip(args.runs[1:], arms[1:]):
        same_judge(arms[0], lr, args.runs[0], r)
    rows = car_table([(Path(r).name, lr.records) for r, lr in zip(args.runs, arms)])
    print(format_car_table(rows))
    if args.output:
        write_json_atomic(args.output, rows)
    return 0


def cmd_ack_export(args: argparse.Namespace) -> int:
    from memtoc.jobs.ack import run_ack_export

    info = run_ack_export(args.runs, args.sheet, key=args.key, per_stratum=args.per_stratum, detector=args.detector,
                          layer=args.layer, judge_file=args.judge_file, allow_partial=args.allow_partial,
                          seed=args.seed)
    print(f"{info['n_items']} items -> {args.sheet} (blinded; fill the 'ack' column with yes/no); key -> {info['key']}")
    for arm, c in info["screen"].items():
        print(f"  {arm}: {c['k']} of {c['n']} flagged by the {args.detector} detector")
    return 0


def cmd_ack_import(args: argparse.Namespace) -> int:
    from memtoc.jobs.ack import run_ack_import

    print(json.dumps(run_ack_import(args.key, args.labels, output=args.output, seed=args.seed), indent=1))
    return 0


def cmd_outcome_export(args: argparse.Namespace) -> int:
    from memtoc.scoring.judge.outcomes import export_outcome_sheet

    arms = [(Path(r).name, r, load_layer(r, args.layer, args.judge_file).records) for r in args.runs]
    key = args.key or str(Path(args.sheet).with_suffix(".key.json"))
    info = export_outcome_sheet(arms, sheet=args.sheet, key=key, per_stratum=args.per_stratum, seed=args.seed)
    print(f"{info['n_items']} items -> {args.sheet} (blinded; fill the 'outcome' column with followed_tool, "
          f"kept_memory, both, abstain or other); key -> {key}")
    print("scorer classes in the population: " + ", ".join(f"{k} {v}" for k, v in info["population"].items()))
    return 0


def cmd_outcome_import(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.judge.outcomes import import_outcome_labels

    res = import_outcome_labels(args.key, args.labels)
    print(json.dumps(res, indent=1))
    if args.output:
        write_json_atomic(args.output, res)
    return 0


def add_layer_args(p: argparse.ArgumentParser, *, both: bool = False, partial: bool = False) -> None:
    p.add_argument("--score-layer", dest="layer",
                   choices=(*LAYERS, "both") if both else LAYERS, default="deterministic",
                   help="deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run)"
                   + ("; both = side by side with the difference" if both else ""))
    p.add_argument("--judge-file", default=JUDGE_FILE, help="judge records file inside the run directory")
    if partial:
        _add_allow_partial(p)


def _add_allow_partial(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-partial", action="store_true", help="use a judge pass that does not cover every "
                   "request (the output is marked partial; unjudged episodes keep the scorer's labels)")


def add_judge_parsers(sub: Any) -> None:
    p = sub.add_parser("judge", help="run the release's judge requests (extract / ack) of a finished run")
    p.add_argument("run_dir", help="a finished run directory (memtoc evaluate --out)")
    p.add_argument("--judge-model", default="default",
                   help="as --model of evaluate ('default' = embedded SmolLM2); 'paper' = "
                   "Qwen/Qwen2.5-7B-Instruct (App. B); 'auto' = the paper's judge on a GPU, 'default' on CPU "
                   "(said loudly); 'run' = the run's own model (smoke tests)")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf", help="runtime of the judge model")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto",
                   help="auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16")
    p.add_argument("--batch-size", type=int, default=None, help="judge prompts per call (default: the backend's)")
    p.add_argument("--prompts", default=None, help="judge prompt file (default: memtoc/data/judge_prompts.json)")
    p.add_argument("--out", dest="output", default=JUDGE_FILE,
                   help="file name in the run directory (a second judge: its own "
                   "file)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs to shard the judge over")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm: fraction of GPU memory to use")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: context length (default: the model's)")
    p.set_defaults(func=cmd_judge)

    ack = sub.add_parser("ack", help="conflict acknowledgment: CAR table, annotation export / import")
    asub = ack.add_subparsers(dest="ack_command", required=True)
    p = asub.add_parser("car", help="CAR by arm and cell (judge, regex, proxy)")
    p.add_argument("runs", nargs="+", help="run directories (each an arm)")
    p.add_argument("--judge-file", default=JUDGE_FILE, help="judge records file inside each run directory")
    _add_allow_partial(p)
    p.add_argument("--out", dest="output", help="also write the CAR table as JSON")
    p.set_defaults(func=cmd_ack_car)
    p = asub.add_parser("export", help="blinded, flag-stratified annotation sheet (CSV) plus its key")
    p.add_argument("runs", nargs="+",
                   help="run directories (each an arm); with --detector llm each needs memtoc judge first")
    p.add_argument("--sheet", required=True, help="annotation sheet to write (CSV, blinded); its key goes beside it")
    p.add_argument("--key", default=None, help="default: SHEET with .key.json")
    p.add_argument("--per-stratum", type=int, default=20, help="answers per arm x detector-flag stratum")
    p.add_argument("--detector", choices=("llm", "regex"), default="llm", help="the screening detector")
    p.add_argument("--score-layer", dest="layer", choices=LAYERS, default="judged",
                   help="cells from this layer (llm: judged)")
    p.add_argument("--judge-file", default=JUDGE_FILE, help="judge records file inside each run directory")
    _add_allow_partial(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the shuffled order")
    p.set_defaults(func=cmd_ack_export)
    p = asub.add_parser("import", help="labels back: kappa, detector precision/recall, two-stage prevalence")
    p.add_argument("key", help="the key file ack export wrote (ack.key.json)")
    p.add_argument("--labels", action="append", required=True, help="an annotated sheet; twice for two annotators")
    p.add_argument("--out", dest="output", help="also write the result as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the prevalence intervals")
    p.set_defaults(func=cmd_ack_import)

    oc = sub.add_parser("outcome-round", help="scorer vs human outcome validation: blinded sheet export, labels "
                        "back with kappa and per-class recall (the paper's 167-response round)")
    osub = oc.add_subparsers(dest="outcome_command", required=True)
    p = osub.add_parser("export", help="blinded sheet stratified by the scorer's class, plus its key")
    p.add_argument("runs", nargs="+", help="run directories whose scored answers are sampled")
    p.add_argument("--sheet", required=True, help="the blinded annotation sheet to write (CSV)")
    p.add_argument("--key", default=None, help="default: SHEET with .key.json")
    p.add_argument("--per-stratum", type=int, default=35, help="answers per scorer class (5 classes; the paper "
                   "labelled 167 responses)")
    p.add_argument("--score-layer", dest="layer", choices=LAYERS, default="deterministic",
                   help="the scorer layer validated")
    p.add_argument("--judge-file", default=JUDGE_FILE, help="judge records file inside each run directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the shuffled order")
    p.set_defaults(func=cmd_outcome_export)
    p = osub.add_parser("import", help="labels back: scorer-vs-human kappa, per-class recall, confusion table")
    p.add_argument("key", help="the key file written by outcome-round export")
    p.add_argument("--labels", action="append", required=True, help="an annotated sheet; twice for two annotators")
    p.add_argument("--out", dest="output", help="also write the agreement (kappa, per-class recall) as JSON")
    p.set_defaults(func=cmd_outcome_import)


