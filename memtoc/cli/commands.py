"""The job commands of ``memtoc``: one subcommand per job, each a thin layer over a library function.

``memtoc.cli`` adds ``run-experiment`` on top; recipes run these commands through :func:`run_command`, so the
recipe runner sits above the job commands instead of importing the command line that registers it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from memtoc.core.checks import check_n_boot
from memtoc.core.errors import MemtocError, naming
from memtoc.core.fileio import check_outputs


#: Options a protocol fills when the user does not give them: their parser default is "not given" (SUPPRESS),
#: so a command can tell an explicit ``--formulations reference`` from the default (memtoc.bench.protocol).
PROTOCOL_FILLED = ("question_set", "formulations", "max_new_tokens", "stop_at_final_line")


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    from memtoc.tasks.memtoc.evaluate import EvaluationConfig
    from memtoc.core.options import add_options

    add_options(p, EvaluationConfig, only=(
        "model", "benchmark", "formulations", "conditions", "question_set", "limit", "backend", "batch_size",
        "max_new_tokens", "closed_book", "prompt_intervention", "frame", "device", "dtype", "seed", "edit", "adapter",
        "progress", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len", "out",
        "protocol", "closed_book_from", "stop_at_final_line", "chat"),
        required=("out",), defaults={k: argparse.SUPPRESS for k in PROTOCOL_FILLED}, helps={
        "batch_size": "prompts per backend call (default 8 on hf, 256 on vllm)",
        "formulations": "comma list of reference,paraphrase_a,paraphrase_b, or all (default reference; "
                        "--protocol paper: all)",
        "question_set": "all | analysis | fold-A | fold-B (default all; --protocol paper: analysis)",
        "out": "run directory (resumed if it exists with the same settings)"})


def given_options(args: argparse.Namespace, cls: type, filled: Sequence[str] = PROTOCOL_FILLED) -> list[str]:
    """The protocol-governed fields the user set on the command line: a SUPPRESS-defaulted option is present in
    ``args`` only when given; any other counts as given when its value differs from ``cls``'s default."""
    from memtoc.tasks.memtoc.evaluate import PROTOCOL_FIELDS
    from memtoc.core.options import OPTIONS, config_from_args, leaves

    dest = {leaf.path[-1]: OPTIONS[leaf.option].dest for leaf in leaves(cls)}
    parsed, base = config_from_args(cls, args), cls()
    return [f for f in PROTOCOL_FIELDS
            if (hasattr(args, dest[f]) if f in filled else getattr(parsed, f) != getattr(base, f))]


def evaluation_config(args: argparse.Namespace) -> Any:
    """``memtoc evaluate``'s config: the parsed options, the protocol's settings where the user gave none."""
    from memtoc.core.values import mark_given
    from memtoc.core.options import config_from_args
    from memtoc.jobs.evaluate import EvaluationConfig, resolve_evaluation

    cfg = mark_given(config_from_args(EvaluationConfig, args), given_options(args, EvaluationConfig))
    return resolve_evaluation(cfg)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from memtoc.jobs.evaluate import run_evaluate

    result = run_evaluate(evaluation_config(args))
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({result.summary['n_episodes']['done']}/"
          f"{result.summary['n_episodes']['planned']} episodes; {result.n_episodes_new} new)")
    return 0


def _read_records(path: str) -> list[dict]:
    """Scored records from a JSONL file, or from a run directory's ``episodes.jsonl`` (read only: a torn last
    line is ignored, and an interrupted run is named in a warning)."""
    from memtoc.runs.runstore import RunStore, iter_jsonl, print_warning

    p = Path(path)
    if p.is_dir():
        return RunStore.read(p).episodes.records()
    if p.name == "episodes.jsonl" and (p.parent / "run.json").is_file():
        store = RunStore.read(p.parent, warn=None)
        for w in store.state.warnings() if store.state else []:
            print_warning(w)
        return store.episodes.records()
    return list(iter_jsonl(p))


def _write_jsonl(path: str, records: Sequence[dict]) -> None:
    from memtoc.core.fileio import write_jsonl_atomic

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(out, list(records))


