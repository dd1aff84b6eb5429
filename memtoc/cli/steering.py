"""``memtoc direction`` and ``memtoc sweep`` (registered by ``add_steering_parsers``)."""

from __future__ import annotations

import argparse
from typing import Any


def direction_from_args(args: argparse.Namespace) -> tuple[Any, Any]:
    """``memtoc direction``: the job's config from the parsed options, run by
    :func:`memtoc.jobs.direction.run_direction`."""
    from memtoc.cli.configs import plain_config
    from memtoc.jobs.direction import DirectionConfig, run_direction

    res = run_direction(plain_config(DirectionConfig, args))
    return res.result, res.path


def cmd_direction(args: argparse.Namespace) -> int:
    result, path = direction_from_args(args)
    print(f"direction edit -> {path}")
    for s, f in sorted(result.fits.items()):
        print(f"  site {s}: {f.n_groups} question groups ({f.n_rows_a} / {f.n_rows_b} rows), ||mean diff|| "
              f"{f.norm:.4g}, projection gap (scale) {f.scale:.4g}")
    return 0


def _codeexec_sweep_config(args: argparse.Namespace) -> Any:
    """``memtoc codeexec sweep``: the options the two families share take the code-executor defaults when unset."""
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig
    from memtoc.core.options import config_from_args
    from memtoc.tasks.memtoc.sweep import SweepConfig

    own = CodeexecSweepConfig()
    conditions = own.conditions if args.conditions == SweepConfig().conditions else args.conditions
    return config_from_args(CodeexecSweepConfig, args, conditions=conditions,
                            max_new_tokens=args.max_new_tokens or own.max_new_tokens,
                            batch_size=args.batch_size or own.batch_size)


def _run_strengths(cfg: Any, args: argparse.Namespace) -> None:
    """The sweep's executor tasks (``--executor ray``) in their waves (``memtoc.jobs.sweep.sweep_waves``: the
    closed book, then groups of strengths as rows); the sweep that follows only assembles the table."""
    from memtoc.cli.executor import executor_from_args
    from memtoc.jobs.executor import ExecutorError, make_executor, run_tasks
    from memtoc.jobs.sweep import sweep_waves

    name, resources, address = executor_from_args(args)
    ex = make_executor(name, resources=resources, address=address)
    try:
        for wave in sweep_waves(cfg, ex.slots, args.family):
            execution = run_tasks(wave, ex, label="sweep")
            if not execution.ok:
                raise ExecutorError(f"{execution.summary()}\nfinished strengths are kept; re-run the same command "
                                    "to resume")
    finally:
        ex.close()


def sweep_config_from_args(args: argparse.Namespace) -> Any:
    """The sweep config of ``memtoc sweep``'s options (the Python API builds it the same way)."""
    from memtoc.core.options import config_from_args
    from memtoc.tasks.memtoc.sweep import SweepConfig

    if args.family == "codeexec":
        cfg = _codeexec_sweep_config(args)
    else:
        own = SweepConfig()
        cfg = config_from_args(SweepConfig, args, direction=args.direction or own.direction,
                               max_new_tokens=args.max_new_tokens or own.max_new_tokens)
    return cfg


def cmd_sweep(args: argparse.Namespace) -> int:
    """Both families run through the one sweep job; the command (``sweep``, ``codeexec sweep``) picks the task
    (and its config)."""
    from memtoc.cli.executor import executor_from_args
    from memtoc.jobs.sweep import run_sweep

    cfg = sweep_config_from_args(args)
    if executor_from_args(args)[0] != "local":
        _run_strengths(cfg, args)
    res = run_sweep(cfg, layer=args.layer, judge_file=args.judge_file)
    print(res.markdown)
    for kind, p in res.files.items():
        print(f"{kind}: {p}")
    return 0


