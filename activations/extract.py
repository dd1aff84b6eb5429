"""The ``memtoc extract`` job: residual-stream activations of benchmark episodes into an HDF5 store.

Episodes are planned by the evaluator's own planner (same prompts as ``memtoc evaluate``), sorted by prompt
length and run in batches through ``Backend.forward(prompts, capture=ResidualCapture(...))``. Every batch is
moved to host memory, written and committed before the next one starts, so peak memory is bounded by one
batch and a re-run resumes after the last committed episode. Batches are committed to the store's journal and
the store file is written in one piece when the job finishes (``activations.store``: crash- and disk-full-safe).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from tqdm import tqdm

import memtoc
from activations import ActivationStoreError
from activations.capture import ResidualCapture, parse_layers
from memtoc.backends.base import InspectableBackend
from activations.positions import PositionSelector
from activations.store import LABEL_COLUMNS, STORAGE, ActivationWriter, RowBlock
from memtoc.backends.base import GenerationConfig
from memtoc.benchmark import load_benchmark
from memtoc.episodes import Episode
from memtoc.config import CaptureSettings, EpisodeSelection, Intervention, JobSettings, ModelSpec, composed
from memtoc.episodes import plan_episodes
from memtoc.provenance import git_revision
from memtoc.options import option
from memtoc.prompts import load_prompt_set, prompt_identity


@composed()
@dataclass
class ExtractConfig:
    """Everything ``memtoc extract`` takes: the evaluator's pieces plus the capture's own fields.

    Identity fields decide whether an existing store can be extended.
    """

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


@dataclass
class ExtractResult:
    path: Path
    n_planned: int
    n_done: int
    n_new_episodes: int
    n_new_rows: int
    complete: bool
    n_labelled: int | None = None


def storage_dtype_for(spec: str, model_dtype: str) -> str:
    if spec == "auto":
        return model_dtype if model_dtype in STORAGE else "float32"
    if spec not in STORAGE:
        raise ActivationStoreError(f"unknown --store-dtype {spec!r}; choose auto, {', '.join(STORAGE)}")
    return spec


def run_labels(run_dir: str | Path, episodes: Sequence[Episode], provenance: Mapping[str, Any]
               ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Behaviour labels (followed_tool, kept_memory, outcome, cell) of an evaluation run, keyed by episode id.

    Refused when the run was made with another model or prompt version, or scored a different prompt for any
    episode planned here (its labels would describe another input).
    """
    from memtoc.runstore import RunStore

    store = RunStore.read(run_dir)
    info = store.run_info()
    ident = info.get("identity") or {}
    mine = (provenance.get("weights") or {}).get("sha256")
    theirs = ident.get("weights_sha256")
    if (mine and theirs and mine != theirs) or (not (mine and theirs) and ident.get("model") not in
                                                (None, provenance.get("model"))):
        raise ActivationStoreError(f"run {run_dir} was made with another model ({ident.get('model')!r}, weights "
                                   f"{str(theirs)[:12]}) than this extraction ({provenance.get('model')!r}, weights "
                                   f"{str(mine)[:12]}); its labels do not describe these activations")
    prompts = load_prompt_set()
    if ident.get("prompt_version") not in (None, prompts.prompt_version):
        raise ActivationStoreError(f"run {run_dir} used prompt version {ident.get('prompt_version')}, this "
                                   f"extraction uses {prompts.prompt_version}")
    records = {str(r["episode_id"]): r for r in store.episodes.records()}
    bad = [ep.episode_id for ep in episodes
           if ep.episode_id in records and records[ep.episode_id].get("prompt") not in (None, ep.prompt)]
    if bad:
        raise ActivationStoreError(f"run {run_dir} scored different prompts than planned here for {len(bad)} "
                                   f"episodes (e.g. {bad[0]}); check --frame, --prompt-intervention and "
                                   "--closed-book against the run's settings")
    labels = {eid: {c: rec.get(c) for c in LABEL_COLUMNS} for eid, rec in records.items()}
    source = {"run": str(Path(run_dir).resolve()), "identity_sha256": info.get("identity_sha256"),
              "n_records": len(records)}
    return labels, source


