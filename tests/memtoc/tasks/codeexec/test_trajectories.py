"""Probes on model-initiated trajectories: ``codeexec extract --run`` captures each trial's prompt after its own
first tool return and labels it by what the model did (accepted / adopted / rejected / ...)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from activations.store import open_store
from memtoc.backends.base import Generation
from memtoc.tasks.codeexec.agent import AgentConfig, ChatFormatter
from memtoc.jobs.codeexec import evaluate_codeexec, extract_codeexec
from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
from memtoc.tasks.codeexec.prompts import scripted_call
from memtoc.tasks.codeexec.run import CodeexecRunConfig, select_problems
from memtoc.core.config import CaptureSettings, CodeexecTask, JobSettings

_NUM = re.compile(r"-?\d+(?:\.\d+)?")


class ScriptedTiny:
    """The tiny model's tokenizer and weights, with replies from a script (the random model never calls tools):
    problem 0 answers without the tool; problem 1 adopts the returned number; problem 2 answers the gold."""

    def __init__(self, tiny, problems) -> None:
        self.tiny, self.problems = tiny, problems

    def provenance(self):
        return self.tiny.provenance()

    def generate_formatted(self, texts, config, *, edit=None):
        out = []
        for t in texts:
            i, p = next((i, p) for i, p in enumerate(self.problems) if p.question in t)
            returned = t.split("python_executor output:")[1:]
            if not returned:
                reply = f"Let me compute.\n{scripted_call(p.op, p.a, p.b)[1]}" if i > 0 else "FINAL ANSWER: 1"
            else:
                reply = f"FINAL ANSWER: {_NUM.findall(returned[0])[0] if i == 1 else p.gold}"
            out.append(Generation(text=reply, n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos"))
        return out


@pytest.fixture(scope="module")
def run_dir(tiny_backend, tmp_path_factory):
    problems = select_problems(0, "dev", 3)
    backend = ScriptedTiny(tiny_backend, problems)
    out = tmp_path_factory.mktemp("traj") / "run"
    cfg = CodeexecRunConfig(
        job=JobSettings(out=str(out), n_boot=20, progress=False),
        task=CodeexecTask(split="dev", limit=3, conditions=("no_tool", "P0", "P1", "P2")),
        agent=AgentConfig(max_tool_rounds=4, max_new_tokens=300))
    fmt = ChatFormatter(tiny_backend.tokenizer, chat=tiny_backend.chat)
    res = evaluate_codeexec(cfg, backend, formatter=fmt)
    return out, res.records, fmt


def test_outcome_labels_follow_what_the_model_did(run_dir):
    from memtoc.tasks.codeexec.problems import generate_problems
    from memtoc.tasks.codeexec.trajectories import trial_outcome

    _, records, _ = run_dir
    by_id = {p.id: p for p in generate_problems(0)}
    problems = select_problems(0, "dev", 3)
    got = {(r["problem_id"], r["condition"]): trial_outcome(r, by_id[r["problem_id"]]) for r in records}
    p0, p1, p2 = (p.id for p in problems)
    # no tool return -> no prompt (problem 0 never calls; no_tool has no tool)
    assert all(got[(p0, c)] is None for c in ("no_tool", "P0", "P1", "P2"))
    assert got[(p1, "no_tool")] is None
    # labels are what the model did, not the condition
    assert got[(p1, "P0")] == got[(p2, "P0")] == "accepted"
    assert got[(p1, "P1")] == got[(p1, "P2")] == "adopted"
    assert got[(p2, "P1")] == got[(p2, "P2")] == "rejected"


def test_trajectory_extract_equals_a_direct_forward_of_the_recorded_prompt(run_dir, tiny_backend, tmp_path):
    out_run, records, fmt = run_dir
    acts = tmp_path / "acts.h5"
    cfg = CodeexecExtractConfig(
        job=JobSettings(out=str(acts), progress=False), run=str(out_run),
        task=CodeexecTask(split="dev", limit=3, conditions=("P0", "P1", "P2")),
        capture=CaptureSettings(layers="all", position_kinds="last_input"))
    res = extract_codeexec(cfg, backend=tiny_backend)
    assert res["complete"] and res["n_done"] == 6          # 2 problems with a return x 3 conditions
    with open_store(acts) as store:
        idx = store.index
        outcomes = dict(zip(idx["episode_id"], idx["outcome"]))
        assert sorted(set(outcomes.values())) == ["accepted", "adopted", "rejected"]
        assert set(idx["question_id"]) == {r["problem_id"] for r in records if r["first_return_message"]}
        for r in records:
            if r["first_return_message"] is None or r["condition"] == "no_tool":
                assert r["key"] not in outcomes
                continue
            # reference: the prompt of the model turn after the first return, exactly as the loop rendered it
            turn = next(t for t in r["turns"] if t["n_prompt_messages"] > r["first_return_message"])
            text = fmt.format_messages(r["messages"][:turn["n_prompt_messages"]], tools=turn["tools_offered"])
            assert "python_executor output:" in text and text.rstrip().endswith("assistant")
            enc = tiny_backend.tokenizer(text, return_tensors="pt", add_special_tokens=not tiny_backend.chat)
            with torch.no_grad():
                hs = tiny_backend.model(**enc, output_hidden_states=True).hidden_states
            (row,) = np.flatnonzero(idx["episode_id"] == r["key"])
            for site in store.layers[:-1]:       # the last hidden state has the final norm applied
                np.testing.assert_allclose(store.read(site, [row])[0], hs[site][0, -1].numpy(), rtol=1e-4, atol=1e-5)
    again = extract_codeexec(cfg, backend=tiny_backend, log=lambda s: None)
    assert again["n_new"] == 0


def test_extract_refuses_a_run_of_another_problem_set(run_dir, tmp_path):
    out_run, _, _ = run_dir
    cfg = CodeexecExtractConfig(
        job=JobSettings(out=str(tmp_path / "a.h5"), seed=1), run=str(out_run),
        task=CodeexecTask(split="dev", conditions=("P0",)))
    with pytest.raises(ValueError, match="seed"):
        extract_codeexec(cfg, backend=object())
