"""The metrics job: the metric table (per formulation and pooled, with intervals) of scored records, in the
deterministic scorer's layer, the judged layer, or both side by side (``memtoc metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.options import opt, option

__all__ = ["MetricsConfig", "MetricsResult", "run_metrics"]

#: the scorer layers a metric table is read in (memtoc.scoring.judge.layer.LAYERS), plus both side by side
SCORE_LAYERS = ("deterministic", "judged", "both")


@dataclass
class MetricsConfig:
    """``memtoc metrics``: the records (a run directory, or ``--input`` records), the layer, the intervals."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"run": "input-run", "input": "input-path", "out": "output"}

    run: str | None = field(default=None, metadata=opt("a run directory (instead of --input)", positional=True,
                                                       nargs="?", path=True))
    input: str | None = field(default=None, metadata=opt(
        "scored records (memtoc score output or a run's episodes.jsonl)", path=True))
    out: str | None = field(default=None, metadata=opt("also write the table as JSON", path=True))
    n_boot: int = field(default=1000, metadata=option("n_boot"))
    seed: int = field(default=0, metadata=option("seed"))
    score_layer: str = field(default="deterministic", metadata=opt(
        "deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run); both = side by side "
        "with the difference", choices=SCORE_LAYERS))
    judge_file: str = field(default="judge.jsonl", metadata=opt("judge records file inside the run directory"))
    allow_partial: bool = field(default=False, metadata=opt(
        "use a judge pass that does not cover every request (the output is marked partial; unjudged episodes keep "
        "the scorer's labels)"))


@dataclass
class JudgedLayer:
    """What the judged layer adds to its table: the judge, the label changes, coverage and the CAR table."""

    judge: dict[str, Any]
    changes: dict[str, Any]
    partial_text: str | None
    car: list[dict[str, Any]]


@dataclass
class MetricsResult:
    layer: str                       # deterministic | judged | both
    tables: dict[str, Any]           # layer -> memtoc.scoring.metrics.MetricTable
    judged: JudgedLayer | None
    doc: Any                         # what --out holds


def run_metrics(cfg: MetricsConfig) -> MetricsResult:
    """The metric table(s) of ``cfg``, written to ``cfg.out`` when set."""
    from memtoc.core.checks import check_n_boot
    from memtoc.core.errors import MemtocError, naming
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from memtoc.scoring.metrics import metric_table

    check_outputs({"--out": cfg.out}, [cfg.run, cfg.input])
    check_n_boot(cfg.n_boot)
    if cfg.score_layer not in SCORE_LAYERS:
        raise MemtocError(f"--score-layer must be one of {', '.join(SCORE_LAYERS)}; got {cfg.score_layer!r}")
    if cfg.run is None and cfg.input is not None and cfg.score_layer == "deterministic":
        from memtoc.jobs.records import read_records

        records = read_records(cfg.input)
        with naming(cfg.input):
            table = metric_table(records, n_boot=cfg.n_boot, seed=cfg.seed)
        result = MetricsResult("deterministic", {"deterministic": table}, None, table.to_dict())
    else:
        result = _layered(cfg)
    if cfg.out:
        write_json_atomic(cfg.out, result.doc)
    return result


def _layered(cfg: MetricsConfig) -> MetricsResult:
    """The table of a run directory (or records file) in a layer, or in both."""
    from memtoc.core.errors import MemtocError
    from memtoc.scoring.judge.ack import car_table
    from memtoc.scoring.judge.layer import LAYERS, load_layer, run_dir_of
    from memtoc.scoring.metrics import metric_table

    src = cfg.run or cfg.input
    if src is None:
        raise MemtocError("give a run directory or --input records")
    layers = LAYERS if cfg.score_layer == "both" else (cfg.score_layer,)
    tables, out, judged = {}, {}, None
    for layer in layers:
        lr = load_layer(src, layer, cfg.judge_file, cfg.allow_partial)
        tables[layer] = metric_table(lr.records, n_boot=cfg.n_boot, seed=cfg.seed)
        out[layer] = {"metrics": tables[layer].to_dict()}
        if layer == "judged":
            out[layer].update(judge=lr.judge, changes=lr.changes.to_dict(),
                              coverage=lr.coverage.to_dict() if lr.coverage else None)
            rows = car_table([(Path(run_dir_of(src)).name, lr.records)])
            out[layer]["car"] = rows
            partial = lr.coverage.text() if lr.coverage is not None and lr.coverage.partial else None
            judged = JudgedLayer(lr.judge or {}, lr.changes.to_dict(), partial, rows)
    doc = out if cfg.score_layer == "both" else out["deterministic"]["metrics"] if cfg.score_layer == "deterministic" \
        else out["judged"]
    return MetricsResult(cfg.score_layer, tables, judged, doc)
