"""The overreliance paper's Code Executor main evaluation (``--protocol paper``) pinned to its text: three
repetitions, override on problems correct in at least 2 of 3 no-tool runs, 50 calls and 16k output tokens per
run, an instruction to use the executor, Verify = additional tool use, the steering band by relative depth."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memtoc.backends.base import Generation
from memtoc.tasks.codeexec.agent import AgentConfig, TrialSpec, run_trials
from memtoc.tasks.codeexec.metrics import MetricsConfig, Trial, known_problem_ids, override_rate
from memtoc.tasks.codeexec.problems import generate_problems
from memtoc.tasks.codeexec.prompts import POLICIES, system_prompt
from memtoc.tasks.codeexec.protocol import apply_run_protocol, probe_site, steering_band
from memtoc.tasks.codeexec.run import CodeexecRunConfig
from memtoc.core.config import CodeexecTask, ConfigError
from memtoc.core.config import JobSettings



def _resolved(**values):
    """The config as the evaluate job runs it: built from the given keywords (the others None: not given), its
    run protocol resolved."""
    from memtoc.core.values import build_config
    from memtoc.tasks.codeexec.run import resolve_run_protocol

    return resolve_run_protocol(build_config(CodeexecRunConfig, values))


def test_paper_protocol_fills_the_main_evaluation_and_keeps_explicit_options():
    cfg = _resolved(protocol="paper", out="x")
    assert cfg.task.repetitions == 3 and cfg.agent.max_tool_rounds == 50 and cfg.agent.max_total_new_tokens == 16000
    assert cfg.agent.first_call == "model" and cfg.task.split == "all" and cfg.agent.temperature > 0
    assert {"repetitions", "max_tool_rounds", "split"} <= set(cfg.protocol_filled)
    # the steering study's own settings (4 rounds x 300 tokens) are explicit and stay
    cfg = _resolved(protocol="paper", out="x", max_tool_rounds=4, max_new_tokens=300)
    assert (cfg.agent.max_tool_rounds, cfg.agent.max_new_tokens, cfg.task.repetitions) == (4, 300, 3)
    # an option given at its default value is given: it stays
    default = CodeexecTask()
    cfg = _resolved(protocol="paper", out="x", repetitions=default.repetitions, split=default.split)
    assert (cfg.task.repetitions, cfg.task.split) == (1, "heldout") and cfg.agent.max_tool_rounds == 50
    assert "repetitions" not in cfg.protocol_filled
    assert CodeexecRunConfig(job=JobSettings(out="x")).task.repetitions is None         # not given
    assert _resolved(out="x").task.repetitions == 1                      # no protocol: the toolkit's defaults
    unset = CodeexecRunConfig(job=JobSettings(out="x"))
    task, agent, filled = apply_run_protocol("paper", unset.task, unset.agent)
    assert {"repetitions", "max_tool_rounds", "max_total_new_tokens"} <= set(filled)
    task, agent, filled = apply_run_protocol("paper", replace(unset.task, repetitions=1), unset.agent)
    assert task.repetitions == 1 and agent.max_tool_rounds == 50 and "repetitions" not in filled


def _trials(no_tool_hits: dict[str, int], adopted: set[str]) -> list[Trial]:
    out = []
    for pid, k in no_tool_hits.items():
        out += [Trial(pid, "no_tool", r, correct=r < k) for r in range(3)]
        out += [Trial(pid, "P1", r, correct=False, adopted=pid in adopted, tool_calls=1) for r in range(3)]
    return out


def test_override_support_is_two_of_three_no_tool_runs():
    # p0: correct in 3/3, p1: 2/3, p2: 1/3, p3: 0/3; each adopts the corrupted value in every P1 run but p0
    trials = _trials({"p0": 3, "p1": 2, "p2": 1, "p3": 0}, adopted={"p1", "p2", "p3"})
    cfg = MetricsConfig(repetitions=3, min_known_correct=2, n_boot=50)
    assert known_problem_ids(trials, cfg) == {"p0", "p1"}
    est = override_rate(trials, "P1", config=cfg)
    assert est.value == pytest.approx(3 / 6) and est.n_problems == 2     # p1's 3 adoptions over p0's + p1's 6 runs


def test_the_task_summary_uses_two_of_three():
    from memtoc.tasks.codeexec.task import CodeexecEvaluation

    cfg = _resolved(protocol="paper", out="x", n_boot=20)
    ev = CodeexecEvaluation(cfg)
    ev.problems = ["p0", "p1", "p2", "p3"]
    recs = [{"problem_id": t.problem_id, "condition": t.condition, "repetition": t.repetition, "correct": t.correct,
             "adopted": t.adopted, "tool_calls": t.tool_calls, "policy": t.policy}
            for t in _trials({"p0": 3, "p1": 2, "p2": 1, "p3": 0}, adopted={"p1", "p2", "p3"})]
    summary = ev.summarize(recs)
    assert summary["metrics_config"]["min_known_correct"] == 2 and summary["repetitions"] == 3
    (p1,) = [r for r in summary["rows"] if r["condition"] == "P1"]
    assert p1["override"]["value"] == pytest.approx(0.5)


def test_tool_conditions_instruct_the_model_to_use_the_executor_and_verify_means_more_calls():
    assert "Use the python_executor tool" in system_prompt("P1")
    assert "Use the python_executor tool" not in system_prompt("no_tool")
    verify = system_prompt("P1", "Verify")
    assert "additional python_executor calls" in verify and "independent calculation" not in verify
    assert list(POLICIES) == ["Plain", "Compare", "Verify", "Disclose"]
    with pytest.raises(ConfigError, match="Verify.*additional tool"):
        CodeexecRunConfig(job=JobSettings(out="x"), task=CodeexecTask(policy="Verify"),
                          agent=AgentConfig(max_tool_rounds=1))


class _Rambler:
    """Never calls the tool, never answers: 10 tokens a turn."""

    def format_messages(self, messages, *, tools):
        return json.dumps({"n": len(messages)})

    def generate_formatted(self, texts, config, *, edit=None):
        return [Generation(text="thinking about it ...", n_prompt_tokens=1, n_new_tokens=10, stop_reason="max_tokens")
                for _ in texts]

    protocol = "text"


def test_the_run_output_budget_ends_an_unanswered_run_as_incorrect():
    p = next(q for q in generate_problems(0) if q.split == "heldout")
    (res,) = run_trials(_Rambler(), [TrialSpec(p, "P1")], AgentConfig(max_total_new_tokens=10, max_tool_rounds=50))
    assert res.final_text == "" and res.graded.correct is False and res.turns[-1].get("out_of_budget")
    assert len(res.turns) == 1                        # the forced turn is not reached: the budget is spent
    (res,) = run_trials(_Rambler(), [TrialSpec(p, "P1")], AgentConfig(max_tool_rounds=50))
    assert len(res.turns) == 2 and res.forced_final   # no run budget: the unanswered turn is forced to answer


def test_steering_band_by_relative_depth_per_family():
    quiet = []
    assert steering_band("Qwen3MoeForCausalLM", 48, log=quiet.append) == (40, 41, 42)
    assert steering_band("GptOssForCausalLM", 24, log=quiet.append) == (20, 21, 22)
    assert not quiet                                              # the paper's own models: no fallback
    assert steering_band("Qwen3MoeForCausalLM", 24, log=quiet.append) == (20, 21, 22)   # rescaled, width kept
    said = []
    assert steering_band("LlamaForCausalLM", 30, log=said.append) == (25, 26, 27)   # the default model
    assert "FALLBACK" in said[-1]
    assert probe_site("LlamaForCausalLM", 30, log=said.append) == 26 and "FALLBACK" in said[-1]
