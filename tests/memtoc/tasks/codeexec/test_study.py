"""The probe-and-steer study of the code-executor family: scripted first call, first-return spans, edits in the
agent loop, the capture into the activation store, and the sweep through ``memtoc codeexec sweep``."""

from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pytest
import torch

from activations.store import open_store
from memtoc.tasks.codeexec.agent import (
    AgentConfig,
    ChatFormatter,
    TrialSpec,
    first_return_span,
    run_trials,
    scripted_conversation,
)
from memtoc.jobs.codeexec import evaluate_codeexec, extract_codeexec
from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
from memtoc.tasks.codeexec.conditions import corrupt_stdout
from memtoc.tasks.codeexec.prompts import scripted_call
from memtoc.tasks.codeexec.run import CodeexecRunConfig, select_problems
from steering.kinds.direction import DirectionEdit
from memtoc.core.config import CaptureSettings, CodeexecTask, JobSettings, SweepSettings


@pytest.fixture(scope="module")
def problems():
    return select_problems(0, "heldout", None)


def _fmt(backend):
    return ChatFormatter(backend.tokenizer, chat=backend.chat)


def _edit(backend, strength: float, positions: str = "from_tool_return") -> DirectionEdit:
    d = int(backend.model.config.hidden_size)
    g = torch.Generator().manual_seed(0)
    vec = torch.randn(d, generator=g)
    return DirectionEdit.build(name="rand", layers=[1, 2], vectors={1: vec / vec.norm(), 2: vec / vec.norm()},
                               scale={1: 1.0, 2: 1.0}, positions=positions, strength=strength, toward="tool")


# -- scripted first call -------------------------------------------------------------------------------------

def test_scripted_code_computes_the_gold_answer(problems):
    """The scripted call of every operation really prints the problem's answer (checked on one per op)."""
    from memtoc.tasks.codeexec.sandbox import run_python

    seen = set()
    for p in problems:
        if p.op in seen:
            continue
        seen.add(p.op)
        code, content = scripted_call(p.op, p.a, p.b)
        assert content.startswith("```python\n") and code in content
        ex = run_python(code)
        assert ex.ok, ex.stderr
        assert abs(Decimal(ex.stdout.strip()) - Decimal(p.gold)) <= Decimal("0.0015"), (p.id, ex.stdout)
    assert seen == {"add", "mul", "div", "mod", "log", "pow"}


def test_scripted_conversation_shows_the_corrupted_return(tiny_backend, problems):
    p = problems[0]
    fmt = _fmt(tiny_backend)
    cfg = AgentConfig(first_call="scripted")
    true = scripted_conversation(TrialSpec(problem=p, condition="P0"), fmt, cfg)
    bad = scripted_conversation(TrialSpec(problem=p, condition="P1+"), fmt, cfg)
    expected = corrupt_stdout(true.tool_return, p.factors.factor("P1+")).text
    assert bad.tool_return == expected != true.tool_return
    for conv in (true, bad):
        a, b = conv.return_span
        assert conv.tool_return.strip() in conv.text[a:b]
        assert conv.text.endswith(fmt.format_messages(conv.messages, tools=True)[-30:])
        # the prompt ends with the generation prompt of the model's reply to the return
        assert conv.text == fmt.format_messages(conv.messages, tools=True)
    # the two conversations differ only inside the return
    a, b = true.return_span
    assert true.text[:a] == bad.text[:a] and true.text[b:] == bad.text[b + len(bad.text) - len(true.text):]


def test_first_return_span_skips_earlier_copies_of_the_return(tiny_backend):
    """The return text also occurs earlier (in the question and the code); the span is the return message's."""
    fmt = _fmt(tiny_backend)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Print 42.5\n please."},
                {"role": "assistant", "content": "```python\nprint('42.5\\n')\n```"},
                {"role": "user", "content": "42.5\n"}]
    text = fmt.format_messages(messages, tools=True)
    a, b = first_return_span(fmt, messages, 3, text, tools=True)
    assert text[a:b] == "42.5\n"
    assert a > text.rindex("print") and text.find("42.5\n") < a
    assert first_return_span(fmt, messages, None, text, tools=True) is None


