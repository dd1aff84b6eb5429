"""How ``memtoc extract`` shows its result (the job: :mod:`memtoc.jobs.extract`)."""

from __future__ import annotations

from typing import Any


def present_extract(result: Any, cfg: Any) -> int:
    """One line: the store, how many planned episodes it holds, what this run added; exit 1 when incomplete."""
    state = "complete" if result.complete else "INCOMPLETE"
    print(f"{result.path}: {result.n_done}/{result.n_planned} planned episodes stored ({state}); "
          f"{result.n_new_episodes} new episodes, {result.n_new_rows} new rows"
          + (f"; labels joined for {result.n_labelled} episodes" if result.n_labelled is not None else ""))
    return 0 if result.complete else 1
