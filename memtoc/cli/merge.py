"""How ``memtoc merge`` and ``memtoc merge-activations`` show their results (the jobs: :mod:`memtoc.jobs.merge`)."""

from __future__ import annotations

from typing import Any


def present_merge(res: Any, cfg: Any) -> int:
    print(res.table_text)
    print(f"\nmerged run directory: {res.out}  ({res.n_episodes} episodes, {res.n_closed_book} closed-book records "
          f"from {res.n_sources} runs; {res.n_duplicates} duplicate records dropped; status {res.status})")
    return 0


def present_merge_activations(res: Any, cfg: Any) -> int:
    print(f"{res.out}: {res.n_episodes} episodes, {res.n_rows} rows from {res.n_sources} stores "
          f"({res.n_duplicates} duplicate episodes dropped; {'complete' if res.complete else 'INCOMPLETE'})")
    return 0 if res.complete else 1
