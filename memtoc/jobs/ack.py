"""The conflict-acknowledgment jobs (``memtoc ack car|export|import``, ``mt.ack_export``, ``mt.ack_import``): the CAR
table of several arms, a blinded, detector-stratified sheet of their answers, and the labels read back.

Each job is a config (its options, :mod:`memtoc.core.options`) and a ``run_<job>(cfg)`` that checks everything
before it reads a run or writes a file; the command line and the API only present the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.options import opt
from memtoc.scoring.judge.layer import LAYERS
from memtoc.scoring.judge.store import JUDGE_FILE

__all__ = ["AckCarConfig", "AckExportConfig", "AckImportConfig", "run_ack_car", "run_ack_export", "run_ack_import"]

_PARTIAL = ("use a judge pass that does not cover every request (the output is marked partial; unjudged episodes "
            "keep the scorer's labels)")


@dataclass
class AckCarConfig:
    """``memtoc ack car``: CAR by arm and cell (judge, regex, proxy)."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"runs": "input-run", "out": "output"}

    runs: tuple[str, ...] = field(default=(), metadata=opt("run directories (each an arm)", positional=True,
                                                           nargs="+"))
    judge_file: str = field(default=JUDGE_FILE, metadata=opt("judge records file inside each run directory"))
    allow_partial: bool = field(default=False, metadata=opt(_PARTIAL))
    out: str | None = field(default=None, metadata=opt("also write the CAR table as JSON", path=True))


def run_ack_car(cfg: AckCarConfig) -> list[dict[str, Any]]:
    """The CAR rows of every arm (all judged by the same judge); also written to ``cfg.out`` (JSON)."""
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from memtoc.scoring.judge.ack import car_table, check_distinct_runs
    from memtoc.scoring.judge.layer import load_layer, same_judge

    runs = list(cfg.runs)
    check_outputs({"--out": cfg.out}, runs)
    check_distinct_runs(runs)
    arms = [load_layer(r, "judged", cfg.judge_file, cfg.allow_partial) for r in runs]
    for r, lr in zip(runs[1:], arms[1:]):
        same_judge(arms[0], lr, runs[0], r)
    rows = car_table([(Path(r).name, lr.records) for r, lr in zip(runs, arms)])
    if cfg.out:
        write_json_atomic(cfg.out, rows)
    return rows


@dataclass
class AckExportConfig:
    """``memtoc ack export``: a blinded, flag-stratified annotation sheet (CSV) plus its key."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"runs": "input-run", "sheet": "output", "key": "output"}

    runs: tuple[str, ...] = field(default=(), metadata=opt(
        "run directories (each an arm); with --detector llm each needs memtoc judge first", positional=True,
        nargs="+"))
    sheet: str = field(default="", metadata=opt(
        "annotation sheet to write (CSV, blinded); its key goes beside it", required=True, path=True))
    key: str | None = field(default=None, metadata=opt("default: SHEET with .key.json", path=True))
    per_stratum: int = field(default=20, metadata=opt("answers per arm x detector-flag stratum", low=1))
    detector: str = field(default="llm", metadata=opt("the screening detector", choices=("llm", "regex")))
    score_layer: str = field(default="judged", metadata=opt("cells from this layer (llm: judged)",
                                                            choices=LAYERS))
    judge_file: str = field(default=JUDGE_FILE, metadata=opt("judge records file inside each run directory"))
    allow_partial: bool = field(default=False, metadata=opt(_PARTIAL))
    seed: int = field(default=0, metadata=opt("seed of the sample and the shuffled order"))


def run_ack_export(cfg: AckExportConfig) -> dict[str, Any]:
    """Write the sheet (CSV, formula-neutralised) and its key (default: SHEET with ``.key.json``); with the
    ``llm`` detector every run needs its judge pass (``memtoc judge``). Returns the export's counts, ``key`` and
    ``sheet``."""
    from memtoc.core.checks import check_positive
    from memtoc.core.fileio import check_outputs
    from memtoc.scoring.judge.ack import check_distinct_runs, export_sheet
    from memtoc.scoring.judge.layer import load_layer

    runs = list(cfg.runs)
    check_positive(cfg.per_stratum, "--per-stratum")
    check_distinct_runs(runs)
    key = cfg.key or str(Path(cfg.sheet).with_suffix(".key.json"))
    check_outputs({"--sheet": cfg.sheet, "--key": key}, runs)
    layer = "judged" if cfg.detector == "llm" else cfg.score_layer
    arms = [(Path(r).name, r, load_layer(r, layer, cfg.judge_file, cfg.allow_partial).records) for r in runs]
    info = export_sheet(arms, sheet=cfg.sheet, key=key, per_stratum=cfg.per_stratum, detector=cfg.detector,
                        seed=cfg.seed)
    return {**info, "key": key, "sheet": cfg.sheet}


@dataclass
class AckImportConfig:
    """``memtoc ack import``: labels back: kappa, detector precision/recall, two-stage prevalence."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"key": "input", "labels": "input", "out": "output"}

    key: str = field(default="", metadata=opt("the key file ack export wrote (ack.key.json)", positional=True,
                                              path=True))
    labels: tuple[str, ...] = field(default=(), metadata=opt("an annotated sheet; twice for two annotators",
                                                             repeat=True, required=True))
    out: str | None = field(default=None, metadata=opt("also write the result as JSON", path=True))
    seed: int = field(default=0, metadata=opt("seed of the prevalence intervals"))


def run_ack_import(cfg: AckImportConfig) -> dict[str, Any]:
    """Agreement, detector precision/recall and two-stage prevalence from one or two annotated sheets; also
    written to ``cfg.out`` (JSON) when given."""
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from memtoc.scoring.judge.ack import import_labels

    labels = list(cfg.labels)
    check_outputs({"--out": cfg.out}, [cfg.key, *labels])
    res = import_labels(cfg.key, labels, seed=cfg.seed)
    if cfg.out:
        write_json_atomic(cfg.out, res)
    return res
