"""The records of a run in one scoring layer: ``deterministic`` (as scored) or ``judged`` (judge rules applied).

Metrics, compare and the side-by-side table all read records through :func:`layer_records`, so every job
applies the same rules to the same judge file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtoc.core.errors import MemtocError, RunStoreError
from memtoc.scoring.judge.binding import Coverage, check_judge_file
from memtoc.scoring.judge.rules import LayerChanges, judged_records
from memtoc.scoring.judge.store import JUDGE_FILE, check_same_judge, judge_identity_of, read_judge_records

LAYERS = ("deterministic", "judged")


@dataclass
class LayerRecords:
    layer: str
    records: list[dict[str, Any]]
    judge: dict[str, Any] | None = None        # the judge identity (judged layer only)
    changes: LayerChanges = field(default_factory=LayerChanges)
    coverage: Coverage | None = None             # judged layer: the requests the judge file answers


def check_layer(layer: str) -> str:
    if layer not in LAYERS:
        raise MemtocError(f"unknown --score-layer {layer!r}; choose deterministic or judged")
    return layer


def run_dir_of(path: str | Path) -> Path:
    """A run directory, or the directory of a records file inside one."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def layer_records(records: list[dict[str, Any]], layer: str, *, run_dir: str | Path,
                  judge_file: str = JUDGE_FILE, allow_partial: bool = False) -> LayerRecords:
    """``records`` (deterministic, as scored) in the asked layer, using the judge file beside them.

    The judge file must be this run's (:func:`memtoc.scoring.judge.binding.check_judge_file`) and cover every request:
    a partial pass would leave the unjudged episodes with the scorer's labels and no sign of it, so it is
    refused unless ``allow_partial`` (then ``coverage`` says how partial, and the printouts show it)."""
    if check_layer(layer) == "deterministic":
        return LayerRecords(layer, records)
    path = Path(run_dir) / judge_file
    judge = read_judge_records(path)
    ident = judge_identity_of(judge, path)
    coverage = check_judge_file(judge, records, run_dir=run_dir, path=path)
    if coverage.partial and not allow_partial:
        raise RunStoreError(f"{path}: partial judge pass, {coverage.text()}; finish it with `memtoc judge "
                            f"{run_dir}`, or pass --allow-partial to use it (unjudged episodes keep the scorer's "
                            "labels)")
    recs, changes = judged_records(records, judge)
    return LayerRecords(layer, recs, ident, changes, coverage)


def same_judge(a: LayerRecords, b: LayerRecords, what_a: str, what_b: str) -> None:
    """An edited or fine-tuned arm is judged by the judge of its base: refuse otherwise."""
    check_same_judge(a.judge, b.judge, what_a=what_a, what_b=what_b)


def load_layer(path: str, layer: str, judge_file: str = JUDGE_FILE, allow_partial: bool = False) -> LayerRecords:
    """Records of a run directory (or a records file inside one) in a layer."""
    from memtoc.runs.runstore import RunStore, iter_jsonl

    p = Path(path)
    records = RunStore.read(p).episodes.records() if p.is_dir() else list(iter_jsonl(p))
    return layer_records(records, layer, run_dir=run_dir_of(p), judge_file=judge_file, allow_partial=allow_partial)


def compare_layer_records(run_a: str, run_b: str, layer: str, judge_file: str = JUDGE_FILE,
                          allow_partial: bool = False) -> tuple[list[dict], list[dict]]:
    """Both arms in a layer; judged arms must share one judge."""
    a, b = (load_layer(r, layer, judge_file, allow_partial) for r in (run_a, run_b))
    if layer == "judged":
        same_judge(a, b, run_a, run_b)
    return a.records, b.records
