"""How ``memtoc report`` shows its result (the job: :mod:`memtoc.jobs.report.job`)."""

from __future__ import annotations

from typing import Any


def present_report(res: Any, cfg: Any) -> int:
    from memtoc.runs.runstore import print_warning

    for w in res.warnings:
        print_warning(w)
    print(f"report written: {res.html} and {res.markdown} ({res.n_sections} sections)")
    return 0
