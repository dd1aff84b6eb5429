"""The code-executor family's jobs: ``memtoc codeexec evaluate`` / ``extract`` / ``table``.

``codeexec evaluate`` is the one evaluate job (:func:`memtoc.jobs.evaluate.run_evaluate`, as
``mt.evaluate(family="codeexec")``), which calls :func:`prepare_run` here first: the run protocol resolved from the
fields the user gave, the sandbox's limits and kernel isolation checked, before a model loads or a directory exists.
``codeexec extract`` is the one extract job after the same sandbox check; ``codeexec table`` reads a study's
outputs and writes the overreliance paper's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.options import opt
from memtoc.core.values import given_fields

__all__ = ["prepare_run", "check_sandbox", "run_codeexec_extract", "CodeexecTableConfig", "TableResult",
           "run_codeexec_table"]


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
