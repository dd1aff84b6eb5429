"""The score job: re-score per-episode responses offline with the one scorer (``memtoc score``)."""

from __future__ import annotations

from typing import ClassVar

from collections import Counter
from dataclasses import dataclass, field

from memtoc.core.options import opt

__all__ = ["ScoreConfig", "ScoreResult", "run_score"]


@dataclass
class ScoreConfig:
    """``memtoc score``: the records to score and the file the scored records go to."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"input": "input-path", "out": "output"}

    input: str = field(default="", metadata=opt(
        "records to score (JSONL: an episodes file with raw responses, e.g. a run's episodes.jsonl)", required=True,
        path=True))
    out: str = field(default="", metadata=opt("scored records to write (JSONL)", required=True, path=True))


@dataclass
class ScoreResult:
    out: str
    records: list[dict]
    counts: dict[str, int]


def run_score(cfg: ScoreConfig) -> ScoreResult:
    """Score every record of ``cfg.input`` and write them to ``cfg.out`` (refused before reading when the output
    would overwrite the input; an empty input writes nothing)."""
    from memtoc.bench.offline import score_record
    from memtoc.core.errors import MemtocError
    from memtoc.core.fileio import check_outputs
    from memtoc.jobs.records import read_records, write_records

    check_outputs({"--out": cfg.out}, [cfg.input])
    records = read_records(cfg.input)
    if not records:
        raise MemtocError(f"{cfg.input}: no records to score; {cfg.out} was not written")
    scored = [score_record(r, row=i, path=cfg.input) for i, r in enumerate(records, 1)]
    write_records(cfg.out, scored)
    return ScoreResult(cfg.out, scored, dict(Counter(r["outcome"] for r in scored)))
