"""The records of a run in one scoring layer: ``deterministic`` (as scored) or ``judged`` (judge rules applied).

Metrics, compare and the side-by-side table all read records through :func:`layer_records`, so every job
applies the same rules to the same judge file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtoc.core.errors import MemtocError
from memtoc.scoring.judge.rules import LayerChanges, judged_records
from memtoc.scoring.judge.store import JUDGE_FILE, check_same_judge, judge_identity_of, read_judge_records

LAYERS = ("deterministic", "judged")


@dataclass
class LayerRecords:
    layer: str
    records: list[dict[str, Any]]
    judge: dict[str, Any] | None = None        # the judge identity (judged layer only)
    changes: LayerChanges = field(default_factory=LayerChanges)


def check_layer(layer: str) -> str:
    if layer not in LAYERS:
        raise MemtocError(f"unknown --layer {layer!r}; choose deterministic or judged")
    return layer


def run_dir_of(path: str | Path) -> Path:
    """A run directory, or the directory of a records file inside one."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def layer_records(records: list[dict[str, Any]], layer: str, *, run_dir: str | Path,
                  judge_file: str = JUDGE_FILE) -> LayerRecords:
    """``records`` (deterministic, as scored) in the asked layer, using the judge file beside them."""
    if check_layer(layer) == "deterministic":
        return LayerRecords(layer, records)
    path = Path(run_dir) / judge_file
    judge = read_judge_records(path)
    ident = judge_identity_of(judge, path)
    recs, changes = judged_records(records, judge)
    return LayerRecords(layer, recs, ident, changes)


def same_judge(a: LayerRecords, b: LayerRecords, what_a: str, what_b: str) -> None:
    """An edited or fine-tuned arm is judged by the judge of its base: refuse otherwise."""
    check_same_judge(a.judge, b.judge, what_a=what_a, what_b=what_b)
