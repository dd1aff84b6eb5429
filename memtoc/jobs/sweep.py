"""The sweep job: what ``memtoc sweep``, ``mt.sweep(...)`` and a recipe's ``sweep`` step all call.

The family is the config's (``SweepConfig``: MemToC; ``CodeexecSweepConfig``: the code executor), so a family is
chosen one way: by the config an adapter builds.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from memtoc.tasks.memtoc.sweep import SweepConfig, SweepResult, run_sweep as _run

__all__ = ["SweepConfig", "SweepResult", "run_sweep"]


def run_sweep(cfg: Any, *, backend: Any = None, edit: Any = None, log: Callable[[str], None] | None = None,
              layer: str | None = None, judge_file: str | None = None) -> SweepResult:
    """Evaluate the edit (``edit``, else the spec ``cfg.edit``) at every strength of ``cfg`` (0 first) and write
    the sweep table, CSV and plot into ``cfg.out``. ``cfg.layer``/``cfg.judge_file`` (or ``layer``/``judge_file``):
    the judged layer beside the deterministic one (as ``metrics --score-layer``).

    ``cfg.executor`` other than ``local`` (``ray``): the strengths first run as the executor's tasks, in the waves
    of :func:`sweep_waves` (each task loads the model and the edit spec itself); this call then only assembles the
    table from their run directories. A sweep resumes under any executor (the executor is no part of its runs).
    """
    task = getattr(type(cfg), "TASK_NAME", "memtoc")
    execution = getattr(cfg, "execution", None)
    if execution is not None:
        from memtoc.jobs.executor import executor_of

        executor_of(execution)               # a bad executor name, resource or address: refused before any work
    if execution is not None and execution.executor != "local":
        from memtoc.core.values import ConfigError
        from memtoc.jobs.executor import run_waves

        if backend is not None or edit is not None:
            raise ConfigError(f"executor {execution.executor}: each task loads the model and the edit spec itself; "
                              "pass the edit as a spec path and no loaded backend (or use executor local)")
        run_waves(execution, lambda slots: sweep_waves(cfg, slots, task), label="sweep", kept="finished strengths")
    return _run(cfg, backend=backend, edit=edit, log=log or (lambda s: print(s, file=sys.stderr)),
                task=task, layer=layer or getattr(cfg, "layer", "deterministic"),
                judge_file=judge_file or getattr(cfg, "judge_file", None))


def sweep_waves(cfg: Any, slots: int, task: str | None = None) -> list[list[Any]]:
    """The executor tasks of a sweep, in waves that run one after another (``memtoc sweep --executor ray``).

    A task whose sweep solves strengths together (MemToC: one untreated closed book, strengths as rows) runs
    strength 0's closed-book pass first (wave 1), then the strengths in ``slots`` groups of about equal size,
    each group as rows of one batch on one worker, all reusing that closed book (wave 2). Other tasks: one
    task per strength, in one wave. A later :func:`run_sweep` only assembles the table.
    """
    from memtoc.core.tasks import task_of
    from memtoc.jobs.executor import WorkUnit
    from memtoc.tasks.memtoc.sweep import (strength_dir_name, sweep_closed_book, sweep_strength,
                                           sweep_strength_group, sweep_strengths)

    strengths = sweep_strengths(cfg, task)
    if not hasattr(task_of(cfg, task).sweep(cfg), "evaluate_strengths"):
        return [[WorkUnit(name=strength_dir_name(s), arm=strength_dir_name(s), fn=sweep_strength,
                          args=(cfg, s, task)) for s in strengths]]
    n = max(1, min(int(slots), len(strengths)))
    groups = [tuple(strengths[i::n]) for i in range(n)]
    name = lambda g: "strengths_" + "+".join(f"{s:g}" for s in g)  # noqa: E731
    return [[WorkUnit(name="closed_book", arm="closed_book", fn=sweep_closed_book, args=(cfg, task))],
            [WorkUnit(name=name(g), arm=name(g), fn=sweep_strength_group, args=(cfg, g, task))
             for g in groups]]
