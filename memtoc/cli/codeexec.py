"""``memtoc codeexec ...``: the corrupted code-executor family on the command line.

The options are generated from the family's configs (:mod:`memtoc.core.options`); every value is checked when the
config is built, before a model loads or a run directory exists.
"""

from __future__ import annotations

import argparse


def _prepare_sandbox(args: argparse.Namespace) -> None:
    """Sandbox limits and kernel isolation are checked before the model loads or the output is created."""
    from memtoc.tasks.codeexec.sandbox import prepare_sandbox

    prepare_sandbox(timeout_s=args.timeout_s, cpu_s=args.cpu_s, memory_mb=args.memory_mb,
                    require_isolation=args.require_isolation)


def cmd_codeexec_evaluate(args: argparse.Namespace) -> int:
    """The code-executor task through the one evaluate job (``evaluate_codeexec`` is its entry)."""
    _prepare_sandbox(args)
    from memtoc.tasks.codeexec.run import CodeexecRunConfig, evaluate_codeexec
    from memtoc.core.options import config_from_args

    cfg = config_from_args(CodeexecRunConfig, args)
    edit = None
    if args.edit:
        from steering.edits import load_edit

        edit = load_edit(args.edit)
    result = evaluate_codeexec(cfg, edit=edit)
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({len(result.records)} trials; {result.n_new} new)")
    return 0


def cmd_codeexec_extract(args: argparse.Namespace) -> int:
    """The code-executor task through the one extract job."""
    _prepare_sandbox(args)
    from activations.extract import extract
    from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
    from memtoc.core.options import config_from_args

    res = extract(config_from_args(CodeexecExtractConfig, args), task="codeexec")
    state = "complete" if res.complete else "incomplete"
    print(f"{res.path}: {res.n_done} of {res.n_planned} prompts stored ({res.n_new_episodes} new; {state})")
    return 0


def cmd_codeexec_table(args: argparse.Namespace) -> int:
    """The overreliance paper's columns from the study's outputs, the paper's numbers beside them."""
    from memtoc.tasks.codeexec.paper_table import PaperTableConfig, write_table

    band = None
    if args.band:
        from memtoc.backends.parts import parse_sites

        band = tuple(parse_sites(args.band, 10**6, default=None))
    paths = write_table(PaperTableConfig(run=args.run, probe=args.probe, sweep=args.sweep,
                                         sampled_sweep=args.sampled_sweep, band=band), args.out)
    print(paths["markdown"].read_text(encoding="utf-8").rstrip())
    print("\nwritten: " + ", ".join(str(p) for p in paths.values()))
    return 0


def add_codeexec_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``memtoc codeexec evaluate``, ``extract`` and ``table`` (``sweep`` is generated)."""
    from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
    from memtoc.tasks.codeexec.run import CodeexecRunConfig
    from memtoc.core.options import add_option, add_options

    from memtoc.cli.generate import _subparsers

    top = sub.choices.get("codeexec") or sub.add_parser("codeexec", help="corrupted code-executor family: agent runs "
                                                        "with a real Python tool")     # (codeexec sweep made it)
    csub = _subparsers(top, "codeexec_command")
    p = csub.add_parser("evaluate", help="run the agent loop over problems x conditions; writes run.json, "
                        "trials.jsonl, summary.json (resumable)")
    add_options(p, CodeexecRunConfig, only=(
        "model", "conditions", "policy", "repetitions", "limit", "split", "seed", "bootstrap_seed", "n_boot",
        "max_tool_rounds", "max_new_tokens", "batch_size", "protocol", "timeout_s", "cpu_s", "memory_mb", "first_call",
        "temperature", "sample_seed", "max_total_new_tokens", "run_protocol", "backend", "device", "dtype", "progress",
        "out"), required=("out",),
                defaults={"conditions": "all"},
                helps={"model": "'default' (embedded SmolLM2-135M-Instruct), a .gguf file, a local model directory, "
                                "or a hub id",
                       "limit": "first N problems of the split", "seed": "problem and corruption-factor seed",
                       "max_new_tokens": "generation budget per model turn", "batch_size": "trials per backend call",
                       "out": "run directory (resumed if it exists with the same settings)"})
    add_option(p, "edit", help="edit spec applied to every model turn (hf backend)")
    add_option(p, "require_isolation")
    p.set_defaults(func=cmd_codeexec_evaluate)

    p = csub.add_parser("extract", help="residual stream at the final prompt token after the (scripted) first tool "
                        "return -> HDF5 activation store (for memtoc probe / memtoc direction)")
    add_options(p, CodeexecExtractConfig, only=(
        "model", "split", "conditions", "policy", "limit", "seed", "layers", "positions", "batch_size",
        "max_tool_rounds", "protocol", "timeout_s", "cpu_s", "memory_mb", "device", "dtype", "store_dtype", "progress",
        "run", "out"),
                required=("out",), helps={
                    "run": "a 'codeexec evaluate' run directory: capture its own (model-initiated) trajectories after "
                           "each trial's first tool return, labelled in the outcome column (accepted / adopted / "
                           "rejected / no_answer / ambiguous) -- the overreliance paper's probe protocol; without "
                           "it, scripted first calls labelled by condition",
                    "conditions": "comma list of P0,P1+,P1-,P2+,P2-",
                    "limit": "first N problems of the split",
                    "layers": "sites: all | last | N | N-M, comma separated (0 = embedding output)",
                    "positions": "last_input,tool_span,from_tool_return",
                    "max_tool_rounds": "as in the runs the activations describe",
                    "out": "HDF5 store (resumed if it exists with the same settings)"})
    add_option(p, "require_isolation")
    p.set_defaults(func=cmd_codeexec_extract)

    p = csub.add_parser("table", help="the overreliance paper's table (adoption / override, probe AUROC per layer "
                        "band, steering per alpha) from a study's outputs, the paper's numbers beside them")
    p.add_argument("--run", required=True, help="'codeexec evaluate' run directory (conditions no_tool,P0,P1,P2)")
    p.add_argument("--probe", required=True, help="'memtoc probe' output directory (probe.json)")
    p.add_argument("--sweep", required=True, help="'memtoc codeexec sweep' directory (greedy)")
    p.add_argument("--sampled-sweep", default=None, help="the same sweep with sampled repetitions")
    p.add_argument("--band", default=None, help="steering band sites (N-M); default: the edit's own sites")
    add_option(p, "out", required=True, help="directory for paper_table.{md,json}")
    p.set_defaults(func=cmd_codeexec_table)
