"""The agent loop on constructed turns: execution returns the controlled payload, the answer is scored by the
scorer, and every failure lands in its mechanism class (T1, T2, T3, T4) with nothing executed."""

from __future__ import annotations

import json

import pytest

from memtoc.tasks.agent.loop import AgentItem, AgentSpec, LoopSettings, run_agent_episodes
from memtoc.tasks.agent.schemas import load_demo_schemas
from memtoc.backends.guided import call_schema
from memtoc.core.config import ConfigError
from memtoc.scoring import score_response

SCHEMA = load_demo_schemas()["20.0"]     # country_capital_lookup(country, include_population: bool, ...)


def item(tool_value: str = "Paris") -> AgentItem:
    return AgentItem(episode_id="20-0-tool_right-v0", question_id="20.0", formulation="reference",
                     question="What is the capital of France?", gold="Paris", aliases=(),
                     tool_output={"result": tool_value}, memory_span="Paris", mem_absent=False, memory_correct=True,
                     schema=SCHEMA)


def run(backend, protocol="auto", **kw):
    (rec,) = run_agent_episodes(backend, [AgentSpec(item(kw.pop("tool_value", "Paris")), protocol)],
                                LoopSettings(**kw))
    return rec


def test_valid_call_is_executed_with_the_controlled_payload_and_scored(scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: call_text(SCHEMA["name"], {"country": "France"}), answer="FINAL: Lyon")
    rec = run(b, tool_value="Lyon")
    assert rec["executed"] and rec["mechanism"] is None and rec["tool_protocol"] == "text"
    assert rec["messages"][3] == {"role": "user", "content": "Tool result: " + json.dumps({"result": "Lyon"})}
    # the one scorer: agreement is followed_tool against the executed return
    ref = score_response("FINAL: Lyon", gold="Paris", tool_value="Lyon", memory_span="Paris")
    assert rec["score"] == ref.to_dict() and rec["agreement"] is True
    assert [t["phase"] for t in rec["turns"]] == ["call", "answer"]
    assert b.requests[0]["schema"] is None and b.requests[1]["stop"] is True


def test_boolean_string_is_t1_not_executed_and_the_error_is_returned(scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: call_text(SCHEMA["name"], {"country": "France", "include_population": "false"}))
    rec = run(b)
    assert not rec["executed"] and rec["mechanism"] == "T1"
    assert rec["calls"][0]["errors"][0]["stringified"] is True
    assert "rejected" in rec["messages"][3]["content"] and "Paris" not in rec["messages"][3]["content"]


def test_unparseable_call_is_t2(scripted):
    ScriptedBackend, call_text = scripted
    rec = run(ScriptedBackend(lambda t: '<tool_call>{"name": "country_capital_lookup", "arguments": {'))
    assert rec["mechanism"] == "T2" and not rec["executed"]


def test_no_call_is_t4_silent_abstention_yet_can_agree_on_the_memory_right_slice(scripted):
    ScriptedBackend, call_text = scripted
    rec = run(ScriptedBackend(lambda t: "It is Paris.\nFINAL: Paris"))
    assert rec["mechanism"] == "T4" and not rec["executed"] and rec["agreement"] is True
    assert len(rec["turns"]) == 1


@pytest.mark.parametrize("decision, mechanism, executed", [("CALL", None, True), ("ANSWER", "T4", False),
                                                           ("I am not sure.", "T3", False)])
def test_two_stage_decision(decision, mechanism, executed, scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: call_text(SCHEMA["name"], {"country": "France"}), decision=decision)
    rec = run(b, protocol="two-stage")
    assert rec["mechanism"] == mechanism and rec["executed"] is executed
    assert rec["stage_one"]["raw"] == decision
    assert rec["turns"][0]["phase"] == "decide"


def test_guided_call_turn_is_constrained_to_the_call_schema_and_names_the_tool(scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: json.dumps({"name": SCHEMA["name"], "arguments": {"country": "France"}}))
    rec = run(b, protocol="guided")
    assert rec["executed"] and rec["decoding"] == "constrained"
    assert b.requests[0]["schema"] == call_schema(SCHEMA)
    assert f"Call the tool {SCHEMA['name']}" in b.requests[0]["text"]
    # free decoding of the guided protocol: same prompt, no constraint; prose instead of the call is T2
    b = ScriptedBackend(lambda t: "Paris.")
    rec = run(b, protocol="guided", decoding="free")
    assert b.requests[0]["schema"] is None and rec["mechanism"] == "T2"


def test_constrained_decoding_needs_a_guided_backend(scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: "")
    b.capabilities = frozenset({"generate"})
    with pytest.raises(ConfigError, match="guided"):
        run(b, protocol="guided")


# -- an engine's own tool-call parser (vLLM's --tool-call-parser) reads the call turns ---------------------------------

def _tagged_only(text, schema):
    """A stand-in engine parser that reads only <tool_call>...</tool_call> (as vLLM's hermes parser does)."""
    import re

    m = re.search(r"<tool_call>(.*?)</tool_call>", text, re.S)
    if m is None:
        return [], text
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError:
        return [], text
    return [(obj["name"], obj["arguments"] if isinstance(obj["arguments"], str) else json.dumps(obj["arguments"]))], \
        text[:m.start()] or None


def _engine_backend(scripted, reply):
    ScriptedBackend, _ = scripted

    class EngineBackend(ScriptedBackend):
        parsers: list = []

        def tool_call_parser(self, name):
            self.parsers.append(name)
            return _tagged_only

    return EngineBackend(reply)


def test_engine_parser_reads_the_call_turns_instead_of_the_toolkits(scripted):
    bare = json.dumps({"name": SCHEMA["name"], "arguments": {"country": "France"}})
    assert run(_engine_backend(scripted, lambda t: bare))["executed"]                  # the toolkit's parser: a call
    b = _engine_backend(scripted, lambda t: bare)
    rec = run(b, call_parser="hermes")
    # the engine finds no call, yet the turn shows a call's "name" key: an unparseable attempt (T2), not executed
    assert b.parsers == ["hermes"] and not rec["executed"] and rec["mechanism"] == "T2"
    assert rec["calls"][0]["parsed"] is False
    rec = run(_engine_backend(scripted, lambda t: "FINAL: Paris"), call_parser="hermes")
    assert rec["mechanism"] == "T4" and rec["calls"] == []                     # no attempt at all
    tagged = "Let me look it up. <tool_call>" + bare + "</tool_call>"
    rec = run(_engine_backend(scripted, lambda t: tagged), call_parser="hermes")
    assert rec["executed"] and rec["calls"][0]["arguments"] == {"country": "France"}
    assert rec["calls"][0]["raw"] == tagged[len("Let me look it up. "):]
    broken = '<tool_call>{"name": "' + SCHEMA["name"] + '", "arguments": "{country"}</tool_call>'
    rec = run(_engine_backend(scripted, lambda t: broken), call_parser="hermes")
    assert rec["mechanism"] == "T2" and not rec["executed"]                  # arguments that are not JSON


def test_engine_parser_needs_a_backend_that_has_one(scripted):
    ScriptedBackend, call_text = scripted
    with pytest.raises(ConfigError, match="--tool-call-parser hermes"):
        run(ScriptedBackend(lambda t: call_text(SCHEMA["name"], {"country": "France"})), call_parser="hermes")
