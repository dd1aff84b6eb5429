"""The report job: what ``memtoc report``, ``mt.report(...)`` and a recipe's report call."""

from __future__ import annotations

from typing import ClassVar

from dataclasses import dataclass, field

from memtoc.core.options import opt

__all__ = ["ReportConfig", "run_report"]


@dataclass
class ReportConfig:
    """``memtoc report``: the directory to report on and where the page goes."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"target": "input-path"}

    target: str = field(default="", metadata=opt(
        "run directory, or an experiment directory holding runs, sweeps, rank tables, probe outputs",
        positional=True, required=True, path=True))
    out: str | None = field(default=None, metadata=opt("directory for report.html / report.md (default: the target)",
                                                       path=True))


def run_report(cfg: ReportConfig):
    """One self-contained HTML page and its Markdown twin for ``cfg.target`` (:func:`~memtoc.jobs.report.build.
    write_report`); returns its :class:`~memtoc.jobs.report.build.ReportResult`."""
    from memtoc.jobs.report.build import write_report

    return write_report(cfg.target, cfg.out)
