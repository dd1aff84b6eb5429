"""``memtoc report`` (:mod:`memtoc.jobs.report.build`)."""

from __future__ import annotations

from typing import Any

from memtoc.jobs.report.build import write_report

def cmd_report(args: Any) -> int:
    from memtoc.runs.runstore import print_warning

    res = write_report(args.target, args.out)
    for w in res.warnings:
        print_warning(w)
    print(f"report written: {res.html} and {res.markdown} ({res.n_sections} sections)")
    return 0


def add_report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="one self-contained HTML page (and Markdown) for a run or experiment directory")
    p.add_argument("target", help="run directory, or an experiment directory holding runs, sweeps, rank tables, "
                   "probe outputs")
    p.add_argument("--out", default=None, help="directory for report.html / report.md (default: the target)")
    p.set_defaults(func=cmd_report)
