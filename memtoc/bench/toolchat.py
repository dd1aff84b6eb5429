"""Tool-calling conversations, shared by every agent loop: rendering with tools, and finding JSON tool calls.

Both agent families (the code executor, :mod:`memtoc.tasks.codeexec.agent`, and MemToC episodes as agent tasks,
:mod:`memtoc.tasks.agent`) offer a tool through the model's chat template when the template supports ``tools=``
("native") and through a documented text protocol otherwise, and find a call in a model turn the same way.
This core module holds that shared part, so the two loops cannot drift apart in what they call a tool call:

- :func:`template_supports_tools`: rendering one message with and without the schema differs, and only the
  former mentions the schema's name;
- :func:`render`: a message list through the chat template (``tools=[...]`` in the OpenAI function form), or the
  plain ``Role: content`` rendering for tokenizers without a template;
- :func:`find_json_calls`: every JSON object (or list) in a turn, in order, with the text before it minus a
  call-opening tag (Hermes/Qwen ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama ``<|python_tag|>``);
- :func:`lockstep`: the batching driver (every item waiting for a model turn goes into the same backend call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

__all__ = ["as_function", "template_supports_tools", "render", "plain_render", "JsonSpan", "find_json_calls",
           "CALL_PREFIX_RE", "lockstep"]

#: A call-opening tag right before a JSON call (removed from the text kept before the call).
CALL_PREFIX_RE = re.compile(r"(<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)\s*$")
_DECODER = json.JSONDecoder()


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
    name = schema["name"]
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


@dataclass(frozen=True)
class JsonSpan:
    """One JSON value found in a turn: the value, where it starts and ends, the text before it (tag removed)."""

    value: Any
    start: int
    end: int
    prefix: str


def find_json_calls(text: str) -> Iterator[JsonSpan]:
    """Every JSON object or list that parses at a ``{``/``[`` of ``text``, in order (a caller picks the first
    that has the shape of a call)."""
    for m in re.finditer(r"[\[{]", text):
        try:
            obj, end = _DECODER.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        yield JsonSpan(value=obj, start=m.start(), end=end,
                       prefix=CALL_PREFIX_RE.sub("", text[:m.start()]).rstrip())


def lockstep(n: int, *, done: Callable[[int], bool], request: Callable[[int], Any],
             generate: Callable[[list[int], list[Any]], Sequence[Any]], advance: Callable[[int, Any], None],
             batch_size: int, finish: Callable[[list[int]], None] | None = None) -> None:
    """Advance ``n`` items in lockstep until all are done.

    Each round, the items not ``done`` are taken in chunks of ``batch_size``; ``request(i)`` is what item ``i``
    needs generated (a rendered text, or a richer request), ``generate(indices, requests)`` returns one
    generation per request, ``advance(i, generation)`` applies it; ``finish`` gets the items that finished in
    that chunk (for crash-safe appends).
    """
    finished: set[int] = set()
    while True:
        active = [i for i in range(n) if not done(i)]
        if not active:
            return
        for lo in range(0, len(active), batch_size):
            chunk = active[lo:lo + batch_size]
            gens = generate(chunk, [request(i) for i in chunk])
            if len(gens) != len(chunk):
                raise RuntimeError(f"backend returned {len(gens)} generations for {len(chunk)} prompts")
            for i, g in zip(chunk, gens):
                advance(i, g)
            newly = [i for i in chunk if done(i) and i not in finished]
            finished.update(newly)
            if newly and finish is not None:
                finish(newly)
