"""The compare job: paired comparison of two runs on common support (``memtoc compare``, ``mt.compare``).

Pure statistics over run directories: importing it loads neither torch nor h5py (a test checks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.options import opt, option
from memtoc.jobs import stderr_line

__all__ = ["CompareConfig", "run_compare"]


@dataclass
class CompareConfig:
    """``memtoc compare``: the two runs, the layer they are read in, and the optional JSON output."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"run_a": "input-run", "run_b": "input-run", "out": "output"}

    run_a: str = field(default="", metadata=opt("baseline run directory", positional=True, required=True, path=True))
    run_b: str = field(default="", metadata=opt("treated run directory", positional=True, required=True, path=True))
    out: str | None = field(default=None, metadata=opt("also write the comparison as JSON", path=True))
    seed: int = field(default=0, metadata=option("seed"))
    score_layer: str = field(default="deterministic", metadata=opt(
        "deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run)",
        choices=("deterministic", "judged")))
    judge_file: str = field(default="judge.jsonl", metadata=opt("judge records file inside the run directory"))
    allow_partial: bool = field(default=False, metadata=opt(
        "use a judge pass that does not cover every request (the output is marked partial; unjudged episodes keep "
        "the scorer's labels)"))


def run_compare(cfg: CompareConfig, *, backend: Any = None, edit: Any = None,
                log: Callable[[str], None] | None = None) -> Any:
    """The :class:`memtoc.scoring.metrics.Comparison` of run b against run a (written to ``cfg.out`` if set; an
    output that would overwrite either run is refused before anything is read)."""
    from memtoc.core.errors import MemtocError, naming
    from memtoc.core.fileio import check_outputs
    from memtoc.runs.runstore import RunStore
    from memtoc.scoring.judge.layer import LAYERS, compare_layer_records
    from memtoc.scoring.metrics import COMPARISON_METRICS, compare_arms, get_metric, metric_units

    check_outputs({"--out": cfg.out}, [cfg.run_a, cfg.run_b])
    if cfg.score_layer not in LAYERS:
        raise MemtocError(f"layer must be one of {', '.join(LAYERS)}; got {cfg.score_layer!r}")
    if cfg.score_layer == "deterministic":
        a_store, b_store = RunStore.read(cfg.run_a), RunStore.read(cfg.run_b)
        for store in (a_store, b_store):   # name the run whose records a metric cannot use
            with naming(str(store.episodes.path)):
                for m in {"retention", "correct_tool_following", *[get_metric(m).name for m in COMPARISON_METRICS]}:
                    metric_units(store.episodes.records(), m)
        a, b = a_store.episodes.records(), b_store.episodes.records()
    else:
        a, b = compare_layer_records(cfg.run_a, cfg.run_b, cfg.score_layer, cfg.judge_file, cfg.allow_partial)
    from memtoc.runs.run_settings import settings_warning

    warning = settings_warning(cfg.run_a, cfg.run_b)
    if warning:
        (log or stderr_line)(warning)
    comp = compare_arms(a, b, seed=cfg.seed, label_a=Path(cfg.run_a).name, label_b=Path(cfg.run_b).name)
    if cfg.out:
        from memtoc.core.fileio import write_json_atomic

        write_json_atomic(cfg.out, comp.to_dict())
    return comp
