"""The backend registry: what each backend kind is before it loads (name, capabilities, settings, loader).

A job config names its backend long before a model loads, and the CLI's choices, a config's refusals and a
job's defaults come from the kind: every fact about a backend needed without loading it is one
:class:`BackendKind` here, and nothing tests a backend's name. ``load_backend`` imports the kind's loader on
first use, so this module imports no backend (and no torch). A loaded backend reports what it offers now
(``backend.capabilities``); a kind's :attr:`BackendKind.capabilities` is the most a loaded one may offer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.registry import Registry

__all__ = ["GENERATE", "FORWARD", "CAPTURE", "EDITS", "PARTS", "READOUT", "ADAPTERS", "GUIDED", "ROW_EDITS",
           "TOOL_PARSERS",
           "TEXT_CAPABILITIES", "INSPECT_CAPABILITIES", "TOKEN_ROW_CAPABILITIES", "BackendKind", "UnknownBackendError",
           "BACKEND_KINDS", "BACKEND_NAMES", "register_backend_kind", "backend_kind"]

# -- capabilities ----------------------------------------------------------------------------------------------

#: What a backend can do. Code asks for a capability type (``isinstance(backend, InspectableBackend)``) or a name
#: in ``backend.capabilities``; the set is what the backend declares (reported by ``memtoc`` and checked by tests),
#: never probed with ``hasattr``.
GENERATE = "generate"            # greedy generation over conversations
FORWARD = "forward"              # a forward pass returning last-position logits
CAPTURE = "capture"              # capture options of forward (activations, lens states)
EDITS = "edits"                  # edits applied through hooks, in forward and generate
PARTS = "parts"                  # the model's parts (blocks, norm, head, sites)
READOUT = "readout"              # the final norm and output head on their own: lenses read captured states with them
ADAPTERS = "adapters"            # adapter views that never mutate the shared model
GUIDED = "guided"                # generate_guided: JSON-schema-constrained and/or sampled decoding (backends/guided.py)
ROW_EDITS = "row_edits"          # one edit with a strength per row: several strengths share one engine pass
TOOL_PARSERS = "tool_parsers"    # the engine's own tool-call parsers (``tool_call_parser(name)``: vLLM's hermes, ...)
TEXT_CAPABILITIES = frozenset({GENERATE, GUIDED})
INSPECT_CAPABILITIES = frozenset({GENERATE, FORWARD, CAPTURE, EDITS, PARTS, READOUT, ADAPTERS, GUIDED})
TOKEN_ROW_CAPABILITIES = frozenset({GENERATE, FORWARD, CAPTURE, EDITS, ROW_EDITS, READOUT, GUIDED})


class UnknownBackendError(MemtocError, ValueError):
    """A backend name nobody registered (a ``ValueError`` too, as the config checks it replaces raised)."""


@dataclass(frozen=True)
class BackendKind:
    """One backend kind: everything a job needs to know about it without loading a model.

    - ``loader``: ``"module:function"``, the function that builds the backend from a ``ModelSpec`` and the job's
      ``hooks`` keyword (whether it installs capture or edit hooks; imported on first use, so naming a backend
      loads nothing).
    - ``capabilities``: the most a loaded backend of this kind offers (see the module docstring).
    - ``default_batch_size``: prompts per call when the job does not set ``--batch-size`` (vLLM schedules its own
      batches, so it takes many).
    - ``spec_fields``: the ``ModelSpec`` fields only this kind reads (its own settings; the loader receives them).
    - ``remote``: the model is served elsewhere (``--model`` names it on the server, not on this machine).
    """

    name: str
    loader: str
    capabilities: frozenset[str]
    default_batch_size: int = 8
    spec_fields: tuple[str, ...] = ()
    help: str = ""
    #: the model runs behind an endpoint: ``--model`` is a name the server resolves, so nothing reads a local
    #: config or weights for it before loading (no shape preflight; an edit's fit is the server's to check)
    remote: bool = False

    def offers(self, capability: str) -> bool:
        """Whether a loaded backend of this kind may offer ``capability``."""
        return capability in self.capabilities

    def load_function(self) -> Callable[[Any], Any]:
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module), attr)

    def settings(self, spec: Any) -> dict[str, Any]:
        """This kind's own settings from ``spec`` (its :attr:`spec_fields`), as loader keywords."""
        return {name: getattr(spec, name) for name in self.spec_fields}


#: Every backend kind, built-ins first; ``register_backend_kind`` adds one (a plug-in registers at import).
BACKEND_KINDS: Registry[BackendKind] = Registry("backend")


def register_backend_kind(kind: BackendKind, *, replace: bool = False) -> BackendKind:
    """Register ``kind`` under ``kind.name``: its name becomes a ``--backend`` choice and ``load_backend`` loads it.
    A second, different kind under a registered name is refused unless ``replace``."""
    old = BACKEND_KINDS.get(kind.name)
    if old is not None and old != kind and not replace:
        raise ValueError(f"backend {kind.name!r} is already registered (loader {old.loader})")
    return BACKEND_KINDS.add(kind.name, kind, replace=True)


class _Names(Sequence[str]):
    """The registered backend names, read from the registry on every use (a live ``--backend`` choices list)."""

    def __getitem__(self, i: Any) -> Any:
        return BACKEND_KINDS.names()[i]

    def __len__(self) -> int:
        return len(BACKEND_KINDS.names())

    def __iter__(self) -> Iterator[str]:
        return iter(BACKEND_KINDS.names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and BACKEND_KINDS.get(name) is not None

    def __repr__(self) -> str:
        return repr(BACKEND_KINDS.names())


#: The backend names, live: the ``--backend`` choices and every check of a backend name read this one view.
BACKEND_NAMES: Sequence[str] = _Names()


def backend_kind(name: str) -> BackendKind:
    """The kind registered as ``name``, or an :class:`UnknownBackendError` naming ``--backend`` and the choices."""
    kind = BACKEND_KINDS.get(name)
    if kind is None:
        raise UnknownBackendError(f"--backend must be one of {', '.join(BACKEND_NAMES)}, not {name!r}")
    return kind


# -- the built-in kinds ----------------------------------------------------------------------------------------

register_backend_kind(BackendKind(
    name="hf", loader="memtoc.backends.factory:load_hf", capabilities=INSPECT_CAPABILITIES, default_batch_size=8,
    help="transformers, in this process: every capability but per-row edit strengths"))
register_backend_kind(BackendKind(
    name="vllm", loader="memtoc.backends.factory:load_vllm",
    capabilities=TOKEN_ROW_CAPABILITIES | {TOOL_PARSERS}, default_batch_size=256,
    spec_fields=("tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len"),
    help="vLLM; capture and edits with its engine in this process and one worker"))
register_backend_kind(BackendKind(
    name="openai", loader="memtoc.backends.endpoint:load", capabilities=frozenset({GENERATE}), default_batch_size=32,
    spec_fields=("base_url", "concurrency", "request_timeout", "request_retries"), remote=True,
    help="any OpenAI-compatible server (--base-url) through the openai client; generation only"))
