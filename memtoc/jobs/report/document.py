"""The report's document model (tables, images, paragraphs, alerts, sections) and the small formatters every
section builder and renderer shares. A leaf: builders (``build``, ``codeexec``) make documents, renderers
(``html``, ``markdown``) draw them, and neither side imports the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from memtoc.core.errors import MemtocError
from memtoc.jobs import is_finite


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    source: str = ""
    caption: str = ""


@dataclass
class Image:
    png: bytes
    name: str          # file stem for the Markdown twin
    alt: str
    source: str = ""


@dataclass
class Para:
    text: str


@dataclass
class Alert:
    """A warning the reader must not miss (an interrupted or still running run): shown boxed at the top."""

    text: str


@dataclass
class Links:
    items: list[tuple[str, str]]       # (label, relative href)


@dataclass
class Section:
    title: str
    anchor: str
    level: int = 2
    source: str = ""
    blocks: list[Any] = field(default_factory=list)


@dataclass
class Document:
    title: str
    subtitle: str
    sections: list[Section]
    warnings: list[str] = field(default_factory=list)   # shown above everything, and printed by the CLI


# -- helpers --------------------------------------------------------------------------------------------------

def rel_path(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` (a link inside the report)."""
    return Path(os.path.relpath(path.resolve(), base.resolve())).as_posix()


def pct_text(x: Any) -> str:
    """A fraction as a percentage with one decimal, ``–`` when not a number."""
    return f"{100 * float(x):.1f}" if is_finite(x) else "–"


def fmt3(x: Any) -> str:
    """Three decimals, ``–`` when not a number."""
    return f"{float(x):.3f}" if is_finite(x) else "–"


def fmt_cell(c: Mapping[str, Any] | None) -> str:
    """``45.0% [30.1, 60.2] (9/20)``; ``– (n=0)`` when empty."""
    if not c or not c.get("n"):
        return "– (n=0)"
    return (f"{pct_text(c.get('value'))}% [{pct_text(c.get('ci_low'))}, {pct_text(c.get('ci_high'))}] "
            f"({c.get('k')}/{c.get('n')})")


def fmt_delta(c: Mapping[str, Any] | None) -> str:
    """A paired change in percentage points with its interval, ``+4.0 [-1.2, +9.1]``; ``–`` when absent."""
    if not c or c.get("delta") is None:
        return "–"
    return f"{100 * c['delta']:+.1f} [{100 * c['ci_low']:+.1f}, {100 * c['ci_high']:+.1f}]"


def fmt_pooled(p: Mapping[str, Any] | None) -> str:
    if not p or not p.get("formulations_used"):
        return "– (n=0)"
    n = sum(int(v) for v in (p.get("n_per_formulation") or {}).values())
    return f"{pct_text(p.get('value'))}% [{pct_text(p.get('ci_low'))}, {pct_text(p.get('ci_high'))}] (n={n})"


def short_text(x: Any, n: int = 16) -> str:
    """At most ``n`` characters (an ellipsis marks a cut), ``–`` for None."""
    s = "–" if x is None else str(x)
    return s if len(s) <= n else s[:n] + "…"


def anchor_id(*parts: str) -> str:
    """An HTML id made of ``parts``: lower case, anything but letters and digits as ``-``."""
    raw = "-".join(parts).lower()
    return "".join(ch if ch.isalnum() else "-" for ch in raw).strip("-") or "section"


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MemtocError(f"{path}: cannot read ({exc})") from None
