"""The code-executor family's jobs: ``memtoc codeexec evaluate`` / ``extract`` / ``table``.

``codeexec evaluate`` is the one evaluate job (:func:`memtoc.jobs.evaluate.run_evaluate`, as
``mt.evaluate(family="codeexec")``), which calls :func:`prepare_run` here first: the run protocol resolved from the
fields the user gave, the sandbox's limits and kernel isolation checked, before a model loads or a directory exists.
``codeexec extract`` is the one extract job after the same sandbox check; ``codeexec table`` reads a study's
outputs and writes the overreliance paper's table.

:func:`evaluate_codeexec`, :func:`extract_codeexec` and :func:`run_codeexec_sweep` are the family's Python entries
into the generic job bodies (``task="codeexec"``): the evaluation (:func:`memtoc.tasks.evaluation.evaluate_task`,
as :func:`memtoc.jobs.evaluate.evaluate` runs it), :func:`memtoc.jobs.extract.extract` and
:func:`memtoc.jobs.sweep.sweep`, each with the family's sandbox ``executor`` passed through.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.options import opt
from memtoc.core.values import given_fields
from memtoc.runs.result import RunResult

__all__ = ["prepare_run", "check_sandbox", "run_codeexec_extract", "CodeexecTableConfig", "TableResult",
           "run_codeexec_table", "evaluate_codeexec", "extract_codeexec", "run_codeexec_sweep"]


def _stderr(s: str) -> None:
    print(s, file=sys.stderr)


def check_sandbox(cfg: Any) -> None:
    """The sandbox limits and kernel isolation of ``cfg`` (a code-executor config) checked now, before a model
    loads or an output exists (one line naming the option; ``require_isolation``: refused without isolation)."""
    from memtoc.tasks.codeexec.sandbox import prepare_sandbox

    prepare_sandbox(timeout_s=cfg.agent.timeout_s, cpu_s=cfg.agent.cpu_s, memory_mb=cfg.agent.memory_mb,
                    require_isolation=cfg.sandbox.require_isolation)


def prepare_run(cfg: Any) -> Any:
    """A code-executor evaluation config ready to run: its run protocol resolved from the given fields
    (:func:`memtoc.core.values.given_fields`), the sandbox checked."""
    from memtoc.tasks.codeexec.run import resolve_run_protocol

    cfg = resolve_run_protocol(cfg, given_fields(cfg))
    check_sandbox(cfg)
    return cfg


def run_codeexec_extract(cfg: Any, *, backend: Any = None) -> Any:
    """``memtoc codeexec extract``: the sandbox checked, then the one extract job (the code-executor capture)."""
    from memtoc.jobs.extract import run_extract

    check_sandbox(cfg)
    return run_extract(cfg, backend=backend)


@dataclass
class CodeexecTableConfig:
    """``memtoc codeexec table``: the overreliance paper's table from a study's outputs."""
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"run": "input-path", "probe": "input-path", "sweep": "input-path",
        "sampled_sweep": "input-path", "out": "output-dir"}

    run: str = field(default="", metadata=opt("'codeexec evaluate' run directory (conditions no_tool,P0,P1,P2)",
                                              required=True, path=True))
    probe: str = field(default="", metadata=opt("'memtoc probe' output directory (probe.json)", required=True,
                                                path=True))
    sweep: str = field(default="", metadata=opt("'memtoc codeexec sweep' directory (greedy)", required=True,
                                                path=True))
    sampled_sweep: str | None = field(default=None, metadata=opt("the same sweep with sampled repetitions",
                                                                 path=True))
    band: str | None = field(default=None, metadata=opt("steering band sites (N-M); default: the edit's own sites"))
    out: str = field(default="", metadata=opt("directory for paper_table.{md,json}", required=True, path=True))


@dataclass
class TableResult:
    """The table written: ``paths`` (``json``, ``markdown``)."""

    paths: dict[str, Path]


def run_codeexec_table(cfg: CodeexecTableConfig) -> TableResult:
    """Read the run, probe and sweep outputs and write ``paper_table.{md,json}`` into ``cfg.out``."""
    from memtoc.tasks.codeexec.paper_table import PaperTableConfig, write_table

    band = None
    if cfg.band:
        from memtoc.backends.parts import parse_sites

        band = tuple(parse_sites(cfg.band, 10**6, default=None))
    paths = write_table(PaperTableConfig(run=cfg.run, probe=cfg.probe, sweep=cfg.sweep,
                                         sampled_sweep=cfg.sampled_sweep, band=band), cfg.out)
    return TableResult(paths)


def evaluate_codeexec(cfg: Any, backend: Any = None, *, formatter: Any = None, executor: Any = None,
                      edit: Any = None) -> RunResult:
    """Run (or resume) the code-executor evaluation described by ``cfg`` (a ``CodeexecRunConfig``); ``backend`` is
    loaded from ``cfg.model`` if None.

    The code-executor task through the one evaluation (:func:`memtoc.tasks.evaluation.evaluate_task` with the run
    header, as :func:`memtoc.jobs.evaluate.evaluate` runs it; the trial hooks are
    ``memtoc.tasks.codeexec.task.CodeexecEvaluation``). ``edit`` (a ``steering.edits.Edit``) is applied to every
    model turn, bound per call to the rows' first tool returns (:func:`memtoc.tasks.codeexec.agent.run_trials`);
    its spec is part of the run identity. Returns the run's :class:`memtoc.runs.result.RunResult`.
    """
    from memtoc.tasks.evaluation import evaluate_task

    options = {k: v for k, v in (("formatter", formatter), ("executor", executor)) if v is not None}
    return evaluate_task(cfg, task="codeexec", backend=backend, edit=edit, header=True, **options)[1]


def extract_codeexec(cfg: Any, *, backend: Any = None, executor: Callable[..., Any] | None = None,
                     log: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Run (or resume) the code-executor capture into ``cfg.out`` (a ``CodeexecExtractConfig``); returns counts
    and the store path.

    The code-executor task through the one extract job (:func:`memtoc.jobs.extract.extract`; the capture hooks
    are ``memtoc.tasks.codeexec.task.CodeexecExtraction``); ``executor``: the sandbox (default ``run_python``).
    """
    from memtoc.jobs.extract import extract
    from memtoc.tasks.codeexec.sandbox import run_python

    res = extract(cfg, task="codeexec", backend=backend, log=log, executor=executor or run_python)
    return {"path": res.path, "n_planned": res.n_planned, "n_new": res.n_new_episodes, "n_done": res.n_done,
            "complete": res.complete}


def run_codeexec_sweep(cfg: Any, *, backend: Any = None, edit: Any = None, executor: Any = None,
                       log: Callable[[str], None] = _stderr) -> Any:
    """Evaluate every strength of a ``CodeexecSweepConfig`` (0 always included, run first) and write the sweep
    table and plot: the code-executor task through the one sweep job (:func:`memtoc.jobs.sweep.sweep`)."""
    from memtoc.jobs.sweep import sweep

    options = {"executor": executor} if executor is not None else {}
    return sweep(cfg, task="codeexec", backend=backend, edit=edit, log=log, **options)
