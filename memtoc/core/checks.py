"""Option values checked before any work: the shared checks every job calls first.

A value that cannot run is one line naming the option and the value (exit 2 on the CLI), raised before a run
directory is read or created and before weights load, so ``--device tpu9``, ``--n-boot 0`` or ``--batch-size 0``
never opens a run, loads a model or ends in a traceback. Output paths have their own one rule,
:func:`memtoc.core.fileio.check_output_path`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from memtoc.core.errors import MemtocError

#: what ``--device`` takes (the backends' ``pick_device``); ``meta`` and other torch devices cannot generate
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


class OptionValueError(MemtocError, ValueError):
    """An option value no job can run with; the message names the option and the value."""


def check_device(value: Any, *, flag: str = "--device") -> str:
    if not isinstance(value, str) or not _DEVICE.match(value):
        raise OptionValueError(f"{flag} {value!r}: choose auto, cpu, cuda or cuda:N")
    return value


def check_int(value: Any, flag: str, *, minimum: int = 1) -> int:
    """An integer option of at least ``minimum`` (``True`` and ``2.7`` are not integers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionValueError(f"{flag} {value!r}: give a whole number of at least {minimum}")
    if value < minimum:
        raise OptionValueError(f"{flag} {value}: must be at least {minimum}")
    return value


def check_positive(value: Any, flag: str) -> int:
    return check_int(value, flag, minimum=1)


def check_n_boot(value: Any, flag: str = "--n-boot") -> int:
    """Bootstrap resamples: at least 1 (0 or a negative count gives no interval at all)."""
    return check_int(value, flag, minimum=1)


def check_temperature(value: Any, flag: str = "--temperature") -> float:
    """A sampling temperature: a finite number >= 0 (0 = greedy)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise OptionValueError(f"{flag} {value!r}: give a finite number >= 0 (0 = greedy)")
    return float(value)
