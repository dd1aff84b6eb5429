"""One way to print a value in a table cell and a list of row dicts as a Markdown table (reports, studies)."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["fmt_value", "markdown_table"]


def fmt_value(v: Any) -> str:
    """A cell's text: "–" for missing, yes/no for booleans, four significant digits for floats."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as a Markdown table (columns: the first row's keys unless given); pipes in cells are escaped."""
    if not rows:
        return "_(no rows)_"
    cols = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(fmt_value(r.get(c)).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(lines)
