"""``memtoc extract``: the CLI layer over ``activations.extract.extract``."""

from __future__ import annotations

import argparse
from typing import Any

from activations.positions import POSITION_KINDS


def add_extract_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``extract`` subcommand on ``memtoc``'s subparsers."""
    from memtoc.cli import add_selection_args

    p = subparsers.add_parser(
        "extract", help="capture residual-stream activations of benchmark episodes into an HDF5 store",
        description="Run the model over the planned episodes (the prompts of `memtoc evaluate`) and store the "
                    "residual stream at the chosen sites and positions. Re-running the same command resumes: "
                    "only episodes missing from --out are run. Schema: docs/activations.md.")
    add_selection_args(p)
    p.add_argument("--layers", default="all", help="sites to store: all | last | N | N-M, comma separated; site 0 = "
                   "embedding output, site s = output of block s-1 (output_hidden_states numbering, pre final norm)")
    p.add_argument("--positions", default="last_input",
                   help=f"comma list of {', '.join(POSITION_KINDS)} (generated = greedy answer tokens)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="generation budget for --positions generated")
    p.add_argument("--closed-book", choices=("forced", "permissive"), default="forced",
                   help="closed-book prompt used by no_tool episodes")
    p.add_argument("--prompt-intervention", choices=("none", "warn", "source-priority", "abstain-and-flag"),
                   default="none")
    p.add_argument("--frame", choices=("auto", "tool", "tool-no-schema", "passage"), default="auto")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | "
                   "bfloat16 | float16")
    p.add_argument("--store-dtype", default="auto", help="auto (the model's dtype, lossless) | float32 | float16 | "
                   "bfloat16 (stored as raw uint16 bits)")
    p.add_argument("--compression", choices=("none", "gzip", "lzf"), default="none")
    p.add_argument("--compression-level", type=int, default=None, help="gzip level 0-9 (default 4)")
    p.add_argument("--run", default=None, help="evaluation run directory whose behaviour labels (followed_tool, "
                   "kept_memory, outcome, cell) are joined into the index by episode_id")
    p.add_argument("--out", required=True, help="HDF5 store (extended if it exists with the same settings)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_extract)
    return p


def cmd_extract(args: argparse.Namespace) -> int:
    from activations.extract import ExtractConfig, extract

    cfg = ExtractConfig(model=args.model, benchmark=args.benchmark, out=args.out, formulations=args.formulations,
                        conditions=args.conditions, question_set=args.question_set, limit=args.limit,
                        layers=args.layers, positions=args.positions, max_new_tokens=args.max_new_tokens,
                        closed_book=args.closed_book, prompt_intervention=args.prompt_intervention, frame=args.frame,
                        batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                        store_dtype=args.store_dtype, compression=args.compression,
                        compression_level=args.compression_level, run=args.run, progress=not args.no_progress)
    result = extract(cfg)
    state = "complete" if result.complete else "INCOMPLETE"
    print(f"{result.path}: {result.n_done}/{result.n_planned} planned episodes stored ({state}); "
          f"{result.n_new_episodes} new episodes, {result.n_new_rows} new rows"
          + (f"; labels joined for {result.n_labelled} episodes" if result.n_labelled is not None else ""))
    return 0 if result.complete else 1
