"""``memtoc extract``: the CLI layer over ``activations.extract.extract``."""

from __future__ import annotations

import argparse
from typing import Any

from activations.positions import POSITION_KINDS


def add_extract_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``extract`` subcommand on ``memtoc``'s subparsers."""
    from activations.extract import ExtractConfig
    from memtoc.core.options import add_options

    p = subparsers.add_parser(
        "extract", help="capture residual-stream activations of benchmark episodes into an HDF5 store",
        description="Run the model over the planned episodes (the prompts of `memtoc evaluate`) and store the "
                    "residual stream at the chosen sites and positions. Re-running the same command resumes: "
                    "only episodes missing from --out are run. Schema: docs/activations.md.")
    add_options(p, ExtractConfig, only=(
        "model", "backend", "benchmark", "formulations", "conditions", "question_set", "limit", "layers", "positions",
        "max_new_tokens", "closed_book", "prompt_intervention", "frame", "batch_size", "device", "dtype", "store_dtype",
        "compression", "compression_level", "run", "out", "progress"),
                required=("out",), defaults={"compression": "none"}, helps={
                    "positions": f"comma list of {', '.join(POSITION_KINDS)} (generated = greedy answer tokens)",
                    "max_new_tokens": "generation budget for --position-kinds generated",
                    "closed_book": "closed-book prompt used by no_tool episodes",
                    "dtype": "model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16",
                    "out": "HDF5 store (extended if it exists with the same settings)"})
    p.set_defaults(func=cmd_extract)
    return p


def cmd_extract(args: argparse.Namespace) -> int:
    from memtoc.core.options import config_from_args
    from memtoc.jobs.extract import ExtractConfig, run_extract

    result = run_extract(config_from_args(ExtractConfig, args))
    state = "complete" if result.complete else "INCOMPLETE"
    print(f"{result.path}: {result.n_done}/{result.n_planned} planned episodes stored ({state}); "
          f"{result.n_new_episodes} new episodes, {result.n_new_rows} new rows"
          + (f"; labels joined for {result.n_labelled} episodes" if result.n_labelled is not None else ""))
    return 0 if result.complete else 1
