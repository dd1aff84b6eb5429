"""Jobs: executors, report, merge, switch, study, fine-tuning, release verification and the judge runner."""

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def stderr_line(msg: str) -> None:
    """The jobs' default ``log``: one line on stderr (looked up at each call, so a redirected stderr gets it)."""
    print(msg, file=sys.stderr, flush=True)


def is_finite(x: Any) -> bool:
    """True for a finite int or float (not a bool): a number a table can print or an option can take."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


@dataclass
class TableDocument:
    """A job's table (its JSON document) and the Markdown the command prints."""

    table: dict[str, Any]
    markdown: str

    def write(self, out: str | Path, stem: str) -> None:
        """``OUT/<stem>.json`` and ``OUT/<stem>.md``, each written atomically."""
        from memtoc.core.fileio import json_ready, write_json_atomic, write_text_atomic

        Path(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(out) / f"{stem}.json", json_ready(self.table))
        write_text_atomic(Path(out) / f"{stem}.md", self.markdown)
