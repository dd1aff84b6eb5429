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
