"""``memtoc finetune data|train|crossfit|table`` (registered by :func:`add_finetune_parsers`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from memtoc.core.errors import MemtocError


def _add_train_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training (paper defaults: r=16 on q/k/v/o, alpha 32, lr 1e-5, 1 epoch, beta 0.1)")
    g.add_argument("--r", type=int, default=16, help="LoRA rank")
    g.add_argument("--alpha", type=int, default=32, help="LoRA alpha")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout")
    g.add_argument("--targets", default="q,k,v,o", help="attention projections to adapt (found by name suffix)")
    g.add_argument("--target-modules", default=None, help="explicit module-name suffixes (overrides --targets)")
    g.add_argument("--lr", type=float, default=1e-5, help="learning rate")
    g.add_argument("--epochs", type=int, default=1, help="passes over the training examples")
    g.add_argument("--beta", type=float, default=0.1, help="DPO beta")
    g.add_argument("--train-batch-size", type=int, default=4, help="examples (SFT) or pairs (DPO) per step")
    g.add_argument("--micro-batch-size", type=int, default=None, help="gradient accumulation: rows per forward")
    g.add_argument("--max-length", type=int, default=2048, help="refuse (never truncate) longer examples")
    g.add_argument("--save-every", type=int, default=25, help="checkpoint every N optimizer steps")
    g.add_argument("--gradient-checkpointing", action="store_true", help="for 7-9B models on one GPU")
    g.add_argument("--train-seed", type=int, default=0, help="LoRA init and data order")


def _train_config(args: argparse.Namespace, objective: str) -> Any:
    from memtoc.jobs.finetune.lora import LoraSettings
    from memtoc.jobs.finetune.train import TrainConfig

    lora = LoraSettings(r=args.r, alpha=args.alpha, dropout=args.lora_dropout,
                        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()),
                        target_modules=tuple(t.strip() for t in args.target_modules.split(",") if t.strip())
                        if args.target_modules else None)
    return TrainConfig(objective=objective, lora=lora, lr=args.lr, epochs=args.epochs, beta=args.beta,
                       batch_size=args.train_batch_size, micro_batch_size=args.micro_batch_size,
                       max_length=args.max_length, seed=args.train_seed, save_every=args.save_every,
                       gradient_checkpointing=args.gradient_checkpointing)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    from memtoc.jobs.finetune.crossfit import CrossfitConfig
    from memtoc.core.options import add_options

    add_options(p, CrossfitConfig, only=("model", "benchmark", "formulations", "frame", "limit", "device", "dtype"),
                helps={"model": "'default', a .gguf file, a local model directory or a hub id",
                       "formulations": "comma list or all (training prompts)",
                       "device": "auto | cpu | cuda | cuda:N (GPU for 7-9B models)",
                       "dtype": "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16"})


def _questions(args: argparse.Namespace) -> tuple[Any, list]:
    from memtoc.bench.benchmark import load_benchmark

    bench = load_benchmark(args.benchmark)
    qs = bench.select("all" if not args.fold else f"fold-{args.fold}", None)
    if args.limit is not None:
        selected = {q.id for q in bench.select("all", args.limit)}
        qs = [q for q in qs if q.id in selected]
    if not qs:
        raise MemtocError("no questions selected")
    return bench, qs


def _pairs(args: argparse.Namespace, format_prompt: Any) -> Any:
    from memtoc.bench.episodes import parse_formulations
    from memtoc.jobs.finetune.data import build_pairs, make_pair_set

    bench, qs = _questions(args)
    frame = bench.default_frame if args.frame == "auto" else args.frame
    forms = parse_formulations(args.formulations)
    return make_pair_set(build_pairs(qs, format_prompt, formulations=forms, frame=frame), benchmark=bench.name,
                         benchmark_files=bench.files, fold=args.fold, frame=frame, formulations=list(forms),
                         limit=args.limit)


def cmd_data(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from memtoc.backends.chat import format_user_prompt, uses_chat_template
    from memtoc.backends.models import resolve_model
    from memtoc.jobs.finetune.data import write_pair_set

    src = resolve_model(args.model)
    kw: dict[str, Any] = {"local_files_only": src.local}
    if src.gguf_file:
        kw["gguf_file"] = src.gguf_file
    tok = AutoTokenizer.from_pretrained(src.path, **kw)
    chat = uses_chat_template(tok)
    # The same function HFBackend.format_prompt calls, without loading the weights.
    ps = _pairs(args, lambda p: format_user_prompt(tok, p, chat=chat))
    path = write_pair_set(args.out, ps)
    print(f"{len(ps.pairs)} pairs from {ps.meta['n_questions']} questions -> {path}  (sha256 {ps.sha256[:12]})")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec
    from memtoc.jobs.finetune.data import read_pair_set
    from memtoc.jobs.finetune.train import train_adapter

    backend = load_backend(ModelSpec(model=args.model, backend="hf", device=args.device, dtype=args.dtype))
    ps = read_pair_set(args.pairs) if args.pairs else _pairs(args, backend.format_prompt)
    res = train_adapter(ps, backend, args.out, _train_config(args, args.objective), stop_after=args.stop_after)
    state = "complete" if res.completed else f"stopped at {res.steps_done}/{res.total_steps} (re-run to resume)"
    print(f"{args.objective} adapter {state}: {res.path}" + (f"  sha256 {res.adapter_sha256}" if
                                                              res.adapter_sha256 else ""))
    return 0


def _run_pieces(cfg: Any, args: argparse.Namespace) -> None:
    """Base, prompting arm and each (objective, fold) as one executor task; the cross-fit that follows finds them
    finished and only merges, compares and writes the table."""
    from memtoc.cli.executor import run_tasks_from_args
    from memtoc.jobs.executor import WorkUnit
    from memtoc.jobs.finetune.crossfit import crossfit_arms, crossfit_task

    run_tasks_from_args(args, lambda: [WorkUnit(name=f"{arm}-{split}" if split else arm, arm=arm, fn=crossfit_task,
                                            args=(cfg, arm, split)) for arm, split in crossfit_arms(cfg)],
                        label="crossfit", kept="finished pieces")


def cmd_crossfit(args: argparse.Namespace) -> int:
    from memtoc.cli.executor import executor_from_args
    from memtoc.jobs.finetune.crossfit import CrossfitConfig, run_crossfit
    from memtoc.core.options import config_from_args

    cfg = config_from_args(CrossfitConfig, args, train=_train_config(args, "sft"))
    if executor_from_args(args)[0] != "local":
        _run_pieces(cfg, args)
    res = run_crossfit(cfg)
    print(res.table_markdown)
    print(f"cross-fit directory: {res.out}  (table: {res.manifest['table']['markdown']})")
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from memtoc.jobs.finetune.table import read_arm, side_by_side, write_table
    from memtoc.runs.runstore import RunStore

    arms = []
    for kind in ("prompt", "sft", "dpo"):
        for path in getattr(args, kind) or []:
            arms.append(read_arm(kind, path))
    for path in args.steer or []:
        arms.append(read_arm("steer", path))
    table = side_by_side(RunStore.read(args.base).episodes.records(), arms, seed=args.seed)
    print(table.markdown())
    if args.out:
        files = write_table(table, args.out)
        print(f"-> {files['markdown']}, {files['json']}", file=sys.stderr)
    return 0


def add_finetune_parsers(sub: Any) -> None:
    from memtoc.core.options import add_option

    ft = sub.add_parser("finetune", help="cross-fitted LoRA SFT / DPO arms: data, train, crossfit, table")
    fsub = ft.add_subparsers(dest="finetune_command", required=True)

    p = fsub.add_parser("data", help="write preference / SFT pairs (tool_wrong and tool_right, near distractors)")
    _add_model_args(p)
    p.add_argument("--fold", default=None, help="only this fold's questions (e.g. A)")
    p.add_argument("--out", required=True, help="pairs .jsonl (a .meta.json with the hash is written beside it)")
    p.set_defaults(func=cmd_data)

    p = fsub.add_parser("train", help="train one LoRA adapter (SFT or DPO), resumable")
    _add_model_args(p)
    _add_train_args(p)
    p.add_argument("--objective", choices=("sft", "dpo"), required=True,
                   help="sft (supervised) or dpo (preference pairs)")
    p.add_argument("--fold", default=None, help="train on this fold's questions (e.g. A)")
    p.add_argument("--pairs", default=None, help="a pairs file from 'finetune data' instead of building them")
    p.add_argument("--stop-after", type=int, default=None, help="stop after N total steps (checkpointed)")
    p.add_argument("--out", required=True, help="adapter directory")
    p.set_defaults(func=cmd_train)

    p = fsub.add_parser("crossfit", help="train A->eval B and B->eval A, merge held-out halves, compare with base")
    _add_model_args(p)
    _add_train_args(p)
    from memtoc.jobs.finetune.crossfit import CrossfitConfig
    from memtoc.core.options import add_options

    add_options(p, CrossfitConfig, only=("objective", "question_set", "fold_pool", "train_formulations",
                                         "protocol", "conditions", "closed_book",
                                         "prompt_intervention", "batch_size", "max_new_tokens", "seed", "progress",
                                         "out"),
                required=("out",), choices={"question_set": ("all", "analysis")},
                helps={"conditions": "evaluation conditions",
                       "question_set": "the questions results are computed on (the paper: analysis)",
                       "prompt_intervention": "also evaluate base with this prompt intervention (the prompting arm)",
                       "batch_size": "evaluation prompts per batch",
                       "out": "output directory (data/, adapters/, runs/ and arms/ inside)"})
    from memtoc.cli.executor import add_executor_options
    add_executor_options(p)
    p.set_defaults(func=cmd_crossfit)

    p = fsub.add_parser("table", help="paired changes vs base: prompting, SFT, DPO, best steering edit")
    p.add_argument("--base", required=True, help="untreated run directory")
    p.add_argument("--sft", action="append", help="SFT arm (crossfit OUT/arms/sft or a run directory)")
    p.add_argument("--dpo", action="append", help="DPO arm")
    p.add_argument("--prompt", action="append", help="prompting run (evaluate --prompt-intervention)")
    p.add_argument("--steer", action="append", help="steering run (evaluate --edit); repeat: the best is kept")
    add_option(p, "seed", default=0)
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    p.set_defaults(func=cmd_table)
