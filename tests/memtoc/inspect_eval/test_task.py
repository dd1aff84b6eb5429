"""MemToC as an Inspect task: the EvalLog's decisions and metrics equal ``memtoc evaluate``'s and ``memtoc
metrics``' on the same responses (a scripted model, no weights); the default model through Inspect's hf provider;
the entry point and Inspect's OpenAI-compatible provider against ``memtoc serve`` (the ``inspect eval`` command)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai.model import ChatMessageAssistant, GenerateConfig, ModelAPI, ModelOutput, ModelUsage  # noqa: E402
from inspect_ai.model import get_model, modelapi  # noqa: E402
from inspect_ai.model._model_output import ChatCompletionChoice  # noqa: E402

from memtoc.backends.base import Generation  # noqa: E402
from memtoc.core.values import ConfigError  # noqa: E402
from memtoc.core.values import build_config  # noqa: E402
from memtoc.inspect_eval.plan import plan_run, records_of, task_options  # noqa: E402
from memtoc.inspect_eval.scorer import DECISIONS, HEADLINE_METRICS  # noqa: E402
from memtoc.inspect_eval.task import memtoc  # noqa: E402
from memtoc.jobs.evaluate import run_evaluate  # noqa: E402
from memtoc.jobs.metrics import MetricsConfig, run_metrics  # noqa: E402
from memtoc.scoring.metrics import cell_counts  # noqa: E402
from memtoc.tasks.memtoc.evaluation import EvaluationConfig  # noqa: E402
from memtoc.core.config import ModelSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
#: four demo questions, two formulations, every condition the headline metrics read
OPTIONS = {"limit": 4, "formulations": "reference,paraphrase_a", "conditions": "tool_wrong,tool_right,tool_error,no_tool"}


def _script() -> dict[str, str]:
    """prompt -> answer: right, absent and wrong memories; answers that follow the tool, keep the gold, abstain or
    ramble, so every outcome and cell occurs."""
    plan = plan_run(task_options(OPTIONS))
    out: dict[str, str] = {}
    for i, ep in enumerate(plan.episodes):
        q = ep.question
        k = int(q.id.split("-")[0]) if q.id.split("-")[0].isdigit() else i
        out.setdefault(ep.closed_book_prompt, [f"FINAL: {q.gold_answer}\n", "FINAL: I don't know\n",
                                               "Hmm.\nFINAL: Wrongville\n"][k % 3])
        if ep.with_tool_prompt is not None:
            out[ep.with_tool_prompt] = [f"The tool says so.\nFINAL: {ep.tool_value}\n", f"FINAL: {q.gold_answer}\n",
                                        "FINAL: I cannot answer that.\n", "No marker here"][i % 4]
    return out


SCRIPT = _script()


class ScriptAPI(ModelAPI):
    """An Inspect model answering each prompt from :data:`SCRIPT` (greedy and deterministic, as MemToC decodes)."""

    async def generate(self, input, tools, tool_choice, config: GenerateConfig) -> ModelOutput:
        text = SCRIPT[input[-1].text]
        return ModelOutput(model=self.model_name, choices=[ChatCompletionChoice(
            message=ChatMessageAssistant(content=text, model=self.model_name), stop_reason="stop")],
            usage=ModelUsage(input_tokens=len(input[-1].text), output_tokens=len(text),
                             total_tokens=len(input[-1].text) + len(text)))


@modelapi(name="memtoc-script")
def _script_api():
    return ScriptAPI


class ReplayBackend:
    """A memtoc backend answering each prompt with a recorded answer (the same responses, fed to evaluate)."""

    name, chat, tokenizer = "replay", False, None
    capabilities = frozenset({"generate"})

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def generate(self, prompts, config, *, edit=None):
        return [Generation(text=self.answers[p], n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")
                for p in prompts]

    def provenance(self):
        return {"backend": "replay", "model": "replay", "weights": {"sha256": "0"}, "dtype": "float32",
                "chat_template_sha256": None}


def _evaluate(tmp: Path, backend, options=OPTIONS) -> list[dict]:
    cfg = build_config(EvaluationConfig, {**options, "out": str(tmp), "progress": False})
    return run_evaluate(cfg, backend=backend, log=lambda s: None).records


def _decisions(records) -> dict[str, dict]:
    return {r["episode_id"]: {k: r[k] for k in DECISIONS} for r in records}


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _check_against_memtoc(log, records: list[dict], run_dir: Path) -> None:
    """The EvalLog's per-sample decisions equal the records', its metrics equal ``memtoc metrics``' on the run."""
    assert log.status == "success", log.error
    scored = records_of(log.samples)
    assert len(scored) == len(log.samples) == len(records)
    assert _decisions(scored) == _decisions(records)
    for s in log.samples:       # the score carries the same decisions as the sample's record
        assert s.scores["memtoc_scorer"].metadata == {k: s.metadata[k] for k in DECISIONS}
    table = run_metrics(MetricsConfig(run=str(run_dir), n_boot=10)).tables["deterministic"]
    metrics = log.results.scores[0].metrics
    for name in HEADLINE_METRICS:
        assert _same(metrics[name].value, table[name].pooled.value), name
    for cell, n in cell_counts(records).items():
        assert metrics[f"cell_{cell}"].value == n, cell


