"""The capture library the extract jobs call: check an existing store, pick the sites, capture a batch, describe
the store (:func:`store_identity`, :func:`check_settings`, :func:`capture_sites`, :func:`storage_dtype_for`,
:func:`store_provenance`, :func:`capture_batch`, :func:`run_labels`).

The job bodies that call them are :func:`memtoc.jobs.extract.extract` (MemToC) and
:func:`memtoc.jobs.codeexec.extract_codeexec` (the code executor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from activations import ActivationStoreError
from activations.capture import ResidualCapture
from activations.positions import PositionSelector
from activations.store import LABEL_COLUMNS, STORAGE, RowBlock
from memtoc.backends.base import HookedBackend
from memtoc.bench.episodes import Episode
from memtoc.bench.paper_protocol import parse_paper_spec, sae_sites
from memtoc.bench.prompts import load_prompt_set
from memtoc.core.errors import MemtocError
from memtoc.core.runtime import GenerationConfig

SITE_CONVENTION = ("site 0 = embedding output (input of block 0); site s = output of block s-1; the last site is "
                   "the raw block output before the final norm")


def store_identity(path: str | Path) -> dict[str, Any] | None:
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


def check_settings(path: str | Path, existing: Mapping[str, Any] | None, settings: Mapping[str, Any]) -> None:
    """Refuse to extend a store whose recorded identity differs from ``settings`` (the fields known before the
    model loads) in any field; the message names the fields."""
    diff = sorted(k for k in settings if existing is not None and existing.get(k) != settings[k])
    if diff:
        raise ActivationStoreError(f"{path} holds activations made with different settings ({', '.join(diff)}); "
                                   "use another --out file, or delete this one to start over")


def capture_sites(backend: Any, layers: str) -> list[int]:
    """The sites ``layers`` names on ``backend``, refused (one line) when the backend cannot capture.

    ``paper`` (or ``paper:<dictionary>``) is the paper's SAE band of the model family
    (``memtoc/data/paper_protocol.json``); anything else is :func:`activations.capture.parse_layers`.
    """
    from activations.capture import LayerSpecError, parse_layers

    if not isinstance(backend, HookedBackend) or "capture" not in backend.capabilities:
        raise ActivationStoreError(f"backend {getattr(backend, 'name', type(backend).__name__)!r} has no forward "
                                   "pass with capture here; use --backend hf (or vllm with an eager engine: "
                                   f"{getattr(backend, 'hook_refusal', None) or 'see docs/backends.md'})")
    info = backend.site_info
    is_paper, dictionary = parse_paper_spec(layers)
    if not is_paper:
        return parse_layers(layers, info.n_sites)
    try:
        return sae_sites(info.model_type, info.n_layers, dictionary)
    except MemtocError as exc:
        raise LayerSpecError(str(exc)) from None


def model_identity(prov: Mapping[str, Any]) -> dict[str, Any]:
    """The model's part of a store identity: its weights' hash (else its id), chat template and dtype."""
    return {"model": (prov.get("weights") or {}).get("sha256") or prov.get("model"),
            "chat_template_sha256": prov.get("chat_template_sha256"), "model_dtype": prov.get("dtype")}


def store_provenance(prov: Mapping[str, Any], n_layers: int, config: Mapping[str, Any], positions: Sequence[str],
                     **extra: Any) -> dict[str, Any]:
    """The store's provenance attributes: the model's (``prov``: ``Backend.provenance()``), the package's, the job's
    ``config`` and ``positions``, then the family's ``extra`` (its benchmark, prompts, capture point)."""
    import time

    import memtoc
    from memtoc.core.provenance import git_revision

    return {
        "model_id": str(prov.get("model")), "model_source": str(prov.get("model_source")),
        "weights_sha256": str((prov.get("weights") or {}).get("sha256")), "weights": prov.get("weights"),
        "architecture": str(prov.get("architecture")), "model_dtype": str(prov.get("dtype")),
        "device": str(prov.get("device")), "n_layers": int(prov.get("n_layers") or n_layers),
        "chat_template_sha256": str(prov.get("chat_template_sha256")), "tokenizer": str(prov.get("tokenizer")),
        "package_version": memtoc.__version__, "git": git_revision(),
        "versions": prov.get("versions"), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": dict(config), "positions": list(positions), "site_convention": SITE_CONVENTION, **extra,
    }


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
    from memtoc.runs.runstore import RunStore

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
    return captured_rows(backend, cap, [{"episode_id": e.episode_id, "question_id": e.question.id,
                                         "condition": e.condition, "arm": e.arm, "formulation": e.formulation}
                                        for e in episodes], labels=labels)


def captured_rows(backend: Any, cap: ResidualCapture, items: Sequence[Mapping[str, Any]], *,
                  labels: Mapping[str, Mapping[str, Any]] | None = None) -> RowBlock:
    """The rows ``cap`` selected in the forward just run over ``items`` (in prompt order, each its index columns
    ``episode_id``, ``question_id``, ``condition``, ``arm``, ``formulation``), ready to append; ``labels``: the
    behaviour columns by episode id."""
    sel = cap.selection
    assert sel is not None
    counts = np.bincount(sel.row, minlength=len(items)) if len(sel) else np.zeros(len(items), np.int64)
    rows = [items[int(r)] for r in sel.row]
    index: dict[str, Sequence[Any]] = {c: [it[c] for it in rows] for c in
                                       ("episode_id", "question_id", "condition", "arm", "formulation")}
    index.update(position_kind=[str(k) for k in sel.kind], token_index=sel.token_index.astype(np.int32),
                 token_id=sel.token_id.astype(np.int32),
                 token_str=backend.tokenizer.batch_decode([[int(t)] for t in sel.token_id]) if len(sel) else [])
    if labels is not None:
        from activations.store import label_cell

        for c in LABEL_COLUMNS:
            index[c] = [label_cell(c, labels.get(it["episode_id"], {}).get(c)) for it in rows]
    meta = [{"episode_id": it["episode_id"], "n_rows": int(counts[i]), "n_prompt_tokens": lay.n_prompt,
             "n_generated_tokens": lay.n_tokens - lay.n_prompt} for i, (it, lay) in enumerate(zip(items, cap.layouts))]
    return RowBlock(episodes=meta, index=index, acts={s: cap.values[s] for s in cap.sites})
