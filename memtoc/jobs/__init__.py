"""Jobs: executors, report, merge, switch, study, fine-tuning, release verification and the judge runner."""

import sys


def stderr_line(msg: str) -> None:
    """The jobs' default ``log``: one line on stderr (looked up at each call, so a redirected stderr gets it)."""
    print(msg, file=sys.stderr, flush=True)
