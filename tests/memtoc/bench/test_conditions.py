"""The condition registry: one object per condition, one source of tool correctness, and the toy ``tool_empty``
condition of docs/extending.md, dropped into the package as one file exactly as the doc shows, then built, scored and
reported with nothing else changed."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

import memtoc.bench.conditions as conditions
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.conditions import (
    Condition,
    condition_names,
    condition_set,
    get_condition,
    metrics_of,
    recorded_conditions,
    register_condition,
    set_default,
    tool_correct,
    unregister_condition,
)
from memtoc.bench.controls import CONTROL_ARMS
from memtoc.bench.episodes import build_episodes, parse_conditions
from memtoc.bench.offline import score_record
from memtoc.bench.prompts import load_prompt_set
from memtoc.core.vocab import FORMULATIONS
from memtoc.core import vocab
from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring.metrics import METRICS, default_metrics, get_metric, metric_table
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "extending.md"
TITLE = "memtoc/bench/conditions/tool_empty.py"
PACKAGES = ("memtoc", "activations", "probes", "steering")


def doc_block(title: str) -> str:
    """The ```python title="..."``` code block of docs/extending.md with that title."""
    m = re.search(r'```python title="' + re.escape(title) + r'"\n(.*?)```', DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/extending.md has no code block titled {title}"
    return m.group(1)


@pytest.fixture
def tool_empty(tmp_path, monkeypatch):
    """The doc's module as one more file on the package's search path, found by the package's own discovery."""
    assert "tool_empty" not in condition_names()
    (tmp_path / "tool_empty.py").write_text(doc_block(TITLE), encoding="utf-8")
    monkeypatch.setattr(conditions, "__path__", [*conditions.__path__, str(tmp_path)])
    try:
        assert "tool_empty" in conditions.discover()
        yield get_condition("tool_empty")
    finally:
        unregister_condition("tool_empty")
        sys.modules.pop("memtoc.bench.conditions.tool_empty", None)


# -- the built-ins -----------------------------------------------------------------------------------------------

def test_the_builtins_are_the_vocabulary_and_the_controls():
    assert condition_set("all") == vocab.ALL_CONDITIONS == parse_conditions("all")
    assert condition_set("controls") == CONTROL_ARMS == parse_conditions("controls")
    assert condition_names() == vocab.ALL_CONDITIONS + CONTROL_ARMS
    assert recorded_conditions() == vocab.CONDITIONS + CONTROL_ARMS       # the far arm records as tool_wrong
    far = get_condition(vocab.FAR_CONDITION)
    assert far.condition == "tool_wrong" and far.bucket == "far" and get_condition("tool_wrong").bucket == "near"
    # the jobs' defaults, as they were before they became sets
    assert set_default("sweep") == "tool_wrong,tool_right,tool_error" and set_default("agent") == "tool_right"
    from memtoc.tasks.agent.task import AgentRunConfig
    from memtoc.tasks.memtoc.sweep import SweepConfig

    assert SweepConfig().selection.conditions == set_default("sweep")
    assert AgentRunConfig().selection.conditions == set_default("agent")


def test_release_payloads_follow_the_question():
    """Each release condition returns what the paper says, read from the question (an independent rendering)."""
    q = next(q for q in load_benchmark("demo").questions if q.far)
    prompts = load_prompt_set()
    expected = {"tool_right": {"result": q.gold_answer}, "no_conflict": {"result": q.gold_answer},
                "tool_wrong": {"result": q.near}, "tool_wrong_far": {"result": q.far},
                "tool_error": dict(prompts.tool_error_payload), "no_tool": None}
    eps = {e.arm: e for e in build_episodes([q], formulations=("reference",), conditions=vocab.ALL_CONDITIONS)}
    assert {arm: e.tool_output for arm, e in eps.items()} == expected
    assert eps["no_tool"].with_tool_prompt is None and eps["no_tool"].prompt == eps["no_tool"].closed_book_prompt
    assert [tool_correct(c) for c in vocab.CONDITIONS] == [True, False, False, None, True]