def add_steering_parsers(sub: Any) -> None:

    p = sub.add_parser("direction", help="mean-difference steering direction from stored activations -> edit spec")
    p.add_argument("--activations", required=True, help="HDF5 activation store (memtoc extract)")
    p.add_argument("--contrast", required=True,
                   help="A:B; a side is a condition (tool_wrong) or index filters (condition=tool_wrong,"
                        "outcome=kept_memory). The direction points from B to A")
    p.add_argument("--layers", default=None, help="sites (as in the store): N, N-M, comma list, or 'overreliance' (the "
                   "overreliance paper's steering band for the store's model family, by relative depth); default: "
                   "all stored")
    p.add_argument("--position-kinds", dest="position_kind", default="last_input",
                   help="store rows of this position kind are used")
    split = p.add_mutually_exclusive_group(required=True)
    split.add_argument("--split-questions", help="training question ids: one per line, a JSON list, or "
                                                 "{\"train\": [...]}")
    split.add_argument("--fold", help="train on this benchmark fold (A or fold-A)")
    split.add_argument("--all-questions", action="store_true", help="train on every stored question (no held-out "
                                                                    "split; for smoke tests)")
    p.add_argument("--benchmark", default=None, help="benchmark of --fold (default: the one the store was made from)")
    p.add_argument("--min-pairs", type=int, default=1, help="refuse with fewer paired question groups")
    p.add_argument("--absolute-scale", action="store_true",
                   help="scale = |mean projection gap| (the overreliance paper: alpha x unit x |gap|)")
    p.add_argument("--strength", type=float, default=1.0,
                   help="strength written into the edit spec (sweeps override it)")
    p.add_argument("--edit-positions", dest="positions",
                   choices=("last_input", "tool_span", "from_tool_return"), default="last_input",
                   help="where the edit is applied")
    p.add_argument("--toward", choices=("memory", "tool"), default="memory",
                   help="the behaviour a positive strength pushes toward (side A of the contrast)")
    p.add_argument("--apply-to-closed-book", action="store_true", help="also apply the edit in the closed-book pass")
    p.add_argument("--random-control", type=int, default=None, metavar="SEED",
                   help="write a random-direction control with the fitted scales instead")
    p.add_argument("--name", default=None, help="name of the edit (default: from the contrast)")
    p.add_argument("--out", required=True, help="spec file (JSON); vectors go to <stem>.safetensors beside it")
    p.set_defaults(func=cmd_direction)

    p = sub.add_parser("sweep", help="evaluate an edit at several strengths: flip tables, paired changes, plot")
    add_sweep_options(p, family="memtoc")


class _FamilyFlag(argparse.Action):
    """``sweep --family codeexec``: the old way to pick the family (``memtoc codeexec sweep`` now)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values != "memtoc":
            from memtoc.cli.vocabulary import warn_deprecated

            warn_deprecated("sweep", f"--family {values}", f"memtoc {values} sweep")
        setattr(namespace, self.dest, values)


def add_sweep_options(p: Any, *, family: str) -> None:
    """The options of ``memtoc sweep`` (MemToC) and ``memtoc codeexec sweep``: one sweep job, the family is the
    command's."""
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig
    from memtoc.core.options import add_option, add_options
    from memtoc.tasks.memtoc.sweep import SweepConfig

    add_option(p, "edit", required=True, help="edit spec (memtoc direction / mine-features output)")
    add_options(p, SweepConfig, only=("strengths", "direction", "dev_per_direction", "dev_labels"),
                defaults={"direction": None},
                helps={
        "direction": "steer toward memory or toward the tool (direction edits: the strength's sign; sae_clamp: "
                     "swaps the remove/add roles when the spec steers the other way); default: memory, or with "
                     "memtoc codeexec sweep the edit's own 'toward' (strength = spec strength)"})
    if family == "memtoc":   # deprecated: the family is the command (memtoc codeexec sweep)
        p.add_argument("--family", choices=("memtoc", "codeexec"), default="memtoc", action=_FamilyFlag,
                       help=argparse.SUPPRESS)
    else:
        p.set_defaults(family=family)
    add_options(p, SweepConfig, only=("model", "backend", "benchmark", "formulations", "conditions", "question_set",
                                      "limit",
                                      "batch_size", "max_new_tokens", "closed_book", "prompt_intervention", "frame",
                                      "device", "dtype", "seed", "n_boot", "progress", "plot", "out"),
                required=("out",), defaults={"max_new_tokens": None}, helps={
                    "max_new_tokens": "per answer (default 128; codeexec: 384 per model turn)",
                    "out": "sweep directory: one run directory per strength + sweep.*"})
    from memtoc.cli.judge import add_layer_args
    add_layer_args(p)  # the judged layer: the same rules as metrics/compare --score-layer judged (sweep_judged.*)
    cx = p.add_argument_group("code-executor family (memtoc codeexec sweep; --conditions default P0,P1+)")
    add_options(cx, CodeexecSweepConfig, only=("split", "policy", "first_call", "max_tool_rounds", "protocol",
                                               "repetitions", "temperature", "sample_seed"),
                helps={"first_call": "scripted (default here): every tool-condition trial starts with the problem's "
                                     "scripted, really executed tool call, so every trial has a first tool return "
                                     "to steer from"})
    from memtoc.cli.executor import add_executor_options
    add_executor_options(p)
    p.set_defaults(func=cmd_sweep)
