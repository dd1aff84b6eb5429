"""The lens-fit job (``memtoc lens fit``, ``mt.lens_fit``): the averaged Jacobian lens of an hf-family model on a
corpus (``probes.fit.fit_lens``), over every site or a rank-table band."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtoc.core.errors import MemtocError

__all__ = ["run_lens_fit"]


def run_lens_fit(out: str | Path, *, backend: Any = None, model: str = "default", device: str = "auto",
                 dtype: str = "float32", layers: str | None = None, corpus: str | None = None,
                 limit: int | None = None, save_dtype: str = "float32", backend_name: str = "hf",
                 **fit: Any) -> Any:
    """Fit (or resume) the lens of ``backend`` (or of ``model``, loaded on hf, as ``run_rank_table`` loads it) into
    ``out``; the lens records the model it was fitted on (``model``, or the given backend's own name).

    ``layers``: None or ``all`` = every site below the last; ``default`` = the rank table's default band (the paper's
    band of the model's family), or a band spec, so a lens fitted with it covers the table's sites. ``fit``:
    :func:`probes.fit.fit_lens`'s options (``max_seq_len``, ``skip_first``, ``mode``, ``stop_after``, ...).
    """
    import torch

    from memtoc.backends.base import InspectableBackend
    from probes.fit import fit_lens, resolve_limit
    from probes.rank_table import resolve_band

    if backend is None and backend_name != "hf":    # refused before any weights load
        raise MemtocError(f"lens fit runs on --backend hf only: it backpropagates through the model's blocks, "
                          f"which --backend {backend_name} does not expose (docs/backends.md)")
    if backend is None:
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        backend = load_backend(ModelSpec(model=model, backend="hf", device=device, dtype=dtype))
        model_name = model
    else:
        model_name = backend.provenance().get("model") or "in-memory"
    if not isinstance(backend, InspectableBackend):
        raise MemtocError(f"lens fit needs an hf-family backend (its module tree); "
                          f"{getattr(backend, 'name', type(backend).__name__)!r} has none")
    parts = backend.parts
    sites = None if layers in (None, "all") else [s for s in resolve_band(layers, parts.model_type,
                                                                           parts.n_layers)[0] if s != parts.n_layers]
    return fit_lens(parts.model, backend.tokenizer, out, corpus=corpus, model_name=model_name, sites=sites,
                    limit=resolve_limit(corpus, limit),
                    save_dtype=torch.float16 if save_dtype == "float16" else torch.float32, **fit)