def test_every_metric_reads_registered_conditions():
    """Each row of the default table is fed by a registered condition; the far arm feeds only the far rows."""
    fed = {m for name in condition_names() for m in metrics_of(name)}
    assert fed == {m.name for m in default_metrics()}
    assert {s.condition for m in default_metrics() for s in m.selectors} <= set(recorded_conditions())
    assert metrics_of("tool_wrong_far") == ("retention_far", "incorrect_tool_following_far")
    assert "retention" in metrics_of("tool_wrong") and "retention_far" not in metrics_of("tool_wrong")


def test_the_registry_refuses_clashes_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        register_condition(Condition("tool_right", False, None))
    with pytest.raises(ValueError, match="records as 'nope'"):
        register_condition(Condition("x_arm", False, None, records_as="nope"))
    assert "x_arm" not in condition_names()
    with pytest.raises(BenchmarkDataError, match="unknown condition 'tool_rigth'"):
        tool_correct("tool_rigth")
    with pytest.raises(BenchmarkDataError, match="tool_rigth"):
        parse_conditions("tool_rigth")
    with pytest.raises(BenchmarkDataError, match="condition"):
        score_record({"question": "Q?", "gold_answer": "A", "condition": "tool_wrong_far", "response": "A"})


# -- one source of tool correctness ------------------------------------------------------------------------------

