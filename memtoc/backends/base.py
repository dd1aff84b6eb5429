"""The backend seam: every model call of the toolkit goes through ``generate`` or ``forward``.

Capability types are protocols (:class:`TextBackend`, :class:`HookedBackend`, :class:`InspectableBackend`,
:class:`TokenRowBackend`, ...); code asks ``isinstance(backend, HookedBackend)`` (or the narrower type) for what
it needs. Capability names and backend kinds are :mod:`memtoc.core.backend_kinds`.

Capture (activations/) and edits (steering/) are options of these calls, never separate pipelines, so an edited or
inspected model is evaluated by the same code path and the same scorer as the untreated one; they say what
(``memtoc.backends.plans``) and each backend's ``intervene`` says how.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

from memtoc.backends.chat import Conversation
from memtoc.core.answer_line import FINAL_MARKER_RE, QUOTE_CHARS
from memtoc.core.errors import MemtocError
from memtoc.core.runtime import GenerationConfig

if TYPE_CHECKING:  # torch types in annotations only: importing the seam (and every config naming it) loads no torch
    from memtoc.backends.parts import ModelParts
    from memtoc.backends.tokens import TokenBatch


@dataclass(frozen=True)
class Generation:
    """One greedy answer. ``text`` is cut right after the completed FINAL line when stopping applies."""

    text: str
    n_prompt_tokens: int
    n_new_tokens: int
    stop_reason: str   # "final_line" | "eos" | "max_tokens"
    token_ids: tuple[int, ...] = field(default=(), repr=False)


def final_line_end(text: str) -> int | None:
    """Index just past the newline that completes the first (unquoted) FINAL answer line, else None (every
    backend cuts its decoded output here, so they agree on the same tokens)."""
    for m in FINAL_MARKER_RE.finditer(text):
        if m.start() > 0 and text[m.start() - 1] in QUOTE_CHARS:
            continue  # a mention of the instruction, not an answer
        rest = text[m.end():]  # the marker regex consumed leading whitespace and newlines
        if not rest:
            return None
        nl = rest.find("\n")
        return None if nl < 0 else m.end() + nl + 1
    return None


def cut_at_final_line(text: str) -> tuple[str, bool]:
    end = final_line_end(text)
    return (text, False) if end is None else (text[:end], True)


def trim_ids_to_text(tokenizer: Any, ids: list[int], text: str) -> list[int]:
    """Shortest prefix of ``ids`` whose decoding covers ``text`` (the tokens that produced the kept answer)."""
    for k in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= len(text):
            return ids[:k]
    return ids


@dataclass(frozen=True)
class SiteInfo:
    """The residual sites of a hooked backend's model, whatever its module tree (``memtoc.backends.parts``
    numbering): what capture and edits size themselves by."""

    n_layers: int
    d_model: int
    model_type: str
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def n_sites(self) -> int:
        return self.n_layers + 1

    def check_sites(self, sites: Sequence[int], error: Any) -> None:
        """Raise ``error(message)`` for a site this model lacks (unless ``n_layers`` is 0: not known here)."""
        bad = [s for s in sites if not 0 <= int(s) < self.n_sites]
        if bad and self.n_layers:
            raise error(f"unknown layer {bad[0]}: this model has sites 0..{self.n_sites - 1} (0 = embedding output, "
                        "s = output of block s-1)")


class InterventionUnsupportedError(MemtocError):
    """An intervention (edit, capture) asked of a backend that cannot apply it."""


@runtime_checkable
class TextBackend(Protocol):
    """Generation over conversations plus provenance: what the evaluator needs from any model runtime. A
    conversation is a list of chat messages ``{"role", "content"}`` or a plain string (one user message)."""

    name: str
    chat: bool
    tokenizer: Any
    capabilities: frozenset[str]

    def format_prompt(self, conversation: Conversation) -> str:
        """The exact string the model is conditioned on (chat template for instruct models)."""

    def generate(self, prompts: Sequence[Conversation], config: GenerationConfig, *,
                 edit: Any = None) -> list[Generation]:
        """Greedy answers for conversations (templating is applied inside)."""

    def generate_formatted(self, texts: Sequence[str], config: GenerationConfig, *,
                           edit: Any = None) -> list[Generation]:
        """Greedy answers for already formatted strings (e.g. a conversation the caller rendered itself)."""

    def preformatted(self) -> "TextBackend":
        """A view whose prompts are already the exact strings the model is conditioned on."""

    def provenance(self) -> dict[str, Any]:
        """Model id, weights hash, tokenizer and chat-template hashes, dtype, device, library versions."""


#: the answer log a :class:`RemoteBackend` is given in an evaluation's run directory
ANSWERS_FILE = "answers.jsonl"


@runtime_checkable
class RemoteBackend(TextBackend, Protocol):
    """A text backend whose model runs behind an endpoint (``--backend openai``). Each answer costs a request, so
    the evaluation hands it a durable answer log, and an edit is the server's to apply, so the backend says
    before any request whether its server can."""

    def keep_answers(self, path: str | Path) -> None:
        """Log every answer to ``path`` (a JSONL file) as it arrives; answer logged requests from it."""

    def check_edit(self, edit: Any) -> None:
        """Refuse (one line) an edit the server cannot apply, before any request is sent."""


@runtime_checkable
class HookedBackend(TextBackend, Protocol):
    """A text backend with interventions: tokenization with offsets, forward and generate with capture and edits
    (``activations.capture.ResidualCapture``, ``steering.edits.BoundEdit``), run through :meth:`intervene`, and its
    residual sites."""

    def encode(self, prompts: Sequence[Conversation]) -> TokenBatch:
        """Formatted prompts as one left-padded batch with character offsets, on the model's device."""

    def forward(self, prompts: Sequence[Conversation], *, capture: Any = None, edit: Any = None,
                continuations: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """One batched forward pass with capture / edit hooks; returns the batch (and, where the backend has
        them, the last-position logits)."""

    @property
    def site_info(self) -> SiteInfo:
        """Layers, residual width, architecture, device and dtype of the model."""

    def intervene(self, batch: TokenBatch, plan: Any) -> Any:
        """A context manager running an edit, capture or hook plan (``memtoc.backends.plans``: what) the backend's
        own way (how) for the forwards inside; ``forward`` and ``generate`` call it for their ``edit=``."""


@runtime_checkable
class TokenRowBackend(HookedBackend, Protocol):
    """A hooked backend whose forwards carry every scheduled request's tokens as rows of one ``[n, d]`` tensor
    (vLLM), reached through :meth:`token_hooks` (``memtoc.backends.vllm_rows``)."""

    def token_hooks(self, sites: Sequence[int], hook: Any) -> Any:
        """A context manager installing ``hook`` (``memtoc.backends.vllm_rows.TokenHook``) at ``sites``."""


@runtime_checkable
class ReadoutBackend(HookedBackend, Protocol):
    """A hooked backend without the model's module tree whose readout -- the final norm and output head, loaded
    on their own from the weights it serves -- is at hand, so lenses can decode states it captured (vLLM)."""

    def readout_parts(self) -> ModelParts:
        """Readout-only parts (``ModelParts.readout_only``): final norm, head, widths and sites, no blocks' weights."""


@runtime_checkable
class InspectableBackend(HookedBackend, Protocol):
    """A hooked backend whose model can be looked into: the model's parts, and adapter views."""

    @property
    def parts(self) -> ModelParts:
        """The model's blocks, final norm, head, widths and sites."""

    def with_adapter(self, path: str | Path) -> "InspectableBackend":
        """A backend over the model with the adapter at ``path`` applied; the shared model is never touched."""

    def trainable_copy(self) -> Any:
        """A copy of the model for training (frozen weights shared read-only); the shared model is never touched."""


#: The name the evaluator has always used for the text seam.
Backend = TextBackend
