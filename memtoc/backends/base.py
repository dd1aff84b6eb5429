"""The backend seam: every model call of the toolkit goes through ``generate`` or ``forward``.

Capture (activations/) and edits (steering/) are options of these calls, never separate pipelines, so an
edited or inspected model is evaluated by the same code path and the same scorer as the untreated one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from memtoc.scoring.extract import QUOTE_CHARS, _MARKER_RE


@dataclass(frozen=True)
class GenerationConfig:
    """Greedy decoding settings shared by every backend."""

    max_new_tokens: int = 128
    stop_at_final_line: bool = True   # stop once the ``FINAL:`` answer line is complete
    batch_size: int | None = None     # prompts per call a job sends (None: the job's default for its backend)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Generation:
    """One greedy answer. ``text`` is cut right after the completed FINAL line when stopping applies."""

    text: str
    n_prompt_tokens: int
    n_new_tokens: int
    stop_reason: str   # "final_line" | "eos" | "max_tokens"
    token_ids: tuple[int, ...] = field(default=(), repr=False)


def final_line_end(text: str) -> int | None:
    """Index just past the newline that completes the first (unquoted) FINAL answer line, else None.

    The same cut is applied to every backend's output after decoding, so HF (which stops early) and vLLM
    (which generates to the budget) return the same string for the same tokens.
    """
    for m in _MARKER_RE.finditer(text):
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


@runtime_checkable
class Backend(Protocol):
    """What the evaluator needs from a model runtime."""

    name: str

    def format_prompt(self, user_prompt: str) -> str:
        """The exact string the model is conditioned on (chat template for instruct models)."""

    def generate(self, prompts: Sequence[str], config: GenerationConfig, *, edit: Any = None) -> list[Generation]:
        """Greedy answers for user prompts (templating is applied inside)."""

    def provenance(self) -> dict[str, Any]:
        """Model id, weights hash, tokenizer and chat-template hashes, dtype, device, library versions."""