def test_scripted_trials_count_only_the_models_own_calls(problems):
    """Records of scripted trials: the scripted turn first, its return corrupted in P1, model calls counted apart."""
    from tests.memtoc.tasks.codeexec.test_agent import FakeBackend

    p = problems[0]
    backend = FakeBackend(lambda messages, tools: "FINAL ANSWER: 1.000")
    res = run_trials(backend, [TrialSpec(problem=p, condition="P1+"), TrialSpec(problem=p, condition="no_tool")],
                     AgentConfig(first_call="scripted"))
    tool, none = res
    assert tool.turns[0]["kind"] == "scripted_call" and tool.turns[0]["tool_call"]["tool_return"]["corrupted"]
    assert tool.scripted_call and tool.tool_calls == 0 and tool.first_return_message == 3
    assert tool.corrupted_numbers and not tool.forced_final
    assert not none.scripted_call and none.first_return_message is None
    # the first model turn already saw the return
    first_prompt = backend.batches[0][0]["messages"]
    assert first_prompt[-1]["content"].startswith("python_executor output:")
    # one round only: the scripted call uses it and the model is asked for its final answer at once
    backend2 = FakeBackend(lambda messages, tools: "FINAL ANSWER: 1.000")
    (r,) = run_trials(backend2, [TrialSpec(problem=p, condition="P0")], AgentConfig(first_call="scripted",
                                                                                     max_tool_rounds=1))
    assert r.forced_final and backend2.batches[0][0]["tools"] is False
    with pytest.raises(ValueError, match="max_tool_rounds >= 1"):
        AgentConfig(first_call="scripted", max_tool_rounds=0)


# -- edits in the agent loop ---------------------------------------------------------------------------------

class _RecordingEdit:
    """Stands in for an Edit: records what ``run_trials`` binds it to."""

    def __init__(self) -> None:
        self.bound: list[tuple[list[str], list]] = []

    def bind(self, texts, spans):
        self.bound.append((list(texts), list(spans)))
        return None          # generate_formatted then runs unedited


def test_edit_is_bound_to_each_rows_first_return(tiny_backend, problems):
    rec = _RecordingEdit()
    specs = [TrialSpec(problem=problems[0], condition="P1+"), TrialSpec(problem=problems[0], condition="no_tool")]
    run_trials(tiny_backend, specs, AgentConfig(first_call="scripted", max_new_tokens=4, max_tool_rounds=1),
               edit=rec)
    texts, spans = rec.bound[0]
    a, b = spans[0]
    assert texts[0][a:b].startswith("python_executor output:")
    assert spans[1] is None                      # no_tool: nothing to edit


def test_direction_edit_from_first_return(tiny_backend, problems):
    """Strength 0 reproduces the unedited run; a strong edit changes tool trials only (no_tool has no return)."""
    specs = [TrialSpec(problem=p, condition=c) for p in problems[:2] for c in ("P0", "no_tool")]
    cfg = AgentConfig(first_call="scripted", max_new_tokens=6, max_tool_rounds=1)
    plain = run_trials(tiny_backend, specs, cfg)
    zero = run_trials(tiny_backend, specs, cfg, edit=_edit(tiny_backend, 0.0))
    strong = run_trials(tiny_backend, specs, cfg, edit=_edit(tiny_backend, 200.0))
    texts = lambda rs: [[t["generation"]["text"] for t in r.turns if t["generation"]] for r in rs]  # noqa: E731
    assert texts(zero) == texts(plain)
    for p_, s_, spec in zip(texts(plain), texts(strong), specs):
        assert (p_ == s_) == (spec.condition == "no_tool"), spec


# -- capture -------------------------------------------------------------------------------------------------

