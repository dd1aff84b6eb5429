"""Prompt formatting shared by every backend, so the HF and vLLM backends condition on the same string.

A benchmark prompt is a conversation: a list of chat messages ``{"role", "content"}``; a plain string is the
one-message conversation ``[{"role": "user", "content": text}]``. It is sent through the model's own chat
template (no system prompt of ours) when the tokenizer has one, else as raw text.

The one tokenization rule lives here too (:func:`add_special_tokens`): a chat template already writes the special
tokens (a BOS among them for many models), so templated text is tokenized with ``add_special_tokens=False``; raw
text gets the tokenizer's own special tokens. Every caller that tokenizes a formatted prompt asks this function.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence, Union

#: A chat message: ``{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}``.
Message = Mapping[str, Any]
#: A conversation, or a plain user string (the one-message conversation).
Conversation = Union[str, Sequence[Message]]


def uses_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template (instruct models)."""
    return bool(getattr(tokenizer, "chat_template", None))


def add_special_tokens(chat: bool) -> bool:
    """Whether formatted text is tokenized with the tokenizer's own special tokens: only when no chat template
    formatted it (a template writes them itself)."""
    return not chat


def as_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """A conversation as a list of message dicts (a plain string is one user message)."""
    if isinstance(conversation, str):
        return [{"role": "user", "content": conversation}]
    return [dict(m) for m in conversation]


def plain_render(messages: Sequence[Message]) -> str:
    """Raw-text rendering of a multi-message conversation for a model without a chat template:
    ``Role: content`` blocks, then ``Assistant:``."""
    parts = [f"{str(m['role']).capitalize()}: {m.get('content') or ''}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:"


def format_conversation(tokenizer: Any, conversation: Conversation, *, chat: bool) -> str:
    """The exact string the model is conditioned on for ``conversation`` (generation prompt added).

    Without a chat template a plain string (or a single user message) is sent as it is -- what base models
    are evaluated on -- and a longer conversation is rendered by :func:`plain_render`.
    """
    if not chat:
        if isinstance(conversation, str):
            return conversation
        messages = as_messages(conversation)
        if len(messages) == 1 and messages[0].get("role") == "user":
            return str(messages[0].get("content") or "")
        return plain_render(messages)
    return tokenizer.apply_chat_template(as_messages(conversation), tokenize=False, add_generation_prompt=True)


def format_user_prompt(tokenizer: Any, user_prompt: str, *, chat: bool) -> str:
    """The exact string the model is conditioned on: the templated single user turn, or ``user_prompt`` itself."""
    return format_conversation(tokenizer, user_prompt, chat=chat)


def encode_formatted(tokenizer: Any, texts: Sequence[str], *, chat: bool) -> list[list[int]]:
    """Token ids of already formatted prompts, tokenized the way every backend does (without padding)."""
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens(chat))["input_ids"]]


class FormatsPrompts:
    """``format_prompt``, ``preformatted`` and ``encode`` of a backend with a local tokenizer (hf, vllm); the class
    gives ``tokenizer``, ``chat`` and ``encode_formatted``."""

    _preformatted = False

    def format_prompt(self, conversation: Conversation) -> str:
        """A conversation through the chat template (no system prompt of ours), or the raw text; on a
        :meth:`preformatted` view a string prompt is returned as it is."""
        if self._preformatted and isinstance(conversation, str):
            return conversation
        return format_conversation(self.tokenizer, conversation, chat=self.chat)  # type: ignore[attr-defined]

    def preformatted(self) -> Any:
        """A view (same model and tokenizer) whose string prompts are already the exact strings the model is
        conditioned on (e.g. multi-turn conversations the caller rendered); character spans given to a capture
        or an edit are spans within them."""
        view = copy.copy(self)
        view._preformatted = True
        return view

    def encode(self, prompts: Sequence[Conversation]) -> Any:
        """Formatted prompts as one left-padded :class:`~memtoc.backends.tokens.TokenBatch` with character offsets."""
        return self.encode_formatted([self.format_prompt(p) for p in prompts])  # type: ignore[attr-defined]
