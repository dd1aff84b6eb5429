"""``memtoc report``: one self-contained HTML page and a Markdown twin for a run or an experiment directory.

``memtoc.report.build`` collects the directory into sections (tables, plots, links, each with the file its
numbers come from); ``html`` and ``markdown`` render them; ``plots`` draws the figures.
"""

from __future__ import annotations

from typing import Any


def write_report(target: Any, out_dir: Any = None) -> Any:
    from memtoc.report.build import write_report as _write

    return _write(target, out_dir)


def add_report_parser(sub: Any) -> None:
    from memtoc.report.build import add_report_parser as _add

    _add(sub)
