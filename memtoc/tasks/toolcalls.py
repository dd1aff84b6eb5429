"""The one call parser of both agent families: tool calls found in a model turn, by registered parsers.

A *parser* reads a model turn and yields every call it finds, in order (:class:`FoundCall`). Parsers are a
registry (:data:`CALL_PARSERS`, :func:`register_call_parser`), and a family names the parsers it reads a turn
with, in order of preference (:func:`find_calls`, :func:`first_call`):

- ``json``: every JSON object (or the first object of a JSON list) with a string ``name`` and an ``arguments``
  (or ``parameters``) key, in order of its opening brace; a call-opening tag right before it (``<tool_call>``,
  ``[TOOL_CALLS]``, ``<|python_tag|>``) is dropped from the content kept, which is the text before the call;
- ``fence``: the code executor's text protocol, every complete ```python block as a call with arguments
  ``{"code": <the block>}``; the content kept runs through the closing fence (an imagined output after it is
  dropped from the conversation).

The serving engine's own parser (vLLM's ``--tool-call-parser``) is not an entry here: it needs the tool schema
and belongs to the backend; :func:`memtoc.tasks.agent.calls.engine_call` classifies its parse the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from memtoc.core.registry import Registry

__all__ = ["FoundCall", "CallParser", "CALL_PARSERS", "register_call_parser", "find_calls", "first_call",
           "CALL_PREFIX_RE", "call_arguments"]

#: A call-opening tag right before a JSON call (removed from the text kept before the call).
CALL_PREFIX_RE = re.compile(r"(<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>)\s*$")
_DECODER = json.JSONDecoder()
_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class FoundCall:
    """One call found in a turn, as written."""

    #: the tool name written in the call (None: the syntax names no tool, e.g. a fenced block)
    name: str | None
    #: the arguments as written: an object, a JSON string, or whatever the call held
    arguments: Any
    #: the text of the call itself
    raw: str
    #: the assistant message content to keep when the call is fed back
    content: str
    #: the name of the parser that found it (:data:`CALL_PARSERS`)
    parser: str


#: ``parser(text) -> every call of the turn, in order``
CallParser = Callable[[str], Iterator[FoundCall]]
CALL_PARSERS: Registry[CallParser] = Registry("call parser")


def register_call_parser(name: str) -> Callable[[CallParser], CallParser]:
    """Register a call parser under ``name`` (decorator)."""
    def deco(fn: CallParser) -> CallParser:
        return CALL_PARSERS.add(name, fn)
    return deco


def find_calls(text: str, parsers: Iterable[str] = ("json",)) -> Iterator[FoundCall]:
    """Every call the named parsers find in ``text``: all of the first parser's calls, then the next's."""
    for name in parsers:
        parse = CALL_PARSERS.get(name)
        if parse is None:
            raise ValueError(f"unknown call parser {name!r}; known: {', '.join(CALL_PARSERS.names())}")
        yield from parse(text)


def first_call(text: str, parsers: Iterable[str] = ("json",),
               accept: Callable[[FoundCall], bool] | None = None) -> FoundCall | None:
    """The first call of :func:`find_calls` that ``accept`` takes (any call when None), or None."""
    return next((c for c in find_calls(text, parsers) if accept is None or accept(c)), None)


def call_arguments(call: FoundCall) -> Any:
    """The call's arguments, a JSON string decoded (None when it does not decode)."""
    args = call.arguments
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return None
    return args


def _call_shape(value: Any) -> dict[str, Any] | None:
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, dict) and isinstance(value.get("name"), str) and (
            "arguments" in value or "parameters" in value):
        return value
    return None


@register_call_parser("json")
def json_calls(text: str) -> Iterator[FoundCall]:
    """JSON tool calls: an object with ``name`` and ``arguments``/``parameters`` (module docstring), tried at
    every ``{``/``[`` of ``text`` that starts a JSON value."""
    for m in re.finditer(r"[\[{]", text):
        try:
            value, end = _DECODER.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        obj = _call_shape(value)
        if obj is not None:
            yield FoundCall(name=obj["name"], arguments=obj.get("arguments", obj.get("parameters")),
                            raw=text[m.start():end], content=CALL_PREFIX_RE.sub("", text[:m.start()]).rstrip(),
                            parser="json")


@register_call_parser("fence")
def fenced_calls(text: str) -> Iterator[FoundCall]:
    """Complete ```python (or ```py) fenced blocks, as calls with arguments ``{"code": ...}``."""
    for m in _FENCE_RE.finditer(text):
        yield FoundCall(name=None, arguments={"code": m.group(1)}, raw=m.group(0), content=text[:m.end()],
                        parser="fence")
