"""The blinded outcome annotation round (``memtoc outcome-round export|import``): a sheet of the runs' scored answers
stratified by the scorer's class, and the human labels read back as scorer-vs-human agreement (the paper's
167-response judge validation)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.options import opt
from memtoc.scoring.judge.layer import LAYERS
from memtoc.scoring.judge.store import JUDGE_FILE

__all__ = ["OutcomeExportConfig", "OutcomeImportConfig", "run_outcome_export", "run_outcome_import"]


@dataclass
class OutcomeExportConfig:
    """``memtoc outcome-round export``: a blinded sheet stratified by the scorer's class, plus its key."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"runs": "input-run", "sheet": "output", "key": "output"}

    runs: tuple[str, ...] = field(default=(), metadata=opt("run directories whose scored answers are sampled",
                                                           positional=True, nargs="+"))
    sheet: str = field(default="", metadata=opt("the blinded annotation sheet to write (CSV)", required=True,
                                                path=True))
    key: str | None = field(default=None, metadata=opt("default: SHEET with .key.json", path=True))
    per_stratum: int = field(default=35, metadata=opt(
        "answers per scorer class (5 classes; the paper labelled 167 responses)", low=1))
    score_layer: str = field(default="deterministic", metadata=opt("the scorer layer validated",
                                                                   choices=LAYERS))
    judge_file: str = field(default=JUDGE_FILE, metadata=opt("judge records file inside each run directory"))
    seed: int = field(default=0, metadata=opt("seed of the sample and the shuffled order"))


def run_outcome_export(cfg: OutcomeExportConfig) -> dict[str, Any]:
    """Write the sheet and its key (default: SHEET with ``.key.json``); returns the export's counts and ``key``."""
    from memtoc.scoring.judge.layer import load_layer
    from memtoc.scoring.judge.outcomes import export_outcome_sheet

    arms = [(Path(r).name, r, load_layer(r, cfg.score_layer, cfg.judge_file).records) for r in cfg.runs]
    key = cfg.key or str(Path(cfg.sheet).with_suffix(".key.json"))
    info = export_outcome_sheet(arms, sheet=cfg.sheet, key=key, per_stratum=cfg.per_stratum, seed=cfg.seed)
    return {**info, "key": key}


@dataclass
class OutcomeImportConfig:
    """``memtoc outcome-round import``: labels back: scorer-vs-human kappa, per-class recall, confusion table."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"key": "input", "labels": "input", "out": "output"}

    key: str = field(default="", metadata=opt("the key file written by outcome-round export", positional=True,
                                              path=True))
    labels: tuple[str, ...] = field(default=(), metadata=opt("an annotated sheet; twice for two annotators",
                                                             repeat=True, required=True))
    out: str | None = field(default=None, metadata=opt(
        "also write the agreement (kappa, per-class recall) as JSON", path=True))


def run_outcome_import(cfg: OutcomeImportConfig) -> dict[str, Any]:
    """The agreement of the labels with the scorer; also written to ``cfg.out`` (JSON) when given."""
    from memtoc.core.fileio import write_json_atomic
    from memtoc.scoring.judge.outcomes import import_outcome_labels

    res = import_outcome_labels(cfg.key, list(cfg.labels))
    if cfg.out:
        write_json_atomic(cfg.out, res)
    return res
