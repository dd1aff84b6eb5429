"""Tool-calling conversations, shared by every agent loop: rendering a conversation with a tool offered.

Both agent families (the code executor, :mod:`memtoc.tasks.codeexec.agent`, and MemToC episodes as agent tasks,
:mod:`memtoc.tasks.agent`) offer a tool through the model's chat template when the template supports ``tools=``
("native") and through a documented text protocol otherwise. This module holds the rendering they share (the
loop itself is :mod:`memtoc.tasks.loop`, the call parser :mod:`memtoc.tasks.toolcalls`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["as_function", "template_supports_tools", "render", "plain_render"]


def as_function(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema in the OpenAI function form that chat templates expect."""
    return {"type": "function", "function": dict(schema)}


def template_supports_tools(tokenizer: Any, schema: Mapping[str, Any]) -> bool:
    """True when the tokenizer's chat template renders ``schema`` given through ``tools=``."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": "Hi."}]
    try:
        plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(probe, tools=[as_function(schema)], tokenize=False,
                                                   add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - any template failure means: no native tool support
        return False
    name = schema["name"]     # native only when the schema is rendered, and only because it was given
    return with_tools != plain and name in with_tools and name not in plain


def plain_render(messages: Sequence[Mapping[str, Any]]) -> str:
    """Raw-text rendering for tokenizers without a chat template: ``Role: content`` blocks, then ``Assistant:``."""
    parts = [f"{m['role'].capitalize()}: {m.get('content') or ''}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:"


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, chat: bool,
           tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The exact string the model is conditioned on (generation prompt added); ``tools`` are schemas."""
    if not chat:
        return plain_render(messages)
    kwargs: dict[str, Any] = {}
    if tools:
        kwargs["tools"] = [as_function(s) for s in tools]
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True, **kwargs)
