"""The compare job: paired comparison of two runs on common support (``memtoc compare``, ``mt.compare``).

Pure statistics over run directories: importing it loads neither torch nor h5py (a test checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["CompareConfig", "run_compare"]


@dataclass
class CompareConfig:
    run_a: str = ""                      # baseline run directory
    run_b: str = ""                      # treated run directory
    seed: int = 0
    layer: str = "deterministic"         # deterministic | judged
    judge_file: str = "judge.jsonl"
    output: str | None = None            # also write the comparison as JSON
    allow_partial: bool = False          # judged layer: accept a partial judge pass (unjudged keep the scorer's)


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr)


def run_compare(cfg: CompareConfig, *, backend: Any = None, edit: Any = None,
                log: Callable[[str], None] | None = None) -> Any:
    """The :class:`memtoc.scoring.metrics.Comparison` of run b against run a (written to ``cfg.output`` if set)."""
    from memtoc.core.errors import MemtocError, naming
    from memtoc.runs.runstore import RunStore
    from memtoc.scoring.judge.layer import LAYERS, compare_layer_records
    from memtoc.scoring.metrics import COMPARISON_METRICS, compare_arms, get_metric, metric_units

    if cfg.layer not in LAYERS:
        raise MemtocError(f"layer must be one of {', '.join(LAYERS)}; got {cfg.layer!r}")
    if cfg.layer == "deterministic":
        a_store, b_store = RunStore.read(cfg.run_a), RunStore.read(cfg.run_b)
        for store in (a_store, b_store):   # name the run whose records a metric cannot use
            with naming(str(store.episodes.path)):
                for m in {"retention", "correct_tool_following", *[get_metric(m).name for m in COMPARISON_METRICS]}:
                    metric_units(store.episodes.records(), m)
        a, b = a_store.episodes.records(), b_store.episodes.records()
    else:
        a, b = compare_layer_records(cfg.run_a, cfg.run_b, cfg.layer, cfg.judge_file, cfg.allow_partial)
    from memtoc.runs.run_settings import settings_warning

    warning = settings_warning(cfg.run_a, cfg.run_b)
    if warning:
        (log or _stderr)(warning)
    comp = compare_arms(a, b, seed=cfg.seed, label_a=Path(cfg.run_a).name, label_b=Path(cfg.run_b).name)
    if cfg.output:
        from memtoc.core.fileio import write_json_atomic

        write_json_atomic(cfg.output, comp.to_dict())
    return comp
