"""How a failing job ends a command: one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

import sys
from typing import Any, Callable

from memtoc.core.errors import MemtocError
from memtoc.core.fileio import describe_os_error

__all__ = ["reported"]


def reported(command: str, run: Callable[[], Any]) -> int:
    """``run()`` with a user error, a disk error or an interrupt turned into one line on stderr and the command's
    exit status (2, 2, 130): what the command line and every recipe step do with a failing job."""
    try:
        return int(run() or 0)
    except MemtocError as exc:
        print(f"memtoc {command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a disk or permission failure no code path turned into a MemtocError
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"memtoc {command}: error: {where}{describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memtoc {command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
