"""The job commands of ``memtoc``: one subcommand per job, each a thin layer over a library function.

``memtoc.cli`` adds ``run-experiment`` on top; recipes run these commands through :func:`run_command`, so the
recipe runner sits above the job commands instead of importing the command line that registers it.
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
    from memtoc.cli.finetune import add_finetune_parsers
    add_finetune_parsers(sub)
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
