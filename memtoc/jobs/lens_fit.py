"""The lens-fit job (``memtoc lens fit``, ``mt.lens_fit``): the averaged Jacobian lens of an hf-family model on a
corpus (``probes.fit.fit_lens``), over every site or a rank-table band."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from memtoc.core.errors import MemtocError
from memtoc.core.options import DERIVATIVE_DTYPE_HELP, opt, option

__all__ = ["LensFitConfig", "run_lens_fit", "FIT_MODES"]

#: the estimators of ``probes.fit`` (``probes.fit.MODES``; named here so the parser does not import torch)
FIT_MODES = ("auto", "replicate", "vmap", "one_row")


@dataclass
class LensFitConfig:
    """``memtoc lens fit``: fit the averaged Jacobian lens of a model on a text corpus (resumable)."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "band", "corpus": "corpus"}

    model: str = field(default="default", metadata=option("model"))
    backend: str = field(default="hf", metadata=option(
        "backend", help="model runtime (hf: the fit needs gradients through the model's module tree)"))
    corpus: str | None = field(default=None, metadata=opt(
        "text file, one sequence per line, or a shipped corpus: default (probes/data/lens_corpus.txt, the default) "
        "or quick (two short lines, for smoke runs)", path=True))
    out: str = field(default="lens.safetensors", metadata=opt(
        "lens file (.safetensors); OUT.partial holds a resumable state", required=True, path=True))
    layers: str = field(default="all", metadata=opt(
        "source sites: all | default (rank-table's default band: the paper's band for the model's family) | depth | "
        "N | N-M, comma lists; s = output of block s-1, 0 = embedding output; the last site is the identity and "
        "never fitted"))
    max_seq_len: int = field(default=128, metadata=opt("tokens per corpus sequence (longer lines are cut)", low=2))
    skip_first: int = field(default=16, metadata=opt("positions left out at the start (attention sink)", low=0))
    bos: bool = field(default=True, metadata=opt("do not force a BOS token in front of each sequence"))
    batch_rows: int = field(default=32, metadata=opt("cotangents (output rows) per backward pass", low=1))
    mode: str = field(default="auto", metadata=opt(
        "estimator: auto (time a few rows of each on this device and fit with the fastest; the choice is recorded "
        "in the lens metadata), replicate (the forward replicated per cotangent, upstream jlens), vmap (one "
        "forward's backward vmapped over the cotangents) or one_row", choices=FIT_MODES))
    limit: int | None = field(default=None, metadata=option("limit", help=(
        "use only the first N corpus lines (default: 24 of the shipped default corpus, about 30 min for the default "
        "model on 2 CPU cores; every line of any other corpus; 0 = all)")))
    stop_after: int | None = field(default=None, metadata=opt(
        "process at most N lines in this call, then save the state (re-run to resume)"))
    checkpoint_seconds: float = field(default=60.0, metadata=opt(
        "save the partial fit every N seconds, so an interrupted fit resumes", low=0))
    save_dtype: str = field(default="float32", metadata=opt("dtype of the saved lens matrices",
                                                            choices=("float32", "float16")))
    progress: bool = field(default=True, metadata=option("progress"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="float32", metadata=option("dtype", help=DERIVATIVE_DTYPE_HELP))


    def __post_init__(self) -> None:
        if self.stop_after is not None:
            from memtoc.core.checks import check_int

            check_int(self.stop_after, "--stop-after")       # 0 lines per call would never fit anything


def check_lens_out(out: str) -> None:
    """An existing ``--out`` must be a lens (a finished fit is kept, a partial one resumed): any other file is
    refused before the model loads rather than found unreadable (or overwritten) after it."""
    from pathlib import Path

    path = Path(out)
    if path.is_dir():
        raise MemtocError(f"--out {out} is a directory; give the lens file's path (e.g. {out}/lens.safetensors)")
    if not path.exists():
        return
    from probes.lens import LENS_FORMAT, LensMismatchError, read_safetensors_metadata

    try:
        fmt = read_safetensors_metadata(path).get("format")
    except LensMismatchError:
        fmt = None
    if fmt != LENS_FORMAT:
        raise MemtocError(f"--out {out} exists and is not a memtoc lens file; give a new path (a finished lens there "
                          "is kept, a partial fit resumed), or delete it")


def run_lens_fit(cfg: LensFitConfig, *, backend: Any = None) -> Any:
    """Fit (or resume) the lens of ``backend`` (or of ``cfg.model``, loaded on hf) into ``cfg.out``, recording the
    model it was fitted on. ``layers``: ``all`` = every site below the last, or a rank-table band (``default``: the
    paper's band of the model's family), so the lens covers the table's sites; the other fields are
    :func:`probes.fit.fit_lens`'s options."""
    from memtoc.core.backend_kinds import PARTS, backend_kind

    if backend is None and PARTS not in backend_kind(cfg.backend).capabilities:     # before the model loads
        raise MemtocError(f"lens fit needs gradients through the model's module tree: --backend {cfg.backend} has "
                          "none; use --backend hf (the lens it writes is read by rank-table on vllm too)")
    check_lens_out(cfg.out)
    import torch

    from memtoc.backends.base import InspectableBackend
    from probes.fit import fit_lens, resolve_limit
    from probes.rank_table import resolve_band

    if backend is None:
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        backend = load_backend(ModelSpec(model=cfg.model, backend="hf", device=cfg.device, dtype=cfg.dtype))
        model_name = cfg.model
    else:
        model_name = backend.provenance().get("model") or "in-memory"
    if not isinstance(backend, InspectableBackend):
        raise MemtocError(f"lens fit needs an hf-family backend (its module tree); "
                          f"{getattr(backend, 'name', type(backend).__name__)!r} has none")
    info = backend.site_info
    layers = cfg.layers
    sites = None if layers in (None, "all") else [s for s in resolve_band(layers, info.model_type,
                                                                           info.n_layers)[0] if s != info.n_layers]
    return fit_lens(backend.parts, backend.tokenizer, cfg.out, corpus=cfg.corpus, model_name=model_name, sites=sites,
                    limit=resolve_limit(cfg.corpus, cfg.limit),
                    save_dtype=torch.float16 if cfg.save_dtype == "float16" else torch.float32,
                    max_seq_len=cfg.max_seq_len, skip_first=cfg.skip_first, force_bos=cfg.bos,
                    batch_rows=cfg.batch_rows, mode=cfg.mode, stop_after=cfg.stop_after,
                    checkpoint_seconds=cfg.checkpoint_seconds, progress=cfg.progress)
