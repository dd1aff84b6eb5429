"""The code-executor family's jobs: ``memtoc codeexec evaluate`` / ``extract`` / ``sweep`` / ``table``.

``codeexec evaluate`` is the one evaluate job (:func:`memtoc.jobs.evaluate.run_evaluate`), which calls
:func:`prepare_run` here first: the run protocol resolved and the sandbox checked before a model loads or a
directory exists. :func:`evaluate_codeexec` is the family's Python entry into the one evaluation;
:func:`capture_codeexec` and :func:`run_codeexec_sweep` are the family's job bodies over the capture library
(``activations.batches``) and the sweep library (``memtoc.jobs.sweep``) the MemToC bodies call too; each takes the
family's sandbox ``executor``. ``codeexec table`` writes the overreliance paper's table from a study's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.config import flat_record
from memtoc.core.options import opt
from memtoc.jobs import stderr_line
from memtoc.runs.result import RunResult

__all__ = ["prepare_run", "check_sandbox", "run_codeexec_extract", "capture_codeexec", "CodeexecTableConfig",
           "TableResult", "run_codeexec_table", "evaluate_codeexec", "extract_codeexec", "run_codeexec_sweep"]


def check_sandbox(cfg: Any) -> None:
    """The sandbox limits and kernel isolation of ``cfg`` (a code-executor config) checked now, before a model
    loads or an output exists (one line naming the option; ``require_isolation``: refused without isolation)."""
    from memtoc.tasks.codeexec.sandbox import prepare_sandbox

    prepare_sandbox(timeout_s=cfg.agent.timeout_s, cpu_s=cfg.agent.cpu_s, memory_mb=cfg.agent.memory_mb,
                    require_isolation=cfg.sandbox.require_isolation)


def prepare_run(cfg: Any) -> Any:
    """A code-executor evaluation config ready to run: its run protocol resolved (the fields not given, None,
    take the protocol's value, else the ordinary default), the sandbox checked."""
    from memtoc.tasks.codeexec.run import resolve_run_protocol

    cfg = resolve_run_protocol(cfg)
    check_sandbox(cfg)
    return cfg


def run_codeexec_extract(cfg: Any, *, backend: Any = None, edit: Any = None,
                         log: Callable[[str], None] | None = None) -> Any:
    """``memtoc codeexec extract``: the sandbox checked, then the capture (:func:`capture_codeexec`)."""
    from memtoc.core.config import ConfigError

    if edit is not None:
        raise ConfigError("extract reads the untreated model; it takes no edit")
    check_sandbox(cfg)
    return capture_codeexec(cfg, backend=backend, log=log or stderr_line)


@dataclass
class CodeexecTableConfig:
    """``memtoc codeexec table``: the overreliance paper's table from a study's outputs."""
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
    """Run (or resume) the code-executor evaluation of ``cfg`` (a ``CodeexecRunConfig``) through the one
    evaluation, as :func:`memtoc.jobs.evaluate.evaluate` runs it; ``backend`` is loaded from ``cfg.model`` if None.
    ``edit`` is applied to every model turn, bound per call to the rows' first tool returns; its spec is part of
    the run identity."""
    from memtoc.tasks.evaluation import evaluate_task

    options = {k: v for k, v in (("formatter", formatter), ("executor", executor)) if v is not None}
    return evaluate_task(cfg, task="codeexec", backend=backend, edit=edit, header=True, **options)[1]


def extract_codeexec(cfg: Any, *, backend: Any = None, executor: Callable[..., Any] | None = None,
                     log: Callable[[str], None] = stderr_line) -> dict[str, Any]:
    """Run (or resume) the code-executor capture into ``cfg.out`` (a ``CodeexecExtractConfig``); returns counts
    and the store path (:func:`capture_codeexec`'s result as a dict); ``executor``: the sandbox (default
    ``run_python``)."""
    res = capture_codeexec(cfg, backend=backend, executor=executor, log=log)
    return {"path": res.path, "n_planned": res.n_planned, "n_new": res.n_new_episodes, "n_done": res.n_done,
            "complete": res.complete}


def capture_codeexec(cfg: Any, *, backend: Any = None, executor: Callable[..., Any] | None = None,
                     log: Callable[[str], None] = stderr_line) -> Any:
    """The residual stream after the first tool return of every problem x condition (``--run``: of the run's own
    trajectories) into ``cfg.out``: plan, load, run, write, as :func:`memtoc.jobs.extract.extract` does for MemToC
    episodes and with the same capture library. Returns its :class:`memtoc.jobs.extract.ExtractResult`."""
    from activations import ActivationStoreError
    from activations.batches import store_identity, store_provenance
    from activations.positions import PositionSelector
    from activations.store import ActivationWriter
    from memtoc.jobs.extract import open_capture, write_batches
    from memtoc.tasks.codeexec.agent import formatter_for
    from memtoc.tasks.codeexec.capture import (batch_prompts, capture_block, capture_plan, run_once_per_code,
                                               trajectory_labels)
    from memtoc.tasks.codeexec.sandbox import run_python

    # plan: the items and the settings known before the model loads, checked against an existing store
    selector = PositionSelector.parse(cfg.capture.position_kinds)
    plan = capture_plan(cfg, selector)
    existing = store_identity(cfg.job.out)
    # load: the model, the sites on it, the conversation format (the run's own with --run, from the same weights)
    setup = open_capture(cfg, existing, plan.settings, backend)
    backend, sites, prov, storage = setup.backend, setup.sites, setup.prov, setup.storage
    if plan.source is not None:
        want = ((plan.source.get("provenance") or {}).get("weights") or {}).get("sha256")
        have = (prov.get("weights") or {}).get("sha256")
        if want and have and want != have:
            raise ActivationStoreError(f"--run {cfg.run} was generated by other weights (sha256 {want[:12]}...) than "
                                       f"the model loaded now ({have[:12]}...); activations must come from the "
                                       "model that produced the trajectories")
    fmt = formatter_for(backend, cfg.agent.call_format if plan.source is None else
                        str(plan.source.get("protocol") or "auto"))
    identity = {**setup.identity, "family": "codeexec", "protocol": fmt.protocol}
    point = ("the final prompt token after the first tool return of the run's own trajectories"
             if plan.source is not None else "the final prompt token after the first (scripted) tool return")
    writer = ActivationWriter.open(
        cfg.job.out, identity=identity, sites=sites, d_model=backend.site_info.d_model, storage_dtype=storage,
        provenance=store_provenance(prov, backend.site_info.n_layers, flat_record(cfg), selector.kinds,
                                    benchmark="codeexec", capture_point=point, site_convention=(
                                        "site 0 = embedding output (input of block 0); site s = output of block s-1")))
    # run and write: the unfinished items in batches, then the labels of --run and the store in one piece
    run = run_once_per_code(executor or run_python)       # each distinct scripted call runs once
    return write_batches(
        writer, cfg.job.out, [it for it, key in zip(plan.items, plan.keys) if key not in writer.done],
        cfg.agent.batch_size, lambda batch: capture_block(
            backend, batch_prompts(plan, batch, fmt, cfg.agent, run), sites, selector),
        plan.keys, desc="codeexec extract", noun="prompts", progress=cfg.job.progress, log=log,
        labels=(lambda: trajectory_labels(plan, cfg.run)) if plan.source is not None else None)


def run_codeexec_sweep(cfg: Any, *, backend: Any = None, edit: Any = None, executor: Any = None,
                       log: Callable[[str], None] = stderr_line) -> Any:
    """``memtoc codeexec sweep`` from Python: :func:`memtoc.jobs.sweep.sweep_codeexec` (the family's sweep body)."""
    from memtoc.jobs.sweep import sweep_codeexec

    return sweep_codeexec(cfg, backend=backend, edit=edit, executor=executor, log=log)
