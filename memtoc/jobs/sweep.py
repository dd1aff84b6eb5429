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
              layer: str = "deterministic", judge_file: str | None = None) -> SweepResult:
    """Evaluate the edit (``edit``, else the spec ``cfg.edit``) at every strength of ``cfg`` (0 first) and write
    the sweep table, CSV and plot into ``cfg.out``. ``layer``/``judge_file``: the judged layer beside the
    deterministic one (as ``metrics --layer``)."""
    return _run(cfg, backend=backend, edit=edit, log=log or (lambda s: print(s, file=sys.stderr)),
                task=getattr(type(cfg), "TASK_NAME", "memtoc"), layer=layer, judge_file=judge_file)
