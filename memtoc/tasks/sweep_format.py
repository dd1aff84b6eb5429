"""What every family's sweep writes and reads the same way: the strengths, their run directories' names and the
number formats of the sweep tables.

Shared by the MemToC sweep rows (``memtoc.tasks.memtoc.sweep``), the code executor's (``memtoc.tasks.codeexec.sweep``)
and the sweep job (``memtoc.jobs.sweep``), so it sits beside the family folders rather than in one of them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

#: the largest strength magnitude a sweep takes (hidden states are O(1..100): beyond this every value overflows
#: half precision and swamps float32 to no purpose)
MAX_STRENGTH = 1e6


def strength_dir_name(s: float) -> str:
    """A strength's run directory (and arm label) in a sweep: ``strength_<s>``."""
    return f"strength_{float(s):g}"


def _strength_error(message: str) -> Exception:
    """The edit-spec error for a bad strength, imported on failure only: ``steering`` loads torch, and config
    modules (read by ``--help``) import this module."""
    from steering.spec import EditSpecError

    return EditSpecError(message, field="strengths")


def parse_strengths(text: str | Sequence[float]) -> list[float]:
    """A comma list (or a sequence) of strengths: finite numbers of magnitude at most :data:`MAX_STRENGTH`, in
    the given order, duplicates dropped (one line naming the bad value otherwise)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for it in items:
        if isinstance(it, str) and not it.strip():
            continue
        try:
            v = float(it)
        except ValueError:
            raise _strength_error(f"bad strength {it!r}: give a comma list of numbers") from None
        if not math.isfinite(v):
            raise _strength_error(f"strength {it!r} is not finite")
        if abs(v) > MAX_STRENGTH:
            raise _strength_error(f"strength {it!r} is out of range: at most {MAX_STRENGTH:g} in magnitude (a larger "
                                  "multiple of the edit overflows the residual stream)")
        out.append(0.0 if v == 0 else v)
    if not out:
        raise _strength_error("empty strength list")
    return list(dict.fromkeys(out))


def fmt_pct(x: float | None) -> str:
    """A rate as a percentage with one decimal, "-" when missing (sweep tables)."""
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}"


def fmt_delta(d: Mapping[str, Any] | None) -> str:
    """A paired change in percentage points with its interval, "-" when missing (sweep tables)."""
    if not d or d.get("delta") is None:
        return "-"
    return f"{100 * d['delta']:+.1f} [{100 * d['ci_low']:+.1f}, {100 * d['ci_high']:+.1f}]"
