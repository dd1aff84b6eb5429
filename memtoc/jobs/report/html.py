"""Render a report document as ONE self-contained HTML page: inline CSS, plots as base64 PNG, no external
resources (links point to the run's own files by relative href). All text is HTML-escaped."""

from __future__ import annotations

import base64
from html import escape
from typing import Any

from memtoc.jobs.report.document import Alert, Document, Image, Links, Para, Section, Table

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em;line-height:1.4}
h1{font-size:1.6em;border-bottom:2px solid #333}h2{font-size:1.3em;border-bottom:1px solid #bbb;margin-top:1.8em}
h3{font-size:1.1em;margin-top:1.4em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;max-width:28em;
overflow-wrap:anywhere}
th{background:#f0f0f0}tr:nth-child(even) td{background:#fafafa}
.src{color:#777;font-size:.8em;margin:.2em 0 .6em}.cap{color:#555;font-size:.8em}
img{max-width:100%;border:1px solid #eee}nav ul{columns:2;font-size:.9em}
code{background:#f4f4f4;padding:0 3px}
.warn{border:2px solid #c60;background:#fff4e5;color:#7a3300;padding:.5em .8em;margin:.6em 0;font-weight:600}
"""


def _table(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    cap = f'<div class="cap">{escape(t.caption)}</div>' if t.caption else ""
    src = f'<div class="src">source: <code>{escape(t.source)}</code></div>' if t.source else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{cap}{src}"


def _image(im: Image) -> str:
    data = base64.b64encode(im.png).decode("ascii")
    src = f'<div class="src">source: <code>{escape(im.source)}</code></div>' if im.source else ""
    return f'<figure><img alt="{escape(im.alt)}" src="data:image/png;base64,{data}"/>{src}</figure>'


def _block(b: Any) -> str:
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Image):
        return _image(b)
    if isinstance(b, Para):
        return f"<p>{escape(b.text)}</p>"
    if isinstance(b, Alert):
        return _alert(b.text)
    if isinstance(b, Links):
        return "<ul>" + "".join(f'<li><a href="{escape(href)}">{escape(label)}</a></li>'
                                for label, href in b.items) + "</ul>"
    raise TypeError(type(b))


def _alert(text: str) -> str:
    return f'<div class="warn" role="alert">Warning: {escape(text)}</div>'


def _section(s: Section) -> str:
    lvl = min(max(s.level, 2), 4)
    src = f'<div class="src">from <code>{escape(s.source)}</code></div>' if s.source else ""
    return (f'<section id="{escape(s.anchor)}"><h{lvl}>{escape(s.title)}</h{lvl}>{src}'
            + "".join(_block(b) for b in s.blocks) + "</section>")


def render_html(doc: Document) -> str:
    toc = "".join(f'<li><a href="#{escape(s.anchor)}">{escape(s.title)}</a></li>' for s in doc.sections
                  if s.level <= 2)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f"<title>{escape(doc.title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(doc.title)}</h1><p>{escape(doc.subtitle)}</p>" + "".join(_alert(w) for w in doc.warnings) +
            f"<nav><ul>{toc}</ul></nav>" + "".join(_section(s) for s in doc.sections) + "</body></html>\n")