def capture_batch(backend: Any, episodes: Sequence[Episode], sites: Sequence[int], selector: PositionSelector, *,
                  max_new_tokens: int = 128, labels: Mapping[str, Mapping[str, Any]] | None = None) -> RowBlock:
    """One batch: (greedy generation if asked, then) one forward with capture -> rows ready to append."""
    prompts = [ep.prompt for ep in episodes]
    spans = [ep.tool_output_span if ep.with_tool_prompt is not None else None for ep in episodes]
    continuations = None
    if selector.needs_generation:
        gens = backend.generate(prompts, GenerationConfig(max_new_tokens=max_new_tokens))
        continuations = [list(g.token_ids) for g in gens]
    cap = ResidualCapture(sites, selector, prompts=prompts, tool_spans=spans)
    backend.forward(prompts, capture=cap, continuations=continuations)
    sel = cap.selection
    assert sel is not None
    counts = np.bincount(sel.row, minlength=len(episodes)) if len(sel) else np.zeros(len(episodes), np.int64)
    token_strs = backend.tokenizer.batch_decode([[int(t)] for t in sel.token_id]) if len(sel) else []
    eps = [episodes[int(r)] for r in sel.row]
    index: dict[str, Sequence[Any]] = {
        "episode_id": [e.episode_id for e in eps], "question_id": [e.question.id for e in eps],
        "condition": [e.condition for e in eps], "arm": [e.arm for e in eps],
        "formulation": [e.formulation for e in eps], "position_kind": [str(k) for k in sel.kind],
        "token_index": sel.token_index.astype(np.int32), "token_id": sel.token_id.astype(np.int32),
        "token_str": list(token_strs),
    }
    if labels is not None:
        from activations.store import _label_value

        for c in LABEL_COLUMNS:
            index[c] = [_label_value(c, labels.get(e.episode_id, {}).get(c)) for e in eps]
    meta = [{"episode_id": ep.episode_id, "n_rows": int(counts[i]), "n_prompt_tokens": lay.n_prompt,
             "n_generated_tokens": lay.n_tokens - lay.n_prompt}
            for i, (ep, lay) in enumerate(zip(episodes, cap.layouts))]
    return RowBlock(episodes=meta, index=index, acts={s: cap.values[s] for s in sites})


def _load_backend(cfg: ExtractConfig) -> Any:
    from memtoc.backends.factory import load_backend

    return load_backend(replace(cfg.model_spec, backend="hf"))


def _store_identity(path: str | Path) -> dict[str, Any] | None:
    """The identity an existing store recorded (None when there is no readable store at ``path``)."""
    if not Path(path).is_file():
        return None
    from activations.store import open_store

    try:
        with open_store(path) as store:
            ident = store.attrs.get("identity")
    except Exception:  # noqa: BLE001 - an unreadable store is reported by the writer when it opens it
        return None
    return ident if isinstance(ident, dict) else None


