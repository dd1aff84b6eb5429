"""Scored records in and out of JSONL files: what ``score`` and ``metrics`` read and write."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

__all__ = ["read_records", "write_records"]


def read_records(path: str) -> list[dict]:
    """Scored records from a JSONL file, or from a run directory's ``episodes.jsonl`` (read only: a torn last
    line is ignored, and an interrupted run is named in a warning)."""
    from memtoc.runs.runstore import RunStore, iter_jsonl, print_warning

    p = Path(path)
    if p.is_dir():
        return RunStore.read(p).episodes.records()
    if p.name == "episodes.jsonl" and (p.parent / "run.json").is_file():
        store = RunStore.read(p.parent, warn=None)
        for w in store.state.warnings() if store.state else []:
            print_warning(w)
        return store.episodes.records()
    return list(iter_jsonl(p))


def write_records(path: str, records: Sequence[dict]) -> None:
    """``records`` as a JSONL file, written atomically (its folder made)."""
    from memtoc.core.fileio import write_jsonl_atomic

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(out, list(records))
