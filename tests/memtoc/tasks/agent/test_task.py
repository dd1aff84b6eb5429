"""The agent task through the one evaluate job: run directory with traces, resume, one arm per protocol added
into the same directory, the memory-right slice (own closed-book pass or a finished run), Table 7 figures."""

from __future__ import annotations

import json

import pytest

from memtoc.tasks.agent.metrics import protocol_contrasts
from memtoc.tasks.agent.task import AgentRunConfig, evaluate_agent
from memtoc.core.config import ConfigError
from memtoc.core.errors import RunStoreError
from memtoc.bench.conditions import set_default
from memtoc.core.config import EpisodeSelection, JobSettings, ModelSpec
from memtoc.tasks.agent.task import AgentSettings


def calls_by_question(name_of):
    """Calls that validate on even questions and send a boolean as a string on odd ones."""
    def call(text: str) -> str:
        import re

        q = re.search(r"User: (.*?)\n", text).group(1)
        odd = q.startswith("What is the capital of Japan")
        args = {"country": "X", "include_population": "true" if odd else True}
        return "<tool_call>" + json.dumps({"name": name_of, "arguments": args}) + "</tool_call>"
    return call


def test_run_directory_resume_arms_and_figures(tmp_path, scripted):
    ScriptedBackend, _ = scripted
    # questions 20..24 of the demo are capitals (country_capital_lookup); closed-book "Paris" is right for 20 only
    # under the memory-right slice, so --slice all is used to get five episodes
    backend = ScriptedBackend(calls_by_question("country_capital_lookup"), answer="FINAL: Tokyo")
    cfg = AgentRunConfig(
        selection=EpisodeSelection(conditions=set_default("agent"), limit=25, question_set="all"),
        job=JobSettings(out=str(tmp_path / "run"), n_boot=200), agent=AgentSettings(slice="all"))
    cfg2 = AgentRunConfig(
        selection=EpisodeSelection(conditions=set_default("agent"), limit=25),
        job=JobSettings(out=str(tmp_path / "run"), n_boot=200), agent=AgentSettings(slice="all", tool_choice="auto"))
    assert cfg2.agent.tool_choice == "auto"
    res = evaluate_agent(cfg, backend=backend)
    recs = res.records
    assert res.n_new == len(recs) == 25
    root = tmp_path / "run"
    assert {p.name for p in root.iterdir()} >= {"run.json", "agent_episodes.jsonl", "agent_closed_book.jsonl",
                                                 "summary.json"}
    # the capital tool's calls validate except on Japan (T1); other questions' tools are called by the wrong name
    by_q = {r["question_id"]: r for r in recs}
    assert by_q["20.0"]["executed"] and by_q["21.0"]["mechanism"] == "T1" and by_q["0.0"]["mechanism"] == "wrong_tool"
    arm = res.summary["arms"][0]
    executed = [r["executed"] for r in recs]
    assert arm["protocol"] == "auto" and arm["execution_rate"]["value"] == pytest.approx(sum(executed) / 25)
    assert arm["agreement"]["value"] == pytest.approx(sum(r["agreement"] for r in recs) / 25)
    assert arm["mechanisms"]["T1"] == 1 and arm["stringified_type_errors"] == 1
    # resume: nothing new; then another protocol into the same directory adds an arm and the contrasts
    assert evaluate_agent(cfg, backend=backend).n_new == 0
    res2 = evaluate_agent(AgentRunConfig(
        selection=EpisodeSelection(conditions=set_default("agent"), limit=25), job=JobSettings(out=str(root), n_boot=200),
        agent=AgentSettings(slice="all", tool_choice="guided")),
                          backend=ScriptedBackend(lambda t: json.dumps(
                              {"name": "country_capital_lookup", "arguments": {"country": "X"}})))
    assert res2.n_new == 25 and [a["protocol"] for a in res2.summary["arms"]] == ["guided", "auto"]
    (c,) = res2.summary["contrasts"]
    assert (c["a"], c["b"], c["n_common"]) == ("guided", "auto", 25)
    # another slice is another identity: refused before anything runs
    with pytest.raises(RunStoreError, match="slice"):
        evaluate_agent(AgentRunConfig(
            selection=EpisodeSelection(conditions=set_default("agent"), limit=25), job=JobSettings(out=str(root), n_boot=200)), backend=backend)


