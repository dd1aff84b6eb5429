"""The extract job (``memtoc extract``, ``mt.extract``, a recipe's step): residual-stream activations of MemToC
episodes into an HDF5 store.

The episodes are the evaluator's own (same planner and prompts as ``memtoc evaluate``). Every batch is moved to
host memory and committed to the store's journal before the next one starts, so peak memory is one batch and a
re-run resumes after the last committed item; the store file is written in one piece at the end
(``activations.store``: crash- and disk-full-safe). :func:`extract` is the job body (plan, load, run, write) over
the capture library ``activations.batches``, which the code executor's capture calls too; :func:`run_extract` is
the adapters' entry.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from tqdm import tqdm

from activations import ActivationStoreError
from memtoc.bench.paper_protocol import parse_paper_spec
from memtoc.core.config import (MODEL_AS_GIVEN, CaptureSettings, ConfigError, EpisodeSelection, Intervention,
                                JobSettings, ModelSpec, flat_record)
from memtoc.core.options import here, opt, option
from memtoc.core.vocab import POSITION_KINDS
from memtoc.core.runtime import GenerationConfig

__all__ = ["ExtractConfig", "ExtractResult", "extract", "run_extract"]


@dataclass
class ExtractConfig:
    """Everything ``memtoc extract`` takes: the evaluator's pieces plus the capture's own fields.

    Identity fields decide whether an existing store can be extended.
    """
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-store", "run": "input-run", "adapter": "input-dir"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "sites"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = (*MODEL_AS_GIVEN, "edit", "stop_at_final_line", "temperature", "seed",
                                             "n_boot")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        "position_kinds": here(f"comma list of {', '.join(POSITION_KINDS)} (generated = greedy answer tokens)"),
        "max_new_tokens": here("generation budget for --position-kinds generated"),
        "closed_book": here("closed-book prompt used by no_tool episodes"),
        "dtype": here("model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16"),
        "out": here("HDF5 store (extended if it exists with the same settings)", required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    selection: EpisodeSelection = field(default_factory=EpisodeSelection)
    intervention: Intervention = field(default_factory=Intervention)
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(batch_size=8))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="acts.h5"))
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    compression: str | None = field(default=None, metadata=opt(
        "HDF5 compression of the activation datasets (gzip: smaller, slower; lzf: fast)",
        choices=("none", "gzip", "lzf"), to_field=lambda v: None if v == "none" else v))
    compression_level: int | None = field(default=None, metadata=opt("gzip level 0-9 (default 4)", low=0, high=9))
    run: str | None = field(default=None, metadata=option("run"))  # evaluation run whose labels are joined
    chunk_rows: int | None = field(default=None, metadata=opt(
        "rows per HDF5 chunk of each site's dataset (default: about 256 KiB a chunk)", low=1))


@dataclass
class ExtractResult:
    path: Path
    n_planned: int
    n_done: int
    n_new_episodes: int
    n_new_rows: int
    complete: bool
    n_labelled: int | None = None


def load_capture_backend(cfg: Any) -> Any:
    """The model of a capture job, loaded to be hooked."""
    from memtoc.backends.factory import load_backend

    return load_backend(cfg.model_spec, hooks=True)


@dataclass
class CaptureSetup:
    """What a capture job knows once its model is loaded: the backend, the sites it stores, the backend's
    provenance, the storage dtype and the store identity (the settings, the model, the sites, the dtype)."""

    backend: Any
    sites: list[int]
    prov: dict[str, Any]
    storage: str
    identity: dict[str, Any]


def open_capture(cfg: Any, existing: dict[str, Any] | None, settings: dict[str, Any],
                 backend: Any = None) -> CaptureSetup:
    """The shared middle of the capture jobs (``extract``, ``codeexec extract``): the planned settings checked
    against an existing store, the model loaded unless ``backend`` is given (the store's sites checked first, from
    the model's config alone), then its sites, storage dtype and the store identity."""
    from activations.batches import capture_sites, check_settings, model_identity, storage_dtype_for

    check_settings(cfg.job.out, existing, settings)
    if backend is None:
        check_store_sites(cfg, existing)
        backend = load_capture_backend(cfg)
    sites = capture_sites(backend, cfg.capture.layers)
    prov = backend.provenance()
    storage = storage_dtype_for(cfg.capture.store_dtype, str(prov.get("dtype")))
    identity = {**model_identity(prov), **settings, "sites": list(sites), "storage_dtype": storage}
    if prov.get("backend") not in (None, "hf"):     # only then, so hf stores keep the identity they always had
        identity["backend"] = prov["backend"]
    return CaptureSetup(backend, list(sites), prov, storage, identity)


def check_store_sites(cfg: Any, existing: dict[str, Any] | None) -> None:
    """An existing store's sites against ``--layers``, from the model's config alone (no weights): a store made
    with other layers is refused before the model loads, not after (the identity check after loading names
    the same field)."""
    from activations.capture import parse_layers
    from memtoc.tasks.validate import read_model_shape

    recorded = (existing or {}).get("sites")
    if recorded is None or parse_paper_spec(cfg.capture.layers)[0]:
        return                             # the paper's band needs the model family: checked after loading
    shape = read_model_shape(cfg.model_spec.model)
    if shape is None:
        return
    wanted = [int(s) for s in parse_layers(cfg.capture.layers, shape.n_sites)]
    if wanted != [int(s) for s in recorded]:
        raise ActivationStoreError(f"{cfg.job.out} holds activations made with different settings (sites: "
                                   f"{list(recorded)} in the store, {wanted} now); use another --out file, or "
                                   "delete this one to start over")


def check_config(cfg: ExtractConfig) -> None:
    """The settings that need no model, refused in one line before anything loads."""
    from activations.batches import storage_dtype_for

    if cfg.generation.batch_size < 1:
        raise ActivationStoreError(f"--batch-size must be at least 1, got {cfg.generation.batch_size}")
    if cfg.capture.store_dtype != "auto":
        storage_dtype_for(cfg.capture.store_dtype, "float32")
    if cfg.compression not in (None, "none", "gzip", "lzf"):
        raise ActivationStoreError(f"unknown compression {cfg.compression!r}; choose gzip, lzf or none")
    if cfg.intervention.edit:
        raise ActivationStoreError("extract captures the untreated model; 'edit' is not an extract setting")
    if cfg.generation.max_new_tokens < 1:
        raise ActivationStoreError(f"--max-new-tokens must be at least 1, got {cfg.generation.max_new_tokens}")
    if cfg.compression_level is not None and not 0 <= cfg.compression_level <= 9:
        raise ActivationStoreError(f"--compression-level must be 0-9, got {cfg.compression_level}")


def extract(cfg: ExtractConfig, *, backend: Any = None, on_batch: Callable[[int, int], None] | None = None,
            log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> ExtractResult:
    """Run (or resume) the extraction of ``cfg``'s MemToC episodes into ``cfg.out``: plan, load, run, write.
    ``on_batch(n_batches, n_episodes_committed)`` is called after each committed batch (progress hooks, tests)."""
    from activations.batches import capture_batch, run_labels, store_identity, store_provenance
    from activations.positions import PositionSelector
    from activations.store import ActivationWriter
    from memtoc.tasks.memtoc.task import capture_plan

    # plan: the episodes and the settings known before the model loads, checked against an existing store
    selector = PositionSelector.parse(cfg.capture.position_kinds)
    check_config(cfg)
    existing = store_identity(cfg.job.out)
    plan = capture_plan(cfg, selector, existing)
    # load: the model, the sites on it, its labels, the store
    setup = open_capture(cfg, existing, plan.settings, backend)
    backend, sites, prov, storage = setup.backend, setup.sites, setup.prov, setup.storage
    labels, label_source = run_labels(cfg.run, plan.episodes, prov) if cfg.run else (None, None)
    identity = {**setup.identity, "architecture": prov.get("architecture")}
    writer = ActivationWriter.open(
        cfg.job.out, identity=identity, sites=sites, d_model=backend.site_info.d_model, storage_dtype=storage,
        provenance=store_provenance(prov, backend.site_info.n_layers, flat_record(cfg), selector.kinds,
                                    **plan.provenance),
        compression=None if cfg.compression in (None, "none") else cfg.compression,
        compression_opts=cfg.compression_level, chunk_rows=cfg.chunk_rows)
    # run and write: the unfinished episodes in batches, then the labels and the store in one piece
    return write_batches(
        writer, cfg.job.out, [ep for ep in plan.episodes if ep.episode_id not in writer.done],
        cfg.generation.batch_size, lambda batch: capture_batch(
            backend, batch, sites, selector, max_new_tokens=cfg.generation.max_new_tokens, labels=labels),
        [ep.episode_id for ep in plan.episodes], desc="extract", noun="episodes", progress=cfg.job.progress, log=log,
        labels=(lambda: (labels, label_source)) if labels is not None else None, on_batch=on_batch)


def write_batches(writer: Any, out: str, todo: list[Any], batch_size: int, capture: Callable[[list[Any]], Any],
                  planned: list[str], *, desc: str, noun: str, progress: bool, log: Callable[[str], None],
                  labels: Callable[[], tuple[Any, Any]] | None = None,
                  on_batch: Callable[[int, int], None] | None = None) -> ExtractResult:
    """The extraction's run and write, shared by MemToC's and the code executor's: ``todo`` in batches, each
    captured (``capture(batch)``: its row block) and committed before the next; then ``labels()`` (labels and
    their source) when given, and the store finished in one piece; the writer closed whatever happens."""
    n_new = n_new_rows = 0
    bar = tqdm(total=len(todo), desc=desc, unit="episode", disable=not progress, file=sys.stderr)
    try:
        for n_batch, start in enumerate(range(0, len(todo), batch_size), 1):
            batch = todo[start:start + batch_size]
            block = capture(batch)
            writer.append(block)
            n_new += len(batch)
            n_new_rows += block.n_rows
            bar.update(len(batch))
            if on_batch is not None:
                on_batch(n_batch, writer.n_episodes)
        n_labelled = None
        if labels is not None:
            got, source = labels()
            n_labelled = writer.write_labels(got, source=source)
        complete = writer.finish(planned=planned)
        n_done = len(set(planned) & writer.done)
    finally:
        bar.close()
        writer.close()
    if n_new == 0:
        log(f"{out}: nothing left to extract ({n_done} {noun} already stored)")
    return ExtractResult(path=Path(out), n_planned=len(planned), n_done=n_done, n_new_episodes=n_new,
                         n_new_rows=n_new_rows, complete=complete, n_labelled=n_labelled)


def run_extract(cfg: ExtractConfig, *, backend: Any = None, edit: Any = None,
                log: Callable[[str], None] | None = None) -> ExtractResult:
    """Capture (or resume capturing) the residual stream of ``cfg``'s episodes into the HDF5 store ``cfg.out``;
    the capture reads the untreated model, so an ``edit`` is refused rather than ignored."""
    if edit is not None:
        raise ConfigError("extract reads the untreated model; it takes no edit")
    return extract(cfg, backend=backend, log=log or (lambda s: print(s, file=sys.stderr)))
