"""Call finding, schema validation and the mechanism classes (T1 type coercion, T2 unparseable, T3 decision
parse failure, schema errors) on constructed calls; schema files refused with file/row/field."""

from __future__ import annotations

import json

import pytest

from memtoc.tasks.agent.calls import check_call, check_schema, find_call, parse_decision
from memtoc.tasks.agent.schemas import load_demo_schemas
from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import BenchmarkDataError

TOOL = {"name": "country_capital_lookup", "description": "Capital of a country.",
        "parameters": {"type": "object", "properties": {
            "country": {"type": "string"}, "include_population": {"type": "boolean"},
            "as_of_year": {"type": "integer"}, "kind": {"type": "string", "enum": ["a", "b"]}},
            "required": ["country"]}}


def call(args) -> str:
    return "<tool_call>" + json.dumps({"name": TOOL["name"], "arguments": args}) + "</tool_call>"


def test_valid_call_is_valid_with_its_arguments():
    raw = find_call("Sure. " + call({"country": "France", "include_population": True}))
    assert raw is not None and raw.parsed and raw.prefix == "Sure."
    chk = check_call(raw, TOOL)
    assert chk.valid and chk.mechanism is None and chk.arguments == {"country": "France", "include_population": True}


def test_boolean_sent_as_string_is_t1_and_stringified():
    chk = check_call(find_call(call({"country": "France", "include_population": "true"})), TOOL)
    assert not chk.valid and chk.mechanism == "T1"
    (err,) = chk.errors
    assert err["validator"] == "type" and err["path"] == "include_population" and err["stringified"] is True


def test_integer_as_string_is_t1_and_a_word_is_t1_but_not_stringified():
    chk = check_call(find_call(call({"country": "France", "as_of_year": "2020"})), TOOL)
    assert chk.mechanism == "T1" and chk.errors[0]["stringified"] is True
    chk = check_call(find_call(call({"country": "France", "include_population": "yes please"})), TOOL)
    assert chk.mechanism == "T1" and chk.errors[0]["stringified"] is False


def test_broken_json_is_t2():
    raw = find_call('<tool_call>{"name": "country_capital_lookup", "arguments": {"country": "France"</tool_call>')
    assert raw is not None and not raw.parsed
    assert check_call(raw, TOOL).mechanism == "T2"


def test_arguments_string_that_is_not_json_is_t2_and_a_json_string_is_accepted():
    raw = find_call('{"name": "country_capital_lookup", "arguments": "{country: France}"}')
    assert check_call(raw, TOOL).mechanism == "T2"
    raw = find_call(json.dumps({"name": TOOL["name"], "arguments": json.dumps({"country": "France"})}))
    assert check_call(raw, TOOL).valid


def test_required_turn_without_a_call_is_t2_and_a_free_turn_is_no_call():
    assert find_call("The capital is Paris.\nFINAL: Paris") is None
    raw = find_call("The capital is Paris.", required=True)
    assert raw is not None and check_call(raw, TOOL).mechanism == "T2"


def test_missing_required_and_enum_are_schema_errors_and_other_tools_are_wrong_tool():
    chk = check_call(find_call(call({"include_population": False})), TOOL)
    assert chk.mechanism == "schema" and chk.errors[0]["validator"] == "required"
    chk = check_call(find_call(call({"country": "France", "kind": "c"})), TOOL)
    assert chk.mechanism == "schema" and chk.errors[0]["validator"] == "enum"
    raw = find_call(json.dumps({"name": "other_tool", "arguments": {"country": "France"}}))
    assert check_call(raw, TOOL).mechanism == "wrong_tool"


@pytest.mark.parametrize("text, expected", [("CALL", "call"), ("answer.", "answer"), ("I will call it: CALL", "call"),
                                            ("Maybe", None), ("CALL or ANSWER", None), ("", None)])
def test_two_stage_decision_parse(text, expected):
    assert parse_decision(text) == expected


def test_demo_schemas_cover_every_demo_question_and_are_valid():
    schemas = load_demo_schemas()
    assert set(schemas) == {q.id for q in load_benchmark("demo").questions}
    for qid, s in schemas.items():
        check_schema(s, path="x", row=qid)    # ToolHop shape + a valid JSON Schema
        assert set(s["parameters"]["required"]) <= set(s["parameters"]["properties"])


def test_malformed_schema_file_names_file_row_field(tmp_path):
    bad = {"schema_version": "memtoc-demo-tool-schemas-v1",
           "schemas": {"0.0": {"name": "t", "description": "d",
                               "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}}}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(BenchmarkDataError) as e:
        load_demo_schemas(p)
    assert str(p) in str(e.value) and "row 0.0" in str(e.value) and "field 'parameters'" in str(e.value)
    bad["schemas"]["0.0"] = {"name": "t", "parameters": {"type": "object", "properties": {}}}
    p.write_text(json.dumps(bad))
    with pytest.raises(BenchmarkDataError, match="field 'description'"):
        load_demo_schemas(p)
