"""The study job over run directories (``memtoc study``, ``mt.study``): load the base and arm runs in a scoring
layer, compute the study, write its files. ``layer="both"`` runs the judged study into ``out`` and the
deterministic one into ``out/deterministic``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = ["run_study_dirs"]


def run_study_dirs(base: Sequence[str | Path], arms: Sequence[str | Path] = (), *, layer: str = "judged",
                   judge_file: str | None = None, out: str | Path | None = None,
                   model_metrics: Sequence[str] | None = None, **settings: Any
                   ) -> Iterator[tuple[str, Any, str | None, list[Path]]]:
    """``(layer, study, out, written paths)`` per layer; ``settings``: :class:`StudySettings` fields."""
    from memtoc.jobs.study.analysis import MODEL_METRICS, StudySettings, run_study
    from memtoc.jobs.study.output import write_study
    from memtoc.jobs.study.runs import BASE_LABEL, load_run

    layers = ("judged", "deterministic") if layer == "both" else (layer,)
    for i, one in enumerate(layers):
        where = str(out) if out and i == 0 else (f"{out}/{one}" if out else None)
        cfg = StudySettings(layer=one, model_metrics=tuple(model_metrics or MODEL_METRICS), **settings)
        kw = {"layer": one, "judge_file": judge_file}
        bases = [dataclasses.replace(load_run(str(p), **kw), label=BASE_LABEL) for p in base]
        study = run_study(bases, [load_run(str(p), **kw) for p in arms], cfg)
        yield one, study, where, (write_study(study, where) if where else [])
