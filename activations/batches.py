"""What one batch of a MemToC extraction captures and writes: the library the extract job's MemToC task calls.

- :func:`capture_batch`: a batch of episodes (greedy generation first if the positions need it) through one
  ``Backend.forward`` with a :class:`activations.capture.ResidualCapture`, turned into rows ready to append
  (:class:`activations.store.RowBlock`);
- :func:`run_labels`: the behaviour labels of an evaluation run, keyed by episode id, refused when the run
  describes another model or other prompts;
- :func:`storage_dtype_for`: the dtype the store keeps (``--store-dtype``).

The job that runs them (store identity, resume, the batch loop) is :func:`memtoc.jobs.extract.extract`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from activations import ActivationStoreError
from activations.capture import ResidualCapture
from activations.positions import PositionSelector
from activations.store import LABEL_COLUMNS, STORAGE, RowBlock
from memtoc.bench.episodes import Episode
from memtoc.bench.prompts import load_prompt_set
from memtoc.core.runtime import GenerationConfig


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
        from activations.store import label_cell

        for c in LABEL_COLUMNS:
            index[c] = [label_cell(c, labels.get(e.episode_id, {}).get(c)) for e in eps]
    meta = [{"episode_id": ep.episode_id, "n_rows": int(counts[i]), "n_prompt_tokens": lay.n_prompt,
             "n_generated_tokens": lay.n_tokens - lay.n_prompt}
            for i, (ep, lay) in enumerate(zip(episodes, cap.layouts))]
    return RowBlock(episodes=meta, index=index, acts={s: cap.values[s] for s in sites})