def test_extract_equals_output_hidden_states(tiny_backend, tmp_path):
    out = tmp_path / "acts.h5"
    cfg = CodeexecExtractConfig(
        job=JobSettings(out=str(out), progress=False),
        task=CodeexecTask(split="dev", conditions=("P0", "P1-"), limit=2),
        capture=CaptureSettings(layers="all", position_kinds="last_input,tool_span"),
        agent=AgentConfig(first_call="scripted", batch_size=3))
    res = extract_codeexec(cfg, backend=tiny_backend)
    assert res["complete"] and res["n_done"] == 4
    fmt = _fmt(tiny_backend)
    probs = select_problems(0, "dev", 2)
    with open_store(out) as store:
        idx = store.index
        assert set(idx["condition"]) == {"P0", "P1-"} and set(idx["question_id"]) == {p.id for p in probs}
        for p in probs:
            conv = scripted_conversation(TrialSpec(problem=p, condition="P1-"), fmt, cfg.agent)
            enc = tiny_backend.tokenizer(conv.text, return_tensors="pt", add_special_tokens=not tiny_backend.chat)
            with torch.no_grad():
                hs = tiny_backend.model(**enc, output_hidden_states=True).hidden_states
            rows = np.flatnonzero((idx["question_id"] == p.id) & (idx["condition"] == "P1-")
                                  & (idx["position_kind"] == "last_input"))
            assert rows.size == 1
            last = len(hs) - 1
            for site in store.layers:
                got = torch.as_tensor(store.read(site, rows)[0])
                if site == last:     # hidden_states[-1] has the final norm applied; the store keeps the raw block output
                    with torch.no_grad():
                        got = tiny_backend.model.model.norm(got)
                np.testing.assert_allclose(got.numpy(), hs[site][0, -1].numpy(), rtol=1e-4, atol=1e-5)
            span_rows = (idx["question_id"] == p.id) & (idx["condition"] == "P1-") & (idx["position_kind"] == "tool_span")
            decoded = "".join(idx["token_str"][span_rows])
            assert conv.tool_return.strip() in decoded
    again = extract_codeexec(cfg, backend=tiny_backend, log=lambda s: None)
    assert again["n_new"] == 0 and again["complete"]


def test_extract_refuses_no_tool(tmp_path):
    with pytest.raises(ValueError, match="no_tool"):
        CodeexecExtractConfig(
            job=JobSettings(out=str(tmp_path / "a.h5")), task=CodeexecTask(split="dev", conditions=("no_tool", "P0")))


# -- sweep ---------------------------------------------------------------------------------------------------

def test_codeexec_sweep_runs_every_strength(tiny_backend, tmp_path):
    from memtoc.jobs.codeexec import run_codeexec_sweep
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig

    agent = AgentConfig(first_call="scripted", max_new_tokens=5, max_tool_rounds=1)
    cfg = CodeexecSweepConfig(
        sweep=SweepSettings(direction=None, strengths="-50,0,50", n_perm=50),
        job=JobSettings(out=str(tmp_path / "sw"), n_boot=50, progress=False),
        task=CodeexecTask(conditions=("P0", "P1+"), limit=2), agent=agent)
    res = run_codeexec_sweep(cfg, backend=tiny_backend, edit=_edit(tiny_backend, 1.0), log=lambda s: None)
    assert [r["strength"] for r in res.rows] == [0.0, -50.0, 50.0]
    assert [r["spec_strength"] for r in res.rows] == [0.0, -50.0, 50.0]      # toward the spec's own 'toward'
    for kind in ("json", "csv", "markdown", "plot"):
        assert res.files[kind].exists()
    base = res.rows[0]["conditions"]
    assert base["P0"]["d_accuracy"]["delta"] == 0 and base["P1+"]["d_adoption"]["delta"] == 0
    assert "adoption" not in base["P0"] and base["P1+"]["accuracy"]["n"] == 2
    # strength 0 equals an unedited evaluation of the same trials
    plain = evaluate_codeexec(CodeexecRunConfig(
        job=JobSettings(out=str(tmp_path / "plain"), n_boot=50, progress=False),
        task=CodeexecTask(conditions=("P0", "P1+"), limit=2), agent=agent), tiny_backend)
    zero = [json.loads(line) for line in (res.run_dirs[0.0] / "trials.jsonl").read_text().splitlines()]
    assert [r["final_text"] for r in zero] == [r["final_text"] for r in plain.records]
    strong = [json.loads(line) for line in (res.run_dirs[50.0] / "trials.jsonl").read_text().splitlines()]
    assert [r["final_text"] for r in strong] != [r["final_text"] for r in zero]
    saved = json.loads(res.files["json"].read_text())
    assert saved["config"]["family"] == "codeexec" and saved["direction"] == "tool"


