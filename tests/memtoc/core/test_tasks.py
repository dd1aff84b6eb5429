"""Benchmark families as tasks: MemToC and the code executor run through the same evaluate / extract / sweep code.

The spies wrap the generic jobs' shared pieces (``memtoc.tasks.evaluation.open_evaluation``, which every evaluation
runs, the activation writer of ``memtoc.jobs.extract.extract``, the CSV writer of ``memtoc.jobs.sweep.sweep``) and record which task passed through them; the
end-to-end checks compare the code-executor records the generic jobs write with independent references (the
agent loop run directly, a plain forward pass of the scripted conversation).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import activations.store as store_mod
import memtoc.jobs.sweep as sweep_mod
import memtoc.tasks.evaluation as evaluate_mod
from memtoc.jobs.extract import ExtractConfig, extract
from activations.store import open_store
from memtoc.jobs.codeexec import capture_codeexec, evaluate_codeexec, extract_codeexec, run_codeexec_sweep
from memtoc.tasks.codeexec.agent import AgentConfig, TrialSpec, formatter_for, run_trials, scripted_conversation
from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
from memtoc.tasks.codeexec.run import CodeexecRunConfig, plan_trials, resolve_run_protocol, select_problems
from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig
from memtoc.core.errors import MemtocError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.tasks import Task, UnknownTaskError, get_task, register_task, task_names, task_of
from steering.kinds.direction import DirectionEdit
from memtoc.jobs.sweep import run_sweep
from memtoc.tasks.memtoc.sweep import SweepConfig
from memtoc.bench.conditions import set_default
from memtoc.core.config import (CaptureSettings, CodeexecTask, EpisodeSelection, GenerationConfig, JobSettings,
                                SweepSettings)

AGENT = AgentConfig(first_call="scripted", max_new_tokens=5, max_tool_rounds=1)


def _edit(backend, toward: str) -> DirectionEdit:
    d = int(backend.model.config.hidden_size)
    vec = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return DirectionEdit.build(name="rand", layers=[1, 2], vectors={1: vec / vec.norm(), 2: vec / vec.norm()},
                               scale={1: 1.0, 2: 1.0}, positions="from_tool_return" if toward == "tool" else
                               "last_input", strength=1.0, toward=toward)


def _masked(record: dict) -> str:
    """A trial record as JSON with the sandbox's wall-clock durations masked (they differ run to run)."""
    return re.sub(r'"duration_s": [0-9.e-]+', '"duration_s": 0', json.dumps(record, ensure_ascii=False))


@pytest.fixture
def spies(monkeypatch):
    """Which task went through each generic job's shared code."""
    seen: dict[str, list[str]] = {"evaluate": [], "extract": [], "sweep_csv": []}
    real_eval = evaluate_mod.open_evaluation     # every evaluation opens its run through the shared job

    def eval_spy(cfg, *, task=None, **kw):
        seen["evaluate"].append(task_of(cfg, task).name)
        return real_eval(cfg, task=task, **kw)
    monkeypatch.setattr(evaluate_mod, "open_evaluation", eval_spy)

    real_writer = store_mod.ActivationWriter     # the extract job imports it when it runs

    class WriterSpy:
        @staticmethod
        def open(path, *, identity, **kw):
            seen["extract"].append(identity.get("family", "memtoc"))
            return real_writer.open(path, identity=identity, **kw)
    monkeypatch.setattr(store_mod, "ActivationWriter", WriterSpy)

    real_csv = sweep_mod.write_records_csv_atomic

    def csv_spy(path, rows):
        seen["sweep_csv"].append("codeexec" if any(k.startswith("P0_") for k in rows[0]) else "memtoc")
        return real_csv(path, rows)
    monkeypatch.setattr(sweep_mod, "write_records_csv_atomic", csv_spy)
    return seen


# -- the registry --------------------------------------------------------------------------------------------

def test_both_families_are_registered_tasks_found_from_their_configs():
    assert {"memtoc", "codeexec"} <= set(task_names())
    for name in ("memtoc", "codeexec"):
        assert isinstance(get_task(name), Task) and get_task(name).name == name
    assert task_of(EvaluationConfig()).name == "memtoc" and task_of(SweepConfig()).name == "memtoc"
    for cfg in (CodeexecRunConfig(), CodeexecExtractConfig(), CodeexecSweepConfig()):
        assert task_of(cfg).name == "codeexec"
    assert task_of(EvaluationConfig(), "codeexec").name == "codeexec"


def test_an_unknown_task_is_a_one_line_user_error():
    with pytest.raises(UnknownTaskError, match=r"unknown task 'nope'; choose from .*codeexec.*memtoc") as exc:
        get_task("nope")
    assert isinstance(exc.value, MemtocError) and "\n" not in str(exc.value)
    with pytest.raises(TypeError, match="not a Task"):
        register_task(object())


# -- the same code path ----------------------------------------------------------------------------------------

