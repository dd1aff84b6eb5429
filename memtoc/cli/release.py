"""How ``memtoc verify-release`` shows its result (the job: :mod:`memtoc.jobs.release_verify`)."""

from __future__ import annotations

from typing import Any


def present_verify_release(rep: Any, cfg: Any) -> int:
    """The report; the exit status says whether every value matched (0), some differ (1) or none compared (2)."""
    from memtoc.jobs.release_verify import exit_status, format_report

    print(format_report(rep))
    return exit_status(rep)