def test_the_study_end_to_end_on_the_command_line(tiny_model_dir, tmp_path, capsys):
    """extract (dev) -> probe -> direction -> codeexec sweep (held-out), as the docs list them."""
    from memtoc.cli import main

    m = str(tiny_model_dir)
    acts, edit, sweep = tmp_path / "acts.h5", tmp_path / "dir.json", tmp_path / "sweep"
    assert main(["codeexec", "extract", "--model", m, "--limit", "4", "--conditions", "P0,P1+", "--out", str(acts),
                 "--no-progress"]) == 0
    assert main(["probe", "--activations", str(acts), "--label", "condition", "--positive", "P1+", "--negative", "P0",
                 "--folds", "2", "--n-boot", "20", "--out", str(tmp_path / "probe"), "--no-progress"]) == 0
    assert (tmp_path / "probe" / "probe_auroc.png").exists()
    assert main(["direction", "--activations", str(acts), "--contrast", "P1+:P0", "--all-questions", "--layers", "2",
                 "--edit-positions", "from_tool_return", "--toward", "tool", "--out", str(edit)]) == 0
    assert main(["codeexec", "sweep", "--edit", str(edit), "--model", m, "--strengths=-4,0,4",
                 "--limit", "1", "--max-new-tokens", "4", "--max-tool-rounds", "1", "--n-boot", "20", "--no-plot",
                 "--no-progress", "--out", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "P1+ adoption" in out and (sweep / "strength_-4" / "trials.jsonl").exists()
    saved = json.loads((sweep / "sweep.json").read_text())
    assert [r["spec_strength"] for r in saved["rows"]] == [0.0, -4.0, 4.0]
    assert saved["config"]["conditions"] == ["P0", "P1+"] and saved["config"]["split"] == "heldout"


def test_recipe_quick_run_and_report_on_tiny_model(tiny_model_dir, tmp_path):
    """experiments/codeexec_probe_and_steer.toml --quick runs every step on the tiny model; the report shows the
    family's sections and the paper table. The random tiny model never adopts a corrupted value, so its probe is
    switched to the condition label (the default model's run, with outcome labels, is the real_model test)."""
    from pathlib import Path

    from memtoc.cli import main

    recipe = Path(__file__).resolve().parents[4] / "experiments" / "codeexec_probe_and_steer.toml"
    out = tmp_path / "exp"
    assert main(["run-experiment", str(recipe), "--quick", "--model", str(tiny_model_dir), "--out", str(out),
                 "--set", "label=condition", "--set", "positive=P1", "--set", "negative=P0"]) == 0
    sweep = json.loads((out / "sweep" / "greedy" / "sweep.json").read_text())
    assert sweep["edit"]["layers"] == [1, 2, 3] and sweep["config"]["agent"]["first_call"] == "scripted"
    sampled = json.loads((out / "sweep" / "sampled" / "sweep.json").read_text())
    assert sampled["config"]["repetitions"] == 3 and sampled["config"]["agent"]["temperature"] == 0.7
    trials = [json.loads(line) for line in (out / "sweep" / "sampled" / "strength_0" / "trials.jsonl").open()]
    by_rep = {r["repetition"]: [t["final_text"] for t in trials if t["repetition"] == r["repetition"]]
              for r in trials}
    assert sorted(by_rep) == [0, 1, 2] and by_rep[0] != by_rep[1]        # sampled repetitions differ
    md = (out / "report.md").read_text()
    assert "## Code-executor sweep sweep/greedy/sweep.json" in md and "### Code-executor run runs/all" in md
    for row in sweep["rows"]:
        acc = row["conditions"]["P1"]["accuracy"]["value"]
        assert f"| {row['strength']:g} | " in md and f"{100 * acc:.1f}%" in md
    assert "retention" not in md.split("## Code-executor sweep")[1].split("##")[0]   # not the MemToC table
    table = json.loads((out / "table" / "paper_table.json").read_text())
    assert [s["site"] for s in table["probe"]["per_site"]] == [1, 2, 3]
    assert "Overreliance paper table" in md and "35.5%" in md          # the paper's P1 adoption beside ours
    store_run = json.loads((out / "runs" / "all" / "run.json").read_text())
    assert store_run["conditions"] == ["no_tool", "P0", "P1", "P2"] and store_run["agent"]["max_tool_rounds"] == 4