def test_codeexec_and_memtoc_evaluate_through_the_same_job(tiny_backend, tmp_path, spies):
    cfg = resolve_run_protocol(CodeexecRunConfig(
        job=JobSettings(out=str(tmp_path / "cx"), n_boot=20, progress=False),
        task=CodeexecTask(conditions=("P0", "P1+", "no_tool"), limit=2), agent=AGENT))
    res = evaluate_codeexec(cfg, tiny_backend)
    evaluate(EvaluationConfig(
        selection=EpisodeSelection(benchmark="demo", limit=2), generation=GenerationConfig(max_new_tokens=4),
        job=JobSettings(out=str(tmp_path / "mt"), progress=False)), backend=tiny_backend, log=lambda s: None)
    assert spies["evaluate"] == ["codeexec", "memtoc"]
    # the records equal the agent loop run directly on the same trials (an independent reference)
    fmt = formatter_for(tiny_backend, AGENT.call_format)
    plan = plan_trials(select_problems(cfg.job.seed, cfg.task.split, cfg.task.limit), cfg.task.conditions, cfg.task.policy, 1)
    direct = [r.to_record() for r in run_trials(tiny_backend, plan, AGENT, formatter=fmt)]
    lines = (res.root / "trials.jsonl").read_text(encoding="utf-8").splitlines()
    by_key = {json.loads(line)["key"]: line for line in lines}
    assert len(by_key) == len(plan) == 6
    assert [_masked(json.loads(by_key[r["key"]])) for r in direct] == [_masked(r) for r in direct]
    summary = json.loads((res.root / "summary.json").read_text())
    assert summary["n_trials"] == 6 and summary["conditions"] == ["no_tool", "P0", "P1+"] == list(cfg.task.conditions)
    # resuming runs nothing, through the same job
    again = evaluate_codeexec(cfg, tiny_backend)
    assert again.n_new == 0 and (res.root / "trials.jsonl").read_text(encoding="utf-8").splitlines() == lines
    assert spies["evaluate"] == ["codeexec", "memtoc", "codeexec"]


def test_codeexec_and_memtoc_extract_through_the_same_job(tiny_backend, tmp_path, spies):
    cx = CodeexecExtractConfig(
        job=JobSettings(out=str(tmp_path / "cx.h5"), progress=False),
        task=CodeexecTask(split="dev", conditions=("P0", "P1+"), limit=2),
        capture=CaptureSettings(layers="all", position_kinds="last_input"))
    res = capture_codeexec(cx, backend=tiny_backend, log=lambda s: None)     # the family's body, same capture library
    mt = extract(ExtractConfig(
        selection=EpisodeSelection(benchmark="demo", limit=2),
        capture=CaptureSettings(layers="all", position_kinds="last_input"),
        job=JobSettings(out=str(tmp_path / "mt.h5"), progress=False)), backend=tiny_backend)
    assert spies["extract"] == ["codeexec", "memtoc"]
    assert res.complete and res.n_done == res.n_planned == 4 and mt.complete
    fmt = formatter_for(tiny_backend, cx.agent.call_format)
    with open_store(tmp_path / "cx.h5") as store:
        idx = store.index
        assert set(idx["arm"]) == {"codeexec"} and store.attrs["identity"]["family"] == "codeexec"
        for row, (qid, cond) in enumerate(zip(idx["question_id"], idx["condition"])):
            problem = next(p for p in select_problems(cx.job.seed, "dev", 2) if p.id == qid)
            conv = scripted_conversation(TrialSpec(problem=problem, condition=cond, policy=cx.task.policy), fmt, cx.agent)
            enc = tiny_backend.tokenizer(conv.text, return_tensors="pt", add_special_tokens=not tiny_backend.chat)
            with torch.no_grad():
                hs = tiny_backend.model(**enc, output_hidden_states=True).hidden_states
            np.testing.assert_allclose(store.read(1, [row])[0], hs[1][0, -1].numpy(), rtol=1e-4, atol=1e-5)
    # the code-executor wrapper is the same job: it resumes the store the body wrote
    again = extract_codeexec(cx, backend=tiny_backend, log=lambda s: None)
    assert again["n_new"] == 0 and again["complete"] and spies["extract"][-1] == "codeexec"


def test_codeexec_and_memtoc_sweep_through_the_same_job(tiny_backend, tmp_path, spies):
    cfg = CodeexecSweepConfig(
        sweep=SweepSettings(direction=None, strengths="0,50", n_perm=20, plot=False),
        job=JobSettings(out=str(tmp_path / "cx"), n_boot=20, progress=False),
        task=CodeexecTask(conditions=("P0", "P1+"), limit=2), agent=AGENT)
    res = run_sweep(cfg, backend=tiny_backend, edit=_edit(tiny_backend, "tool"), log=lambda s: None)
    run_sweep(SweepConfig(
        selection=EpisodeSelection(conditions=set_default("sweep"), benchmark="demo", limit=2),
        generation=GenerationConfig(max_new_tokens=4), sweep=SweepSettings(strengths="0,4", n_perm=20, plot=False),
        job=JobSettings(out=str(tmp_path / "mt"), n_boot=20, progress=False)),
              backend=tiny_backend, edit=_edit(tiny_backend, "memory"), log=lambda s: None)
    assert spies["evaluate"] == ["codeexec", "codeexec", "memtoc", "memtoc"]      # one evaluation per strength
    assert spies["sweep_csv"] == ["codeexec", "memtoc"]
    assert [r["strength"] for r in res.rows] == [0.0, 50.0]
    saved = json.loads(res.files["json"].read_text())
    assert saved["schema_version"] == "memtoc-codeexec-sweep-v1" and saved["config"]["family"] == "codeexec"
    # strength 0 reproduces the unedited evaluation of the same trials; the wrapper is the same job
    plain = evaluate_codeexec(CodeexecRunConfig(
        job=JobSettings(out=str(tmp_path / "plain"), n_boot=20, progress=False),
        task=CodeexecTask(conditions=("P0", "P1+"), limit=2), agent=AGENT), tiny_backend)
    zero = [json.loads(line) for line in (res.run_dirs[0.0] / "trials.jsonl").read_text().splitlines()]
    assert [r["final_text"] for r in zero] == [r["final_text"] for r in plain.records]
    again = run_codeexec_sweep(cfg, backend=tiny_backend, edit=_edit(tiny_backend, "tool"), log=lambda s: None)
    assert again.markdown == res.markdown and spies["sweep_csv"][-1] == "codeexec"
