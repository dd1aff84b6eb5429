"""Every check that needs the model's shape but not its weights, run by one function before any job loads a model.

A job config declares which of its options need such a check (``PRELOAD``: field -> kind, beside ``PATH_ROLES``);
:func:`check_before_load` reads the model's depth and width from its config or GGUF header (no weights) and runs
each check, so ``--layers 99`` costs a second and one line, never a model load. The kinds:

============  ==============================================================================================
``sites``     residual sites: all | last | N | N-M | comma lists | paper[:DICTIONARY] (``memtoc extract``)
``band``      a rank-table band: default | paper | depth | all | N | N-M (``rank-table``, ``lens fit``)
``lenses``    ``NAME[=FILE]`` lenses: known names, and each file's header (format, finished, depth, width)
``corpus``    a text file or a shipped corpus name (``lens fit``)
``model``     the model itself: a local path that exists, a GGUF whose header reads
============  ==============================================================================================

A loaded backend, or a hub id with nothing local to read, gets the syntax checks only; the job checks the ranges
again on the loaded model. This module only moves refusals earlier; it decides nothing the job does not.
"""

from __future__ import annotations

from typing import Any, Callable

from memtoc.core.config import field_value
from memtoc.core.errors import MemtocError

__all__ = ["check_before_load", "preload_fields", "PreloadError", "KINDS"]

#: a stand-in depth for syntax-only checks (a hub model, or a backend given loaded)
_ANY_DEPTH = 1_000_000


class PreloadError(MemtocError):
    """An option that does not fit the model, found before its weights load (the message names the option)."""


def preload_fields(cls: type) -> dict[str, str]:
    """field -> kind of every option ``cls`` declares a pre-load check for."""
    return dict(getattr(cls, "PRELOAD", {}) or {})


def _flag(cfg: Any, field: str) -> str:
    from memtoc.core.options import leaves

    for leaf in leaves(type(cfg), cfg):
        if leaf.field == field:
            return leaf.spec.shown
    return field


def _sites(value: Any, shape: Any) -> None:
    from memtoc.backends.parts import parse_sites
    from memtoc.bench.paper_protocol import parse_paper_spec, sae_sites

    is_paper, dictionary = parse_paper_spec(value)
    if is_paper:
        if shape is not None:
            sae_sites(shape.model_type, shape.n_layers, dictionary)
        return
    parse_sites(value, shape.n_sites if shape is not None else _ANY_DEPTH)


def _band(value: Any, shape: Any) -> None:
    from probes.model import parse_sites

    if shape is not None:               # the very resolution the job makes after loading, on the config's numbers
        from probes.rank_table import resolve_band

        resolve_band(value, shape.model_type, shape.n_layers)
    elif str(value or "default").strip() not in ("default", "paper", "depth", "all"):
        parse_sites(value, _ANY_DEPTH)


def _lenses(value: Any, shape: Any, cfg: Any) -> None:
    from probes.lenses import make_lenses, parse_lens_option

    lenses = make_lenses(parse_lens_option(["logit", *(value or ())]), default_file=getattr(cfg, "lens_file", None))
    for lens in lenses:
        lens.preflight(shape.n_layers if shape is not None else None, shape.d_model if shape is not None else None)


def _corpus(value: Any, shape: Any) -> None:
    from pathlib import Path

    from probes.fit import CORPORA

    if value in (None, "") or str(value) in CORPORA:
        return
    p = Path(str(value)).expanduser()
    if not p.is_file():
        raise PreloadError(f"no such file{' (a directory)' if p.is_dir() else ''}; give a text file, one sequence "
                           f"per line, or a shipped corpus ({', '.join(CORPORA)})")


#: kind -> check(value, shape[, cfg]); ``model`` is read by :func:`check_before_load` itself
KINDS: dict[str, Callable[..., None]] = {"sites": _sites, "band": _band, "lenses": _lenses, "corpus": _corpus}


def _remote(cfg: Any) -> bool:
    """Whether ``cfg``'s model is served elsewhere (``--backend openai``): its ``--model`` names no local file."""
    from memtoc.core.backend_kinds import BACKEND_KINDS

    kind = BACKEND_KINDS.get(str(field_value(cfg, "backend", "hf")))
    return bool(kind is not None and kind.remote)


def check_before_load(cfg: Any, *, loaded: bool = False) -> Any:
    """Run every check ``cfg``'s class declares in ``PRELOAD`` against the model's shape read without weights;
    returns the shape (None: not read). ``loaded``: a backend was given loaded (its model is not ``cfg.model``'s
    spec): the checks run on the syntax alone. Raises a one-line :class:`PreloadError` naming the option."""
    declared = preload_fields(type(cfg))
    if not declared:
        return None
    shape = None
    model = field_value(cfg, "model", None)
    if not loaded and isinstance(model, str) and model and not _remote(cfg):
        from memtoc.backends.preflight import model_shape

        shape = model_shape(model)          # a missing path or a corrupt GGUF header: one line, from there
    for field, kind in declared.items():
        if kind == "model":
            continue
        value = field_value(cfg, field)
        check = KINDS[kind]
        try:
            check(value, shape, cfg) if kind == "lenses" else check(value, shape)
        except MemtocError as exc:
            shown = ",".join(value) if isinstance(value, tuple) else value
            raise PreloadError(f"{_flag(cfg, field)} {shown!r}: {exc}") from None
    return shape
