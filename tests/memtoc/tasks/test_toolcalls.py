"""The one call parser: the registry, the JSON call finder both families read turns with, and the fenced-code
parser of the code executor's text protocol."""

from __future__ import annotations

import json

import pytest

from memtoc.tasks.agent.calls import find_call
from memtoc.tasks.codeexec.agent import ToolCall, parse_tool_call
from memtoc.tasks.toolcalls import (CALL_PARSERS, FoundCall, call_arguments, find_calls, first_call,
                                    register_call_parser)


def test_builtin_parsers_are_registered_in_order():
    assert CALL_PARSERS.names()[:2] == ("json", "fence")


@pytest.mark.parametrize("text, prefix", [
    ('Sure. <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', "Sure."),     # Hermes / Qwen
    ('[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}]', ""),                          # Mistral
    ('<|python_tag|>{"name": "f", "parameters": {"x": 1}}', ""),                         # Llama 3
    ('{"name": "f", "arguments": {"x": 1}}', ""),                                         # bare JSON
])
def test_json_calls_in_every_house_syntax(text, prefix):
    call = first_call(text, ("json",))
    assert call is not None and call.name == "f" and call.arguments == {"x": 1}
    assert call.content == prefix and call.parser == "json"
    assert json.loads(call.raw)["name"] == "f" if call.raw.startswith("{") else True


def test_json_calls_skip_objects_without_the_call_shape_and_keep_order():
    text = '{"x": 1} {"name": 3, "arguments": {}} {"name": "a", "arguments": {}} {"name": "b", "parameters": "{}"}'
    assert [c.name for c in find_calls(text, ("json",))] == ["a", "b"]


def test_arguments_as_a_json_string_decode_and_an_undecodable_string_is_none():
    (ok, bad) = find_calls('{"name": "f", "arguments": "{\\"code\\": \\"1\\"}"} {"name": "g", "arguments": "x"}')
    assert call_arguments(ok) == {"code": "1"} and call_arguments(bad) is None


def test_fence_parser_keeps_the_text_through_the_closing_fence():
    text = "Let me run it.\n```python\nprint(2)\n```\nimagined: 2"
    (call,) = find_calls(text, ("fence",))
    assert call.name is None and call.arguments == {"code": "print(2)\n"}
    assert call.content == "Let me run it.\n```python\nprint(2)\n```" and call.parser == "fence"
    assert not list(find_calls("```python\nunclosed", ("fence",)))


def test_parsers_are_read_in_the_order_named():
    text = "```py\nprint(1)\n```\n" + '{"name": "python_executor", "arguments": {"code": "print(2)"}}'
    assert [c.parser for c in find_calls(text, ("json", "fence"))] == ["json", "fence"]
    assert [c.parser for c in find_calls(text, ("fence", "json"))] == ["fence", "json"]


def test_unknown_parser_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown call parser 'nope'"):
        list(find_calls("x", ("nope",)))


def test_a_registered_parser_is_one_more_entry():
    def bang(text):
        if text.startswith("!"):
            yield FoundCall(name=text[1:], arguments={}, raw=text, content="", parser="bang")

    register_call_parser("bang")(bang)
    try:
        assert first_call("!f", ("json", "bang")).name == "f"
        with pytest.raises(ValueError, match="already registered"):
            register_call_parser("bang")(lambda text: iter(()))
    finally:
        CALL_PARSERS.remove("bang")


def test_both_families_read_json_calls_with_the_same_parser():
    """The agent tasks take the first call-shaped object; the code executor the first holding ``code``."""
    text = ('{"name": "other", "arguments": {"x": 1}} then '
            '<tool_call>{"name": "python_executor", "arguments": {"code": "print(1)"}}</tool_call>')
    agent = find_call(text)
    assert agent.name == "other" and agent.arguments == {"x": 1} and agent.prefix == ""
    cx = parse_tool_call(text, "native")
    assert cx.code == "print(1)" and cx.source == "native"
    assert cx.content == '{"name": "other", "arguments": {"x": 1}} then'
    # the text protocol reads fenced blocks only; native falls back to one
    fenced = "```python\nprint(3)\n```"
    assert parse_tool_call(text, "text") is None
    assert parse_tool_call(fenced, "native") == parse_tool_call(fenced, "text") == ToolCall(
        code="print(3)\n", source="fence", content=fenced)