def test_the_eval_log_has_memtoc_evaluates_decisions_and_metrics_on_the_same_responses(tmp_path):
    log = inspect_ai.eval(memtoc(**OPTIONS), model=get_model("memtoc-script/demo"), log_dir=str(tmp_path / "logs"),
                          display="none")[0]
    records = _evaluate(tmp_path / "run", ReplayBackend(SCRIPT))
    assert len({r["outcome"] for r in records}) >= 3 and len({r["cell"] for r in records}) >= 4  # a test that can fail
    _check_against_memtoc(log, records, tmp_path / "run")
    # the sample's metadata is the run's record (plus the closed-book answer), prompts and responses included
    by_id = {r["episode_id"]: r for r in records}
    s = log.samples[0]
    assert {k: v for k, v in s.metadata.items() if k != "closed_book_response"} == \
        {k: v for k, v in by_id[s.id].items() if k not in ("n_prompt_tokens", "n_new_tokens", "stop_reason")} | \
        {k: s.metadata[k] for k in ("n_prompt_tokens", "n_new_tokens", "stop_reason")}
    # `memtoc metrics --input` on the log's records gives the run's table
    (tmp_path / "scored.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records_of(log.samples)))
    a = run_metrics(MetricsConfig(input=str(tmp_path / "scored.jsonl"), n_boot=10)).doc
    b = run_metrics(MetricsConfig(run=str(tmp_path / "run"), n_boot=10)).doc
    assert a == b


def test_a_bad_option_is_one_line_before_any_model_call():
    with pytest.raises(ConfigError, match="^memtoc task: limit 0: must be at least 1$"):
        memtoc(limit=0)
    with pytest.raises(ConfigError, match="unknown task option"):
        task_options({"model": "x"})
    with pytest.raises(ConfigError, match="formulation and -T formulations"):
        memtoc(formulation="reference", formulations="paraphrase_a")


REAL = {"limit": 4, "conditions": "tool_wrong"}     # what docs/inspect.md's Python example runs


def _doc_python() -> str:
    import re

    text = (REPO / "docs" / "inspect.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.slow
@pytest.mark.real_model
def test_the_docs_python_example_on_the_default_model_through_inspects_hf_provider(default_model, tmp_path,
                                                                                   monkeypatch):
    """docs/inspect.md's Python example as written (`hf/<the default model's directory>`, 4 demo questions): the
    responses Inspect got, fed to `memtoc evaluate`, give the log's decisions and metrics."""
    import runpy

    monkeypatch.chdir(tmp_path)                          # its logs land here
    snippet = tmp_path / "inspect_example.py"
    snippet.write_text(_doc_python(), encoding="utf-8")
    log = runpy.run_path(str(snippet))["log"]
    records = _evaluate(tmp_path / "run", ReplayBackend(_answers(log)), REAL)
    _check_against_memtoc(log, records, tmp_path / "run")


def _answers(log) -> dict[str, str]:
    """prompt -> the answer the log holds (closed-book and tool pass): the responses to feed `memtoc evaluate`."""
    answers = {}
    for s in log.samples:
        answers[s.metadata["closed_book_prompt"]] = s.metadata["closed_book_response"]
        answers[s.metadata["prompt"]] = s.metadata["response"]
    return answers


@pytest.mark.real_model
def test_inspect_eval_against_memtoc_serve_gives_memtoc_evaluates_decisions(default_backend, tmp_path):
    """The `inspect eval memtoc/memtoc` command (the entry point) with Inspect's OpenAI-compatible provider against
    `memtoc serve` (the default model, 127.0.0.1, 2 demo questions: CI time): one closed-book request per question, and the
    log's decisions and metrics are `memtoc evaluate`'s and `memtoc metrics`' on the same responses."""
    from importlib.metadata import entry_points

    from inspect_ai.log import list_eval_logs, read_eval_log

    from memtoc.jobs.serve import ServeConfig, start_server

    if "memtoc" not in {e.name for e in entry_points(group="inspect_ai")}:
        pytest.skip("this environment's memtoc install predates the inspect_ai entry point (pip install -e .)")
    options = {**REAL, "limit": 2, "max_new_tokens": 32}   # the server decodes to the budget (the solver cuts at FINAL)
    server = start_server(ServeConfig(
        port=0, model_spec=ModelSpec(model="default")), backend=default_backend).start_engine()
    try:
        cmd = [str(Path(sys.executable).parent / "inspect"), "eval", "memtoc/memtoc", "--model",
               "openai-api/memtoc/default", "--model-base-url", f"{server.url}/v1", "--log-dir",
               str(tmp_path / "logs"), "--display", "none", *[a for k, v in options.items() for a in ("-T", f"{k}={v}")]]
        env = {**os.environ, "MEMTOC_API_KEY": "unused", "PYTHONPATH": str(REPO)}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path)
        asked = server.stats.rows_asked
    finally:
        server.close()
    assert done.returncode == 0, done.stderr[-2000:]
    log = read_eval_log(list_eval_logs(str(tmp_path / "logs"))[0])
    assert len(log.samples) == 2 and asked == 4      # 2 closed-book answers (one per question), 2 tool-pass answers
    records = _evaluate(tmp_path / "run", ReplayBackend(_answers(log)), options)
    _check_against_memtoc(log, records, tmp_path / "run")


def test_a_sampling_hf_provider_is_refused_in_one_line(tiny_model_dir, tmp_path):
    """Inspect's hf provider samples unless `do_sample=false`: the task refuses it rather than score sampled text."""
    log = inspect_ai.eval(memtoc(limit=1, conditions="tool_wrong"), model=get_model(f"hf/{tiny_model_dir}",
                          device="cpu"), log_dir=str(tmp_path / "logs"), display="none")[0]
    assert log.status == "error"
    assert "the hf provider samples by default; MemToC decodes greedily: pass -M do_sample=false" in log.error.message


RAMBLE = "Thinking.\nFINAL: Paris\nand more words past the line"


class RambleAPI(ModelAPI):
    """An Inspect model that, like a generic server, decodes past its FINAL line (to the budget)."""

    async def generate(self, input, tools, tool_choice, config: GenerateConfig) -> ModelOutput:
        return ModelOutput(model=self.model_name, choices=[ChatCompletionChoice(
            message=ChatMessageAssistant(content=RAMBLE, model=self.model_name), stop_reason="max_tokens")],
            usage=ModelUsage(input_tokens=5, output_tokens=9, total_tokens=14))


@modelapi(name="memtoc-ramble")
def _ramble_api():
    return RambleAPI


@pytest.mark.parametrize("stop,given", [(True, None), (True, True), (False, False)])
def test_the_solver_follows_the_runs_stop_at_final_line(stop, given, tmp_path):
    """``stop_at_final_line`` (the evaluation's default, True, or ``-T stop_at_final_line=...``) reaches the
    solver's answers as it reaches an evaluate backend's: cut after the FINAL line with stop reason final_line when
    on, the whole text to the budget when off; the closed-book answer alike."""
    opts = {"limit": 1, "conditions": "tool_wrong", "stop_at_final_line": given}
    log = inspect_ai.eval(memtoc(**opts), model=get_model("memtoc-ramble/demo"), log_dir=str(tmp_path / "logs"),
                          display="none")[0]
    assert log.status == "success", log.error
    meta = log.samples[0].metadata
    want = "Thinking.\nFINAL: Paris\n" if stop else RAMBLE
    assert meta["response"] == meta["closed_book_response"] == want
    assert meta["stop_reason"] == ("final_line" if stop else "max_tokens")