def correctness_tables(source: str, known: set[str]) -> list[int]:
    """Lines of ``source`` holding a table of tool correctness: a dict literal keyed by two or more condition names
    with True/False/None values, or an assignment to one of the old tables' names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            values = [v for v in node.values if isinstance(v, ast.Constant) and v.value in (True, False, None)]
            if len(set(keys) & known) >= 2 and len(values) >= 2:
                found.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in ("TOOL_CORRECT", "TOOL_CORRECT_BY_CONDITION") for t in targets):
                found.append(node.lineno)
    return found


def test_tool_correctness_has_one_source():
    known = set(condition_names())
    found = [f"{p.relative_to(REPO)}:{line}" for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             for line in correctness_tables(p.read_text(encoding="utf-8"), known)]
    assert found == []
    import memtoc.bench.episodes
    import memtoc.scoring
    import memtoc.scoring.score

    for module in (memtoc.bench.episodes, memtoc.scoring, memtoc.scoring.score):
        assert not hasattr(module, "TOOL_CORRECT") and not hasattr(module, "TOOL_CORRECT_BY_CONDITION")


def test_the_walk_finds_the_old_tables():
    old = ('TOOL_CORRECT = {"tool_right": True, "no_conflict": True, "tool_wrong": False, "no_tool": None}\n'
           'T: dict = {}\nX = {"tool_error": False, "noop_tool": False}\n')
    assert correctness_tables(old, set(condition_names())) == [1, 1, 3]


# -- the documented condition: one file -------------------------------------------------------------------------

def test_the_doc_condition_is_registered_by_one_file(tool_empty):
    section = DOC.read_text(encoding="utf-8").split("## Adding a condition")[1].split("\n## ")[0]
    assert re.findall(r'```python title="([^"]+)"', section) == [TITLE]
    assert f"**Files touched: 1** (`{TITLE}`, new)" in section and not (REPO / TITLE).exists()
    assert tool_empty.tool_correct is False and tool_empty.has_tool_return and tool_empty.sets == {}
    assert condition_names()[-1] == "tool_empty" and "tool_empty" in recorded_conditions()
    assert parse_conditions("all") == vocab.ALL_CONDITIONS                 # default runs are unchanged
    assert parse_conditions("tool_error,tool_empty") == ("tool_error", "tool_empty")
    assert [m.name for m in default_metrics()] == [*(m.name for m in METRICS), "empty_retention",
                                                   "empty_bw_abstention"]
    assert get_metric("empty_retention").selectors[0].condition == "tool_empty"
    assert metrics_of("tool_empty") == ("empty_retention", "empty_bw_abstention")


def test_the_doc_condition_builds_episodes(tool_empty):
    questions = load_benchmark("demo").questions
    prompts = load_prompt_set()
    eps = build_episodes(questions, formulations=FORMULATIONS, conditions=("tool_error", "tool_empty"))
    assert len(eps) == 2 * len(questions) * len(FORMULATIONS)
    for ref, ep in zip(eps[::2], eps[1::2]):
        q = ep.question
        assert (ref.arm, ep.arm, ep.condition) == ("tool_error", "tool_empty", "tool_empty")
        assert ep.episode_id == ref.episode_id.replace("tool_error", "tool_empty")
        assert ep.tool_output == {"result": ""} and ep.tool_value == "" and ep.tool_correct is False
        assert ep.divergence_bucket is None and ep.closed_book_prompt == ref.closed_book_prompt
        rendered = prompts.with_tool(ep.formulation, q.question, {"result": ""}, frame="tool-no-schema",
                                     schema=q.tool_schema, intervention="none")
        assert ep.with_tool_prompt == rendered.text
        start, end = ep.tool_output_span
        assert json.loads(ep.with_tool_prompt[start:end]) == {"result": ""}


@pytest.mark.parametrize(("memory", "response", "cell", "fields"), [
    ("FINAL: Paris", "FINAL: Paris", "arb", {"outcome": "kept_memory", "kept_memory": True, "followed_tool": False}),
    ("FINAL: Lyon", "The lookup was empty.\nFINAL: UNKNOWN", "both_wrong",
     {"outcome": "neither", "neither_subtype": "abstain", "abstain": True}),
    ("FINAL: Paris", "FINAL:", "arb", {"outcome": "neither", "abstain": True}),   # a tool call: empty = abstains
    (None, "FINAL: Paris", "mem_absent", {"final_correct": True}),
])
def test_the_doc_condition_is_scored_by_the_one_scorer(tool_empty, memory, response, cell, fields):
    out = score_record({"question": "What is the capital of France?", "gold_answer": "Paris", "tool_value": "",
                        "condition": "tool_empty", "response": response, "memory_answer": memory})
    assert out["cell"] == cell and out["tool_correct"] is False and out["divergence_bucket"] is None
    assert {k: out[k] for k in fields} == fields


def test_the_doc_condition_feeds_its_metrics(tool_empty):
    recs = []
    for i, (memory, response) in enumerate([("Paris", "Paris"), ("Paris", "UNKNOWN"), ("Paris", "Paris"),
                                            ("Lyon", "UNKNOWN"), ("Lyon", "Lyon"), (None, "Paris")]):
        recs.append(score_record({"question": "What is the capital of France?", "gold_answer": "Paris",
                                  "tool_value": "", "condition": "tool_empty", "response": f"FINAL: {response}",
                                  "memory_answer": None if memory is None else f"FINAL: {memory}",
                                  "question_id": f"q{i}"}))
    t = metric_table(recs, n_boot=20)
    arb = [r for r in recs if r["cell"] == "arb"]
    bw = [r for r in recs if r["cell"] == "both_wrong"]
    ret, abst = t["empty_retention"].per_formulation["reference"], t["empty_bw_abstention"].per_formulation["reference"]
    assert (ret.k, ret.n) == (sum(r["kept_memory"] for r in arb), len(arb)) == (2, 3)
    assert (abst.k, abst.n) == (sum(r["abstain"] for r in bw), len(bw)) == (1, 2)
    assert "Empty ret." in t.format_text()
    unregister_condition("tool_empty")
    assert "empty_retention" not in {m.name for m in default_metrics()}
    with pytest.raises(ValueError, match="unknown metric"):
        get_metric("empty_retention")


def test_evaluate_runs_the_doc_condition(tool_empty, tiny_backend, tiny_model_dir, tmp_path):
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    cfg = EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", conditions="tool_empty", formulations="all", limit=2),
        job=JobSettings(out=str(tmp_path / "run"), progress=False),
        generation=GenerationConfig(batch_size=8, max_new_tokens=8))
    res = evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    recs = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * len(FORMULATIONS)
    assert {(r["condition"], r["tool_value"], r["tool_correct"]) for r in recs} == {("tool_empty", "", False)}
    metrics = res.summary["metrics"]["metrics"]
    for f in {r["formulation"] for r in recs}:
        arb = [r for r in recs if r["formulation"] == f and r["cell"] == "arb"]
        assert metrics["empty_retention"]["per_formulation"][f]["n"] == len(arb)
