"""Adapters: the ``memtoc`` command line. Each subcommand is a job of :mod:`memtoc.jobs.catalog` whose options tyro
parses from the job's config (:mod:`memtoc.cli.parse`); :mod:`memtoc.cli.present` says how each result is shown.
Nothing below this package imports it."""

from __future__ import annotations

from typing import Sequence

def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    from memtoc.cli.parse import main as run

    return run(argv)
