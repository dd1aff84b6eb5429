"""The job commands of ``memtoc``: one subcommand per job, each a thin layer over a library function.

``run-experiment`` is one of the generated commands (:mod:`memtoc.cli.catalog`); recipes run each step as its job
(:mod:`memtoc.recipes.experiment`), and the commands not yet converted through :func:`run_command` (temporary).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from memtoc.core.errors import MemtocError


def build_job_parser(extra: Sequence[Callable[[Any], None]] = ()) -> argparse.ArgumentParser:
    """Every job subcommand; ``extra`` registrars add more (``memtoc.cli`` adds ``run-experiment``)."""
    from memtoc.cli.catalog import COMMANDS
    from memtoc.cli.generate import MemtocParser, add_command
    from memtoc.jobs.registry import GROUPS

    parser = MemtocParser(prog="memtoc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=MemtocParser)
    for command in COMMANDS:
        add_command(parser, command, GROUPS)

    from memtoc.cli.probes import add_probe_parsers
    add_probe_parsers(sub)
    from memtoc.cli.mining import add_mining_parsers
    add_mining_parsers(sub)
    from memtoc.cli.steering import add_steering_parsers
    add_steering_parsers(sub)
    from memtoc.cli.codeexec import add_codeexec_parsers
    add_codeexec_parsers(sub)
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
