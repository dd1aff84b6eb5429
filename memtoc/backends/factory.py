"""One factory for every backend: ``load_backend(ModelSpec)``, through the backend registry
(:mod:`memtoc.core.backend_kinds`), so device/dtype/chat/adapter handling is the same for every job. An adapter
is applied as a view (``InspectableBackend.with_adapter``). The job says here whether it will install hooks
(``hooks=``), so an engine that can compile its forward (vLLM) compiles for a job that only generates and is
built eager, every refusal checked first, for one that hooks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from memtoc.backends.base import InspectableBackend, ReadoutBackend, TextBackend
from memtoc.core.backend_kinds import ADAPTERS, BACKEND_NAMES, CAPTURE, READOUT, backend_kind
from memtoc.core.errors import MemtocError
from memtoc.core.runtime import ModelSpec

if TYPE_CHECKING:
    from memtoc.backends.parts import ModelParts


def load_hf(spec: ModelSpec, *, hooks: bool = True) -> TextBackend:
    """The ``hf`` kind's loader (``memtoc.core.backend_kinds``); hooks run on every hf model, so ``hooks`` changes
    nothing here."""
    from memtoc.backends.hf import HFBackend

    return HFBackend.load(spec.model, device=spec.device, dtype=spec.dtype, chat=spec.chat_template)


def load_vllm(spec: ModelSpec, *, hooks: bool = True) -> TextBackend:
    """The ``vllm`` kind's loader: its engine settings are the kind's ``spec_fields``; ``hooks`` decides between
    an eager engine (capture and edits run) and a compiled one (generation only, CUDA graphs on a GPU)."""
    from memtoc.backends.vllm import VLLMBackend

    return VLLMBackend.load(spec.model, device=spec.device, dtype=spec.dtype, chat=spec.chat_template, hooks=hooks,
                            **backend_kind(spec.backend).settings(spec))


#: Loaded models kept by a long-lived worker process (``keep_models``): (spec without adapter, hooks) -> backend.
_KEPT: dict[tuple[ModelSpec, bool], TextBackend] | None = None
KEEP_AT_MOST = 2


def keep_models(on: bool = True) -> None:
    """Keep the models this process loads and hand the same backend to later ``load_backend`` calls with the
    same spec (adapters are still views of it). For executor workers that run many tasks (``memtoc.jobs.executor``'s
    Ray actors): the model loads once per worker, not once per task. Off by default: a script that loads a model
    twice gets two."""
    global _KEPT
    _KEPT = {} if on else None


def check_spec_fields(spec: ModelSpec) -> None:
    """Refuse, in one line and before any loader runs, a setting only other kinds read (``--tensor-parallel-size 2``
    with ``--backend hf``): it would be dropped silently and the run would not be what was asked for."""
    kind = backend_kind(spec.backend)
    defaults = ModelSpec()
    for name in BACKEND_NAMES:
        for f in backend_kind(name).spec_fields:
            value = getattr(spec, f)
            if f not in kind.spec_fields and value != getattr(defaults, f):
                raise MemtocError(f"--{f.replace('_', '-')} {value} is a setting of the {name} backend; the "
                                  f"{spec.backend} backend has no such setting (use --backend {name}, or drop it)")


def load_backend(spec: ModelSpec, *, hooks: bool = True) -> TextBackend:
    """The backend ``spec`` describes (its adapter applied as a view).

    ``hooks``: whether the job installs capture or edit hooks (extract, sweep, rank-table, an edited evaluate or
    serve). A job that only generates passes False, so an engine that compiles its forward keeps its graphs; the
    default is the engine every job can use."""
    kind = backend_kind(spec.backend)
    if spec.adapter and not kind.offers(ADAPTERS):
        views = " or ".join(n for n in BACKEND_NAMES if backend_kind(n).offers(ADAPTERS))
        raise MemtocError(f"--adapter needs a backend with adapter views (--backend {views}); the {spec.backend} "
                          "backend has none")
    check_spec_fields(spec)
    loader = kind.load_function()
    if _KEPT is None:
        backend = loader(spec, hooks=hooks)
    else:
        base = replace(spec, adapter=None)
        # one engine per model: a kept hooked engine also serves generation; a kept generation-only one gives way
        hit = next((k for k in ((base, hooks), (base, True)) if k in _KEPT), None)
        if hit is None:
            _KEPT.pop((base, False), None)
            hit, backend = (base, hooks), loader(base, hooks=hooks)
        else:
            backend = _KEPT.pop(hit)
        _KEPT[hit] = backend                        # most recently used last
        while len(_KEPT) > KEEP_AT_MOST:
            _KEPT.pop(next(iter(_KEPT)))
    if spec.adapter:
        if not isinstance(backend, InspectableBackend):  # pragma: no cover - a registered text-only loader
            raise MemtocError(f"--adapter needs a backend with adapter views; {spec.backend!r} has none")
        backend = backend.with_adapter(spec.adapter)
    return backend


def require_inspectable(backend: TextBackend, what: str) -> InspectableBackend:
    """``backend`` as an inspectable backend, or a MemtocError saying ``what`` needs one."""
    if not isinstance(backend, InspectableBackend):
        name = getattr(backend, "name", type(backend).__name__)
        raise MemtocError(f"{what} needs the hf backend (forward passes with hooks into the decoder blocks); "
                          f"the {name!r} backend offers {', '.join(sorted(getattr(backend, 'capabilities', ())))}"
                          " only; rerun with --backend hf")
    return backend


def require_readout(backend: TextBackend, what: str) -> "ModelParts":
    """The parts lenses decode with: an inspectable backend's :attr:`parts`, or a capturing backend's readout on its
    own (``readout_parts()``: final norm and head, ``ModelParts.readout_only``); else a MemtocError naming ``what``."""
    if isinstance(backend, InspectableBackend):
        return backend.parts
    caps = getattr(backend, "capabilities", ())
    if isinstance(backend, ReadoutBackend) and READOUT in caps and CAPTURE in caps:
        return backend.readout_parts()
    name = getattr(backend, "name", type(backend).__name__)
    raise MemtocError(f"{what} needs a backend that captures the residual stream and has the model's readout "
                      f"(hf, or vllm on an engine whose workers run hooks: docs/backends.md); the {name!r} backend "
                      f"offers {', '.join(sorted(caps))} only")
