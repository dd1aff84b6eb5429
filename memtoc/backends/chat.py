"""Prompt formatting shared by every backend, so the HF and vLLM backends condition on the same string.

A benchmark prompt is sent as a single user message through the model's own chat template (no system
prompt of ours) when the tokenizer has one, else as the raw text.
"""

from __future__ import annotations

from typing import Any, Sequence


def uses_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template (instruct models)."""
    return bool(getattr(tokenizer, "chat_template", None))


def format_user_prompt(tokenizer: Any, user_prompt: str, *, chat: bool) -> str:
    """The exact string the model is conditioned on: the templated single user turn, or ``user_prompt`` itself."""
    if not chat:
        return user_prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": user_prompt}], tokenize=False,
                                         add_generation_prompt=True)


def encode_formatted(tokenizer: Any, texts: Sequence[str], *, chat: bool) -> list[list[int]]:
    """Token ids of already formatted prompts, tokenized the way ``HFBackend.encode`` does (without padding).

    A chat template already writes the special tokens (a BOS among them for many models), so templated text
    is tokenized with ``add_special_tokens=False``; raw text gets the tokenizer's own special tokens.
    """
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=not chat)["input_ids"]]
