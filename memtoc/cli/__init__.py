"""Adapters: the ``memtoc`` command line. Each subcommand is a job of :mod:`memtoc.jobs.catalog` whose parser is
generated from the job's config (:mod:`memtoc.cli.generate`); :mod:`memtoc.cli.catalog` says how each result is
shown. Nothing below this package imports it."""

from __future__ import annotations

from typing import Any, Sequence

#: what ``memtoc --help`` says above the list of commands
DESCRIPTION = ("Interpretability and steering on the MemToC benchmark: evaluate a model, capture and probe its "
               "activations, fit lenses, build and sweep edits, report. `memtoc COMMAND --help` lists a command's "
               "options.")


def build_parser(*, lazy: bool = False) -> Any:
    """``memtoc`` with every command. ``lazy``: each command's options are added when the command is parsed, so
    ``memtoc --help`` imports no job and ``memtoc JOB`` only its own."""
    from memtoc.cli.catalog import COMMANDS
    from memtoc.cli.generate import build_parser as build

    return build(COMMANDS, description=DESCRIPTION, lazy=lazy)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    from memtoc.cli.generate import run

    return run(argv, build_parser(lazy=True))
