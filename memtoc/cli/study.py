"""How ``memtoc study`` shows its result (the job: :mod:`memtoc.jobs.study.run`)."""

from __future__ import annotations

from typing import Any


def present_study(res: Any, cfg: Any) -> int:
    """Each layer's study as Markdown, then where it was written."""
    from memtoc.jobs.study.output import format_markdown

    for one in res.layers:
        print(format_markdown(one.study))
        if one.out:
            print(f"wrote {len(one.paths)} files to {one.out}")
    return 0
