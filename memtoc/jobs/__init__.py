"""Jobs: executors, report, merge, switch, study, fine-tuning, release verification and the judge runner."""

import math
import sys
from typing import Any


def stderr_line(msg: str) -> None:
    """The jobs' default ``log``: one line on stderr (looked up at each call, so a redirected stderr gets it)."""
    print(msg, file=sys.stderr, flush=True)


def is_finite(x: Any) -> bool:
    """True for a finite int or float (not a bool): a number a table can print or an option can take."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))
