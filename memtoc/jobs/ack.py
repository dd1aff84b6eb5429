"""The acknowledgment-annotation jobs (``memtoc ack export|import``, ``mt.ack_export``, ``mt.ack_import``): a
blinded, detector-stratified sheet of several arms' answers, and the labels read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

__all__ = ["run_ack_export", "run_ack_import"]


def run_ack_export(runs: Sequence[str], sheet: str, *, key: str | None = None, per_stratum: int = 20,
                   detector: str = "llm", layer: str = "judged", judge_file: str = "judge.jsonl",
                   allow_partial: bool = False, seed: int = 0) -> dict[str, Any]:
    """Write the sheet (CSV, formula-neutralised) and its key (default: SHEET with ``.key.json``); with the
    ``llm`` detector every run needs its judge pass (``memtoc judge``). Returns the export's counts and ``key``."""
    from memtoc.core.checks import check_positive
    from memtoc.core.fileio import check_outputs
    from memtoc.scoring.judge.ack import check_distinct_runs, export_sheet
    from memtoc.scoring.judge.layer import load_layer

    check_positive(per_stratum, "--per-stratum")
    check_distinct_runs(runs)
    key = key or str(Path(sheet).with_suffix(".key.json"))
    check_outputs({"--sheet": sheet, "--key": key}, list(runs))
    layer = "judged" if detector == "llm" else layer
    arms = [(Path(r).name, r, load_layer(r, layer, judge_file, allow_partial).records) for r in runs]
    info = export_sheet(arms, sheet=sheet, key=key, per_stratum=per_stratum, detector=detector, seed=seed)
    return {**info, "key": key, "sheet": sheet}


def run_ack_import(key: str, labels: Sequence[str], *, output: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Agreement, detector precision/recall and two-stage prevalence from one or two annotated sheets; also
    written to ``output`` (JSON) when given."""
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from memtoc.scoring.judge.ack import import_labels

    check_outputs({"--out": output}, [key, *labels])
    res = import_labels(key, list(labels), seed=seed)
    if output:
        write_json_atomic(output, res)
    return res