def test_memory_right_slice_from_own_closed_book_pass(tmp_path, scripted):
    ScriptedBackend, call_text = scripted
    b = ScriptedBackend(lambda t: call_text("country_capital_lookup", {"country": "France"}), closed_book="FINAL: Paris")
    res = evaluate_agent(AgentRunConfig(
        selection=EpisodeSelection(conditions=set_default("agent"), limit=25),
        job=JobSettings(out=str(tmp_path / "r"), n_boot=100)), backend=b)
    assert [r["question_id"] for r in res.records] == ["20.0"]         # only Paris is right closed-book
    assert res.records[0]["executed"] and res.records[0]["agreement"]


def test_slice_from_a_finished_run(tmp_path, scripted):
    ScriptedBackend, call_text = scripted
    run = tmp_path / "eval"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"identity_sha256": "abc"}))
    base = {"formulation": "reference", "arm": "tool_right", "condition": "tool_right", "aliases": [],
            "mem_absent": False}
    rows = [{**base, "episode_id": "21-0-tool_right-v0", "question_id": "21.0", "question": "Capital of Japan?",
             "gold_answer": "Tokyo", "tool_output": {"result": "Tokyo"}, "memory_span": "Tokyo",
             "memory_correct": True},
            {**base, "episode_id": "22-0-tool_right-v0", "question_id": "22.0", "question": "Capital of Australia?",
             "gold_answer": "Canberra", "tool_output": {"result": "Canberra"}, "memory_span": "Sydney",
             "memory_correct": False}]
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = ScriptedBackend(lambda t: call_text("country_capital_lookup", {"country": "Japan"}), answer="FINAL: Tokyo")
    res = evaluate_agent(AgentRunConfig(
        selection=EpisodeSelection(conditions=set_default("agent"), limit=25), agent=AgentSettings(run=str(run)),
        job=JobSettings(out=str(tmp_path / "a"), n_boot=100)), backend=b)
    assert [r["episode_id"] for r in res.records] == ["21-0-tool_right-v0"] and res.records[0]["agreement"]
    assert b.requests == [r for r in b.requests if "Capital of Japan?" in r["text"]]   # no closed-book pass
    with pytest.raises(ConfigError, match="not a finished"):
        AgentRunConfig(agent=AgentSettings(run=str(tmp_path)), job=JobSettings(n_boot=2000, out=str(tmp_path / "b")))


def test_contrasts_use_the_common_support_only():
    def rec(ep, proto, agree, ex):
        return {"episode_id": ep, "repetition": 0, "protocol": proto, "question_id": ep, "agreement": agree,
                "executed": ex}
    recs = [rec("a", "auto", True, True), rec("b", "auto", False, False), rec("c", "auto", True, True),
            rec("a", "guided", True, True), rec("b", "guided", True, True), rec("d", "guided", False, False)]
    (c,) = protocol_contrasts(recs, n_boot=200, n_perm=200)
    assert (c["a"], c["b"], c["n_common"], c["n_only_a"], c["n_only_b"]) == ("guided", "auto", 2, 1, 1)
    assert c["agreement"]["delta"] == pytest.approx(((1 - 1) + (0 - 1)) / 2)


def test_config_refuses_bad_values_naming_the_option():
    with pytest.raises(ConfigError, match="--protocol"):
        AgentRunConfig(agent=AgentSettings(tool_choice="named"))
    with pytest.raises(ConfigError, match="--repetitions"):
        AgentRunConfig(agent=AgentSettings(repetitions=3))


def test_engine_call_parser_is_refused_off_vllm_before_anything_loads():
    with pytest.raises(ConfigError, match="--tool-call-parser hermes .*--backend vllm"):
        AgentRunConfig(agent=AgentSettings(tool_call_parser="hermes"))
    assert AgentRunConfig(
        agent=AgentSettings(tool_call_parser="hermes"), model_spec=ModelSpec(backend="vllm")).agent.tool_call_parser == "hermes"


def test_cli_refuses_an_engine_parser_off_vllm_in_one_line(tmp_path, capsys):
    from memtoc.cli import main

    rc = main(["agent", "evaluate", "--model", str(tmp_path / "absent"), "--tool-call-parser", "hermes",
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--tool-call-parser hermes" in err[0] and "--backend vllm" in err[0]
    assert not (tmp_path / "run").exists()