def _batches(items: Sequence[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def extract(cfg: ExtractConfig, *, backend: Any = None, on_batch: Callable[[int, int], None] | None = None,
            log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> ExtractResult:
    """Run (or resume) an extraction into ``cfg.out``.

    ``on_batch(n_batches, n_episodes_committed)`` is called after each committed batch (progress hooks, tests).
    """
    selector = PositionSelector.parse(cfg.positions)            # cheap checks before loading anything
    if cfg.batch_size < 1:
        raise ActivationStoreError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.store_dtype != "auto":
        storage_dtype_for(cfg.store_dtype, "float32")
    if cfg.compression not in (None, "none", "gzip", "lzf"):
        raise ActivationStoreError(f"unknown compression {cfg.compression!r}; choose gzip, lzf or none")
    compression = None if cfg.compression in (None, "none") else cfg.compression
    if cfg.edit:
        raise ActivationStoreError("extract captures the untreated model; 'edit' is not an extract setting")
    if cfg.max_new_tokens < 1:
        raise ActivationStoreError(f"--max-new-tokens must be at least 1, got {cfg.max_new_tokens}")
    if cfg.compression_level is not None and not 0 <= cfg.compression_level <= 9:
        raise ActivationStoreError(f"--compression-level must be 0-9, got {cfg.compression_level}")
    bench = load_benchmark(cfg.benchmark)
    episodes = plan_episodes(cfg, bench)
    prompts = load_prompt_set()
    frame = episodes[0].frame if episodes else cfg.frame
    templates = prompts.templates_sha256(frame=frame, intervention=cfg.prompt_intervention,
                                         closed_book=cfg.closed_book)
    existing = _store_identity(cfg.out)
    settings = {        # the identity fields known before the model loads, checked against an existing store now
        "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        **prompt_identity(prompts, templates, existing, where=str(cfg.out)),
        "frame": frame, "prompt_intervention": cfg.prompt_intervention, "closed_book": cfg.closed_book,
        "positions": list(selector.kinds), "max_new_tokens": cfg.max_new_tokens if selector.needs_generation else None,
    }
    diff = sorted(k for k in settings if existing is not None and existing.get(k) != settings[k])
    if diff:
        raise ActivationStoreError(f"{cfg.out} holds activations made with different settings ({', '.join(diff)}); "
                                   "use another --out file, or delete this one to start over")
    backend = backend or _load_backend(cfg)
    if not isinstance(backend, InspectableBackend):
        raise ActivationStoreError(f"backend {getattr(backend, 'name', type(backend).__name__)!r} has no forward "
                                   "pass with capture; use --backend hf")
    parts = backend.parts
    sites = parse_layers(cfg.layers, parts.n_sites)
    prov = backend.provenance()
    labels, label_source = (run_labels(cfg.run, episodes, prov) if cfg.run else (None, None))
    storage = storage_dtype_for(cfg.store_dtype, str(prov.get("dtype")))
    weights_sha = (prov.get("weights") or {}).get("sha256")
    identity = {
        "model": weights_sha or prov.get("model"), "architecture": prov.get("architecture"),
        "model_dtype": prov.get("dtype"), "chat_template_sha256": prov.get("chat_template_sha256"),
        **settings, "sites": list(sites), "storage_dtype": storage,
    }
    d_model = parts.d_model
    provenance = {
        "model_id": str(prov.get("model")), "model_source": str(prov.get("model_source")),
        "weights_sha256": str(weights_sha), "weights": prov.get("weights"),
        "architecture": str(prov.get("architecture")), "model_dtype": str(prov.get("dtype")),
        "device": str(prov.get("device")), "n_layers": int(prov.get("n_layers") or parts.n_layers),
        "chat_template_sha256": str(prov.get("chat_template_sha256")), "tokenizer": str(prov.get("tokenizer")),
        "benchmark": bench.name, "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        "prompts_sha256": prompts.sha256, "prompt_templates_sha256": templates,
        "package_version": memtoc.__version__, "git": git_revision(),
        "versions": prov.get("versions"), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.flat(), "positions": list(selector.kinds),
        "site_convention": "site 0 = embedding output (input of block 0); site s = output of block s-1; "
                           "the last site is the raw block output before the final norm",
    }
    writer = ActivationWriter.open(cfg.out, identity=identity, provenance=provenance, sites=sites,
                                   d_model=d_model, storage_dtype=storage, compression=compression,
                                   compression_opts=cfg.compression_level)
    n_new_eps = n_new_rows = 0
    bar = None
    try:
        todo = [ep for ep in sorted(episodes, key=lambda e: len(e.prompt)) if ep.episode_id not in writer.done]
        bar = tqdm(total=len(todo), desc="extract", unit="episode", disable=not cfg.progress, file=sys.stderr)
        for n_batch, batch in enumerate(_batches(todo, cfg.batch_size), 1):
            block = capture_batch(backend, batch, sites, selector, max_new_tokens=cfg.max_new_tokens, labels=labels)
            writer.append(block)
            n_new_eps += len(batch)
            n_new_rows += block.n_rows
            bar.update(len(batch))
            if on_batch is not None:
                on_batch(n_batch, writer.n_episodes)
        n_labelled = writer.write_labels(labels, source=label_source) if labels is not None else None
        complete = writer.finish(planned=[ep.episode_id for ep in episodes])
        planned_ids = {ep.episode_id for ep in episodes}
        n_done = len(planned_ids & writer.done)
    finally:
        if bar is not None:
            bar.close()
        writer.close()
    if n_new_eps == 0:
        log(f"{cfg.out}: nothing left to extract ({n_done} episodes already stored)")
    return ExtractResult(path=Path(cfg.out), n_planned=len(episodes), n_done=n_done, n_new_episodes=n_new_eps,
                         n_new_rows=n_new_rows, complete=complete, n_labelled=n_labelled)
