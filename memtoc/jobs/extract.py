"""The extract job of every task: what ``memtoc extract``, ``mt.extract(...)`` and a recipe's ``extract`` step all
call; residual-stream activations into an HDF5 store.

What is captured is the task's (:mod:`memtoc.core.tasks`): MemToC episodes are planned by the evaluator's own planner
(same prompts as ``memtoc evaluate``, ``memtoc.tasks.memtoc.task``), the code executor's prompts end after the first
tool return (``memtoc.tasks.codeexec.task``). The items are run in batches through
``Backend.forward(prompts, capture=ResidualCapture(...))``. Every batch is moved to host memory, written and
committed before the next one starts, so peak memory is bounded by one batch and a re-run resumes after the
last committed item. Batches are committed to the store's journal and the store file is written in one piece
when the job finishes (``activations.store``: crash- and disk-full-safe).

:func:`extract` is the job body; :func:`run_extract` is the adapters' entry. What one MemToC batch captures and
writes (``capture_batch``, ``run_labels``, ``storage_dtype_for``) is the analysis library's, ``activations.batches``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from tqdm import tqdm

from activations import ActivationStoreError
from memtoc.backends.base import HookedBackend
from memtoc.bench.paper_protocol import parse_paper_spec, sae_sites
from memtoc.core.config import (CaptureSettings, ConfigError, EpisodeSelection, Intervention, JobSettings, ModelSpec,
                                composed)
from memtoc.core.errors import MemtocError
from memtoc.core.options import opt, option
from memtoc.core.runtime import GenerationConfig
from memtoc.core.tasks import task_of

__all__ = ["ExtractConfig", "ExtractResult", "extract", "run_extract"]


@composed()
@dataclass
class ExtractConfig:
    """Everything ``memtoc extract`` takes: the evaluator's pieces plus the capture's own fields.

    Identity fields decide whether an existing store can be extended.
    """
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-store", "run": "input-run", "adapter": "input-dir"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "sites"}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    selection: EpisodeSelection = field(default_factory=EpisodeSelection)
    intervention: Intervention = field(default_factory=Intervention)
    # max_new_tokens: for the ``generated`` positions (greedy, FINAL-line stop)
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(batch_size=8))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="acts.h5"))
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    compression: str | None = field(default=None, metadata=option("compression"))  # None | gzip | lzf
    compression_level: int | None = field(default=None, metadata=option("compression_level"))
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


def _load_backend(cfg: Any) -> Any:
    from memtoc.backends.factory import load_backend

    return load_backend(cfg.model_spec, hooks=True)     # capture


def _store_identity(path: str | Path) -> dict[str, Any] | None:
    """The identity an existing store recorded (None when there is no readable store at ``path``)."""
    if not Path(path).is_file():
        return None
    from activations.store import open_store

    try:
        with open_store(path) as store:
            ident = store.attrs.get("identity")
    except MemtocError:          # truncated or corrupt: said now, before the model loads (open_store's one line)
        raise
    except Exception:  # noqa: BLE001 - an unreadable store is reported by the writer when it opens it
        return None
    return ident if isinstance(ident, dict) else None


def _check_store_sites(cfg: Any, existing: dict[str, Any]) -> None:
    """An existing store's sites against ``--layers``, from the model's config alone (no weights): a store made
    with other layers is refused before the model loads, not after (the identity check after loading names
    the same field)."""
    from activations.capture import parse_layers
    from memtoc.tasks.validate import read_model_shape

    recorded = existing.get("sites")
    if recorded is None or parse_paper_spec(cfg.layers)[0]:
        return                             # the paper's band needs the model family: checked after loading
    shape = read_model_shape(cfg.model)
    if shape is None:
        return
    wanted = [int(s) for s in parse_layers(cfg.layers, shape.n_sites)]
    if wanted != [int(s) for s in recorded]:
        raise ActivationStoreError(f"{cfg.out} holds activations made with different settings (sites: "
                                   f"{list(recorded)} in the store, {wanted} now); use another --out file, or "
                                   "delete this one to start over")


def _batches(items: Sequence[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def extract(cfg: Any, *, backend: Any = None, on_batch: Callable[[int, int], None] | None = None,
            log: Callable[[str], None] = lambda s: print(s, file=sys.stderr), task: str | None = None,
            **options: Any) -> ExtractResult:
    """Run (or resume) an extraction of any task (:mod:`memtoc.core.tasks`) into ``cfg.out``.

    The shared part of every capture: the position and store checks before anything loads, the backend with a
    forward pass, sites, storage dtype, the store's identity, and the resumable loop that captures the task's
    unfinished items in batches and commits each batch before the next one starts. ``on_batch(n_batches,
    n_episodes_committed)`` is called after each committed batch (progress hooks, tests); ``options`` go to the
    task (the code executor's ``executor``).
    """
    from activations.batches import storage_dtype_for     # torch and h5py: loaded by the job, not by its --help
    from activations.capture import LayerSpecError, parse_layers
    from activations.positions import PositionSelector
    from activations.store import ActivationWriter

    selector = PositionSelector.parse(cfg.position_kinds)            # cheap checks before loading anything
    job = task_of(cfg, task).extraction(cfg, selector, **options)
    existing = _store_identity(cfg.out)
    settings = job.settings(existing)     # the identity fields known before the model loads, checked now
    diff = sorted(k for k in settings if existing is not None and existing.get(k) != settings[k])
    if diff:
        raise ActivationStoreError(f"{cfg.out} holds activations made with different settings ({', '.join(diff)}); "
                                   "use another --out file, or delete this one to start over")
    if backend is None and existing is not None:
        _check_store_sites(cfg, existing)
    backend = backend or _load_backend(cfg)
    if not isinstance(backend, HookedBackend) or "capture" not in backend.capabilities:
        raise ActivationStoreError(f"backend {getattr(backend, 'name', type(backend).__name__)!r} has no forward "
                                   "pass with capture here; use --backend hf (or vllm with an eager engine: "
                                   f"{getattr(backend, 'hook_refusal', None) or 'see docs/backends.md'})")
    info = backend.site_info
    is_paper, dictionary = parse_paper_spec(cfg.layers)
    if is_paper:             # the paper's SAE band for this model family (memtoc/data/paper_protocol.json)
        try:
            sites = sae_sites(info.model_type, info.n_layers, dictionary)
        except MemtocError as exc:
            raise LayerSpecError(str(exc)) from None
    else:
        sites = parse_layers(cfg.layers, info.n_sites)
    prov = backend.provenance()
    job.bind(backend, prov)
    storage = storage_dtype_for(cfg.store_dtype, str(prov.get("dtype")))
    identity = job.identity(prov, settings, sites, storage)
    if prov.get("backend") not in (None, "hf"):     # only then, so hf stores keep the identity they always had
        identity["backend"] = prov["backend"]
    writer = ActivationWriter.open(cfg.out, identity=identity,
                                   provenance=job.store_provenance(prov, info), sites=sites, d_model=info.d_model,
                                   storage_dtype=storage, **job.writer_options)
    items = job.items()
    n_new_eps = n_new_rows = 0
    bar = None
    try:
        todo = [it for it in items if job.key(it) not in writer.done]
        bar = tqdm(total=len(todo), desc=job.desc, unit="episode", disable=not cfg.progress, file=sys.stderr)
        for n_batch, batch in enumerate(_batches(todo, job.batch_size), 1):
            block = job.capture(backend, batch, sites, selector)
            writer.append(block)
            n_new_eps += len(batch)
            n_new_rows += block.n_rows
            bar.update(len(batch))
            if on_batch is not None:
                on_batch(n_batch, writer.n_episodes)
        n_labelled = job.write_labels(writer)
        planned = [job.key(it) for it in items]
        complete = writer.finish(planned=planned)
        n_done = len(set(planned) & writer.done)
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    if n_new_eps == 0:
        log(f"{cfg.out}: nothing left to extract ({n_done} {job.done_text})")
    return ExtractResult(path=Path(cfg.out), n_planned=len(items), n_done=n_done, n_new_episodes=n_new_eps,
                         n_new_rows=n_new_rows, complete=complete, n_labelled=n_labelled)


def run_extract(cfg: ExtractConfig, *, backend: Any = None, edit: Any = None,
                log: Callable[[str], None] | None = None) -> ExtractResult:
    """Capture (or resume capturing) the residual stream of ``cfg``'s episodes into the HDF5 store ``cfg.out``.

    ``edit``: the capture reads the untreated model, so an edit object is refused (one line) rather than ignored.
    """
    if edit is not None:
        raise ConfigError("extract reads the untreated model; it takes no edit")
    return extract(cfg, backend=backend, log=log or (lambda s: print(s, file=sys.stderr)))
