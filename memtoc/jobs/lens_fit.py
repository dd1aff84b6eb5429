"""The lens-fit job (``memtoc lens fit``, ``mt.lens_fit``): the averaged Jacobian lens of a loaded hf-family model
on a corpus (``probes.fit.fit_lens``), over every site or a rank-table band."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["run_lens_fit"]


def run_lens_fit(backend: Any, out: str | Path, *, layers: str | None = None, corpus: str | None = None,
                 limit: int | None = None, model_name: str = "in-memory", save_dtype: str = "float32",
                 **fit: Any) -> Any:
    """Fit (or resume) the lens of ``backend``'s model into ``out``.

    ``layers``: None or ``all`` = every site below the last; ``default`` = the rank table's default band (the paper's
    band of the model's family), or a band spec, so a lens fitted with it covers the table's sites. ``fit``:
    :func:`probes.fit.fit_lens`'s options (``max_seq_len``, ``skip_first``, ``mode``, ``stop_after``, ...).
    """
    import torch

    from probes.fit import fit_lens, resolve_limit
    from probes.rank_table import resolve_band

    parts = backend.parts
    sites = None if layers in (None, "all") else [s for s in resolve_band(layers, parts.model_type,
                                                                           parts.n_layers)[0] if s != parts.n_layers]
    return fit_lens(parts.model, backend.tokenizer, out, corpus=corpus, model_name=model_name, sites=sites,
                    limit=resolve_limit(corpus, limit),
                    save_dtype=torch.float16 if save_dtype == "float16" else torch.float32, **fit)
