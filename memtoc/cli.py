"""The ``memtoc`` command: one subcommand per job, each a thin layer over a library function."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

from memtoc.errors import MemtocError


def add_selection_args(p: argparse.ArgumentParser, *, conditions: str = "all") -> None:
    """The model and episode-selection options every job that runs the benchmark shares."""
    p.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M-Instruct GGUF), a .gguf "
                   "file, a local model directory, or a hub id (only then is a hub contacted)")
    p.add_argument("--benchmark", default="demo", help="'demo', a MemToC release or mapping folder, or one file")
    p.add_argument("--formulations", default="reference", help="comma list of reference,paraphrase_a,paraphrase_b, or all")
    p.add_argument("--conditions", default=conditions, help="comma list of tool_right,tool_wrong,tool_error,no_tool,"
                   "no_conflict,tool_wrong_far, or all")
    p.add_argument("--question-set", default="all", help="all | analysis | fold-A | fold-B")
    p.add_argument("--limit", type=int, default=None, help="first N questions of the set")


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    add_selection_args(p)
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per backend call (default 8 on hf, 256 on vllm)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--closed-book", choices=("forced", "permissive"), default="forced",
                   help="closed-book prompt that defines each question's memory (forced = the paper's primary)")
    p.add_argument("--prompt-intervention", choices=("none", "warn", "source-priority", "abstain-and-flag"),
                   default="none")
    p.add_argument("--frame", choices=("auto", "tool", "tool-no-schema", "passage"), default="auto",
                   help="auto = 'tool' when the benchmark carries tool schemas, else 'tool-no-schema'")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals")
    p.add_argument("--edit", default=None, help="edit spec (JSON from memtoc direction / mine-features) applied "
                   "to the tool-conditioned pass")
    p.add_argument("--adapter", default=None, help="LoRA adapter directory (memtoc finetune train/crossfit) "
                   "applied to the whole model (closed-book pass included); its hash joins the run identity")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs to shard the model over")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm: share of GPU memory to use")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: context length to reserve")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from memtoc.evaluate import EvaluationConfig, evaluate

    cfg = EvaluationConfig(model=args.model, benchmark=args.benchmark, out=args.out, formulations=args.formulations,
                           conditions=args.conditions, question_set=args.question_set, limit=args.limit,
                           backend=args.backend, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                           closed_book=args.closed_book, prompt_intervention=args.prompt_intervention,
                           frame=args.frame, device=args.device, dtype=args.dtype, seed=args.seed, edit=args.edit,
                           adapter=args.adapter,
                           progress=not args.no_progress, tensor_parallel_size=args.tensor_parallel_size,
                           gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len)
    result = evaluate(cfg)
    print(result.table_text)
    print(f"\nrun directory: {result.store.root}  ({result.summary['n_episodes']['done']}/"
          f"{result.summary['n_episodes']['planned']} episodes; {result.n_episodes_new} new)")
    return 0


def _read_records(path: str) -> list[dict]:
    from memtoc.runstore import iter_jsonl

    return list(iter_jsonl(path))


def _write_jsonl(path: str, records: Sequence[dict]) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(out)


def cmd_score(args: argparse.Namespace) -> int:
    from memtoc.offline import score_record

    scored = [score_record(r, row=i, path=args.input) for i, r in enumerate(_read_records(args.input), 1)]
    _write_jsonl(args.output, scored)
    counts = Counter(r["outcome"] for r in scored)
    print(f"scored {len(scored)} records -> {args.output}  outcomes: " +
          ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from memtoc.fileio import write_json_atomic
    from memtoc.metrics import metric_table

    if args.run is not None or args.input is None or args.layer != "deterministic":
        from memtoc.judge.cli import cmd_metrics_layer

        return cmd_metrics_layer(args)
    table = metric_table(_read_records(args.input), n_boot=args.n_boot, seed=args.seed)
    print(table.format_text())
    if args.output:
        write_json_atomic(args.output, table.to_dict())
    return 0


def cmd_episodes(args: argparse.Namespace) -> int:
    from memtoc.benchmark import load_benchmark
    from memtoc.episodes import build_episodes, parse_conditions, parse_formulations

    bench = load_benchmark(args.benchmark)
    frame = bench.default_frame if args.frame == "auto" else args.frame
    eps = build_episodes(bench.select(args.question_set, args.limit), formulations=parse_formulations(args.formulation),
                         conditions=parse_conditions(args.conditions), frame=frame,
                         intervention=args.prompt_intervention, closed_book=args.closed_book)
    _write_jsonl(args.output, [e.to_dict() for e in eps])
    counts = Counter((e.formulation, e.arm) for e in eps)
    print(f"{len(eps)} episodes from {len({e.question.id for e in eps})} questions (frame {frame}) -> {args.output}")
    for (f, arm), n in sorted(counts.items()):
        print(f"  {f:13s} {arm:15s} {n}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from memtoc.fileio import write_json_atomic
    from memtoc.metrics import compare_arms
    from memtoc.runstore import RunStore

    if args.layer == "deterministic":
        a, b = RunStore.read(args.run_a).episodes.records(), RunStore.read(args.run_b).episodes.records()
    else:
        from memtoc.judge.cli import compare_layer_records

        a, b = compare_layer_records(args.run_a, args.run_b, args.layer, args.judge_file)
    comp = compare_arms(a, b, seed=args.seed,
                        label_a=Path(args.run_a).name, label_b=Path(args.run_b).name)
    print(comp.format_text())
    if args.output:
        write_json_atomic(args.output, comp.to_dict())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from memtoc.judge.cli import add_layer_args

    parser = argparse.ArgumentParser(prog="memtoc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("evaluate", help="run a model on the benchmark: closed-book pass, tool pass, scores, metrics")
    _add_eval_args(p)
    p.add_argument("--out", required=True, help="run directory (resumed if it exists with the same settings)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score", help="re-score per-episode responses offline with the one scorer")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("metrics", help="metric table (per formulation and pooled, with intervals) of scored records")
    p.add_argument("run", nargs="?", default=None, help="a run directory (instead of --input)")
    p.add_argument("--input", help="scored records (memtoc score output or a run's episodes.jsonl)")
    p.add_argument("--output", help="also write the table as JSON")
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    add_layer_args(p, both=True)
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("episodes", help="export the built episodes with their exact prompt strings")
    p.add_argument("--benchmark", default="demo")
    p.add_argument("--formulation", default="reference", help="a formulation, a comma list, or all")
    p.add_argument("--conditions", default="all")
    p.add_argument("--question-set", default="all")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--frame", choices=("auto", "tool", "tool-no-schema", "passage"), default="auto")
    p.add_argument("--prompt-intervention", choices=("none", "warn", "source-priority", "abstain-and-flag"),
                   default="none")
    p.add_argument("--closed-book", choices=("forced", "permissive"), default="forced")
    p.add_argument("--output", required=True)
    p.set_defaults(func=cmd_episodes)

    p = sub.add_parser("compare", help="paired comparison of two runs on common support, with the criterion")
    p.add_argument("run_a", help="baseline run directory")
    p.add_argument("run_b", help="treated run directory")
    p.add_argument("--output", help="also write the comparison as JSON")
    p.add_argument("--seed", type=int, default=0)
    add_layer_args(p)
    p.set_defaults(func=cmd_compare)
    from activations.cli import add_extract_parser
    add_extract_parser(sub)
    from probes.cli import add_probe_parsers
    add_probe_parsers(sub)
    from steering.mining_cli import add_mining_parsers
    add_mining_parsers(sub)
    from steering.cli import add_steering_parsers
    add_steering_parsers(sub)
    from memtoc.finetune.cli import add_finetune_parsers
    add_finetune_parsers(sub)
    # experiments, reports, shards: merge / merge-activations / report / run-experiment
    from memtoc.merge import add_merge_parsers
    add_merge_parsers(sub)
    from memtoc.report import add_report_parser
    add_report_parser(sub)
    from memtoc.experiment import add_experiment_parser
    add_experiment_parser(sub)
    from memtoc.codeexec.cli import add_codeexec_parsers
    add_codeexec_parsers(sub)
    from memtoc.judge.cli import add_judge_parsers
    add_judge_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MemtocError as exc:
        print(f"memtoc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memtoc {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
