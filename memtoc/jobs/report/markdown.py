"""Render a report document as Markdown; plots are written as PNG files into ``report_assets/`` beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtoc.jobs.report.document import Alert, Document, Image, Links, Para, Table

ASSETS = "report_assets"


def _cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ") \
        .replace("<", "&lt;").replace(">", "&gt;")


def _table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in t.headers) + " |", "|" + "|".join("---" for _ in t.headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    if t.caption:
        lines += ["", f"_{_cell(t.caption)}_"]
    if t.source:
        lines += ["", f"source: `{t.source}`"]
    return lines + [""]


def _alert(text: str) -> list[str]:
    return [f"> **Warning:** {_cell(text)}", ""]


def render_markdown(doc: Document, out_dir: str | Path) -> str:
    out = Path(out_dir)
    lines = [f"# {doc.title}", "", doc.subtitle, ""]
    for w in doc.warnings:
        lines += _alert(w)
    for s in doc.sections:
        lines += ["#" * min(max(s.level, 2), 4) + " " + s.title, ""]
        if s.source:
            lines += [f"from `{s.source}`", ""]
        for b in s.blocks:
            lines += _block(b, out)
    return "\n".join(lines).rstrip() + "\n"


def _block(b: Any, out: Path) -> list[str]:
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Image):
        (out / ASSETS).mkdir(parents=True, exist_ok=True)
        path = out / ASSETS / f"{b.name}.png"
        path.write_bytes(b.png)
        return [f"![{_cell(b.alt)}]({ASSETS}/{b.name}.png)", "", f"source: `{b.source}`", ""]
    if isinstance(b, Para):
        return [_cell(b.text), ""]
    if isinstance(b, Alert):
        return _alert(b.text)
    if isinstance(b, Links):
        return [f"- [{_cell(label)}]({href})" for label, href in b.items] + [""]
    raise TypeError(type(b))
