"""The ``memtoc`` command line: every subcommand generated from its job (:mod:`memtoc.cli.catalog`,
:mod:`memtoc.cli.generate`); recipes run each step as its job (:mod:`memtoc.recipes.experiment`)."""

from __future__ import annotations

import argparse
from typing import Sequence


def build_job_parser() -> argparse.ArgumentParser:
    """``memtoc`` with every command of the catalog (and the deprecated spellings)."""
    from memtoc.cli.catalog import COMMANDS
    from memtoc.cli.generate import build_parser

    return build_parser(COMMANDS, description=__doc__)


def run_command(argv: Sequence[str] | None = None, *, parser: argparse.ArgumentParser | None = None) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    from memtoc.cli.generate import run

    return run(argv, parser or build_job_parser())