def cmd_score(args: argparse.Namespace) -> int:
    from memtoc.bench.offline import score_record

    check_outputs({"--out": args.output}, [args.input])
    records = _read_records(args.input)
    if not records:
        raise MemtocError(f"{args.input}: no records to score; {args.output} was not written")
    scored = [score_record(r, row=i, path=args.input) for i, r in enumerate(records, 1)]
    _write_jsonl(args.output, scored)
    counts = Counter(r["outcome"] for r in scored)
    print(f"scored {len(scored)} records -> {args.output}  outcomes: " +
          ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.metrics import metric_table

    check_outputs({"--out": args.output}, [args.run, args.input])
    check_n_boot(args.n_boot)
    if args.run is not None or args.input is None or args.layer != "deterministic":
        from memtoc.cli.judge import cmd_metrics_layer

        return cmd_metrics_layer(args)
    records = _read_records(args.input)
    with naming(args.input):
        table = metric_table(records, n_boot=args.n_boot, seed=args.seed)
    print(table.format_text())
    if args.output:
        write_json_atomic(args.output, table.to_dict())
    return 0


def episodes_config(args: argparse.Namespace) -> Any:
    """``memtoc episodes``'s config; ``--formulations``/``--question-set`` count as given only when present."""
    from memtoc.core.values import mark_given
    from memtoc.jobs.episodes import EpisodesConfig

    kw = {k: getattr(args, k) for k in ("benchmark", "conditions", "limit", "frame", "prompt_intervention",
                                        "closed_book", "protocol")}
    given = {k: getattr(args, dest) for k, dest in (("question_set", "question_set"), ("formulations", "formulation"))
             if hasattr(args, dest)}
    return mark_given(EpisodesConfig(**kw, **given), given)


def episodes_from_args(args: argparse.Namespace) -> tuple[list[Any], str]:
    """``memtoc episodes``'s work: the built episodes and the frame they use (:mod:`memtoc.jobs.episodes`)."""
    from memtoc.jobs.episodes import run_episodes

    res = run_episodes(episodes_config(args))
    return res.episodes, res.frame


def cmd_episodes(args: argparse.Namespace) -> int:
    from memtoc.jobs.episodes import run_episodes

    check_outputs({"--out": args.output}, [args.benchmark if Path(args.benchmark).exists() else None])
    res = run_episodes(episodes_config(args))
    eps, frame = res.episodes, res.frame
    _write_jsonl(args.output, [e.to_dict() for e in eps])
    counts = Counter((e.formulation, e.arm) for e in eps)
    print(f"{len(eps)} episodes from {len({e.question.id for e in eps})} questions (frame {frame}, question set "
          f"{res.question_set}, protocol {args.protocol}) -> {args.output}")
    for (f, arm), n in sorted(counts.items()):
        print(f"  {f:13s} {arm:15s} {n}")
    return 0


def compare_from_args(args: argparse.Namespace) -> Any:
    """``memtoc compare``: the job's config from the parsed options, run by :func:`memtoc.jobs.compare.run_compare`."""
    from memtoc.jobs.compare import CompareConfig, run_compare

    return run_compare(CompareConfig(run_a=args.run_a, run_b=args.run_b, seed=args.seed, layer=args.layer,
                                     judge_file=args.judge_file,
                                     allow_partial=getattr(args, "allow_partial", False)))


def cmd_compare(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic

    check_outputs({"--out": args.output}, [args.run_a, args.run_b])
    comp = compare_from_args(args)
    print(comp.format_text())
    if args.output:
        write_json_atomic(args.output, comp.to_dict())
    return 0


def cmd_switch(args: argparse.Namespace) -> int:
    from memtoc.jobs.switch import write_switch_run

    check_n_boot(args.n_boot)

    summary = write_switch_run(args.base, args.knob, args.gate, args.out, seed=args.seed, n_boot=args.n_boot)
    print(summary["table_text"])
    sw = summary["switch"]
    print(f"\nswitch ({sw['gate']} gate, knob {sw['knob']}): fired on {sw['n_fired']} of "
          f"{summary['n_episodes']['done']} episodes -> {args.out}")
    return 0


def build_job_parser(extra: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """Every job subcommand; ``extra`` registrars add more (``memtoc.cli`` adds ``run-experiment``)."""
    from memtoc.core.config import EpisodeSelection, Intervention, JobSettings
    from memtoc.core.options import add_options
    from memtoc.cli.judge import add_layer_args

    from memtoc.cli.catalog import COMMANDS
    from memtoc.cli.generate import MemtocParser, add_command
    from memtoc.jobs.registry import GROUPS

    parser = MemtocParser(prog="memtoc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=MemtocParser)
    for command in COMMANDS:
        add_command(parser, command, GROUPS)

    p = sub.add_parser("evaluate", help="run a model on the benchmark: closed-book pass, tool pass, scores, metrics")
    _add_eval_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("score", help="re-score per-episode responses offline with the one scorer")
    p.add_argument("--input", required=True,
                   help="records to score (JSONL: an episodes file with raw responses, e.g. a run's episodes.jsonl)")
    p.add_argument("--out", dest="output", required=True, help="scored records to write (JSONL)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("metrics", help="metric table (per formulation and pooled, with intervals) of scored records")
    p.add_argument("run", nargs="?", default=None, help="a run directory (instead of --input)")
    p.add_argument("--input", help="scored records (memtoc score output or a run's episodes.jsonl)")
    p.add_argument("--out", dest="output", help="also write the table as JSON")
    add_options(p, JobSettings, only=("n_boot", "seed"))
    add_layer_args(p, both=True, partial=True)
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("episodes", help="export the built episodes with their exact prompt strings")
    add_options(p, EpisodeSelection, only=("benchmark",))
    p.add_argument("--formulations", dest="formulation", default=argparse.SUPPRESS,
                   help="a formulation, a comma list, or all (default reference; --protocol paper: all)")
    add_options(p, EpisodeSelection, only=("conditions", "question_set", "limit"),
                defaults={"question_set": argparse.SUPPRESS},
                helps={"question_set": "all | analysis | fold-A | fold-B (default all; --protocol paper: analysis)"})
    add_options(p, Intervention, only=("frame", "prompt_intervention", "closed_book"))
    from memtoc.tasks.memtoc.evaluate import EvaluationConfig
    add_options(p, EvaluationConfig, only=("protocol",), helps={
        "protocol": "paper: the analysis set and all three formulations unless given (memtoc.bench.protocol)"})
    p.add_argument("--out", dest="output", required=True, help="episodes file to write (JSONL)")
    p.set_defaults(func=cmd_episodes)

    p = sub.add_parser("compare", help="paired comparison of two runs on common support, with the criterion")
    p.add_argument("run_a", help="baseline run directory")
    p.add_argument("run_b", help="treated run directory")
    p.add_argument("--out", dest="output", help="also write the comparison as JSON")
    add_options(p, JobSettings, only=("seed",))
    add_layer_args(p, partial=True)
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("switch", help="compose a prompt switch (paper App. E): per episode, the knob arm's answer "
                       "where the gate fires, else the standard arm's; written as a run directory")
    p.add_argument("base", help="standard-arm run directory")
    p.add_argument("knob", help="knob-arm run directory (same model and closed-book pass, e.g. source-priority)")
    from memtoc.jobs.switch import GATES
    p.add_argument("--gate", required=True, choices=tuple(GATES),
                   help="oracle: fire where the tool value is wrong; observable: fire where the model's closed-book "
                   "answer disagrees with the tool value")
    p.add_argument("--out", required=True, help="run directory of the composed arm")
    add_options(p, JobSettings, only=("seed", "n_boot"))
    p.set_defaults(func=cmd_switch)
    from memtoc.cli.activations import add_extract_parser
    add_extract_parser(sub)
    from memtoc.cli.finetune import add_finetune_parsers
    add_finetune_parsers(sub)
    # experiments, reports, shards: merge / merge-activations / report / run-experiment
    from memtoc.cli.merge import add_merge_parsers
    add_merge_parsers(sub)
    from memtoc.cli.report import add_report_parser
    add_report_parser(sub)
    from memtoc.cli.codeexec import add_codeexec_parsers
    add_codeexec_parsers(sub)
    from memtoc.cli.agent import add_agent_parsers
    add_agent_parsers(sub)
    from memtoc.cli.study import add_study_parser  # study / verify-release (issue 15)
    add_study_parser(sub)
    from memtoc.cli.transfer import add_transfer_table_parser  # App. F.1 Table 6 (issue 28)
    add_transfer_table_parser(sub)
    from memtoc.cli.release import add_verify_release_parser
    add_verify_release_parser(sub)
    from memtoc.cli.judge import add_judge_parsers
    add_judge_parsers(sub)
    for register in extra:
        register(sub)
    from memtoc.cli.vocabulary import add_deprecated_aliases
    return add_deprecated_aliases(parser)


def run_command(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    parser = parser or build_job_parser()
    args = parser.parse_args(argv)
    from memtoc.cli.vocabulary import check_required
    check_required(args, parser)
    try:
        return int(args.func(args) or 0)
    except MemtocError as exc:
        print(f"memtoc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a disk or permission failure no code path turned into a MemtocError
        from memtoc.core.fileio import describe_os_error

        where = f"{exc.filename}: " if exc.filename else ""
        print(f"memtoc {args.command}: error: {where}{describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memtoc {args.command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
