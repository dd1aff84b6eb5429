"""The control arms (NoopTool, timeout and permission-denied tool errors): built by the one episode builder,
scored by the one scorer, reported as rows of the one metric table, and kept out of ``all``."""

from __future__ import annotations

import json

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.controls import CONTROL_ARMS, load_controls
from memtoc.bench.episodes import build_episode, build_episodes, parse_conditions
from memtoc.core.errors import BenchmarkDataError
from memtoc.scoring.metrics import metric_table
from memtoc.bench.offline import score_record
from memtoc.bench.prompts import load_prompt_set
from memtoc.core.vocab import ALL_CONDITIONS, FORMULATIONS
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec


def test_controls_are_selectable_but_not_in_all():
    assert parse_conditions("all") == ALL_CONDITIONS
    assert not set(CONTROL_ARMS) & set(parse_conditions("all"))
    assert parse_conditions("controls") == CONTROL_ARMS
    assert parse_conditions("all,controls") == ALL_CONDITIONS + CONTROL_ARMS
    assert parse_conditions("tool_error,tool_error_timeout") == ("tool_error", "tool_error_timeout")
    with pytest.raises(BenchmarkDataError, match="noop_tools"):
        parse_conditions("noop_tools")


@pytest.mark.parametrize("arm", CONTROL_ARMS)
def test_control_episode_differs_from_tool_error_only_in_the_payload(arm):
    """Same builder, frame and question: the with-tool prompt is the tool_error prompt with another payload."""
    q = load_benchmark("demo").questions[0]
    payload = load_controls().arms[arm].tool_output
    released = load_prompt_set().tool_error_payload
    for formulation in FORMULATIONS:
        ep = build_episode(q, arm, formulation)
        ref = build_episode(q, "tool_error", formulation)
        assert ep.condition == arm and ep.arm == arm and ep.tool_correct is False
        assert ep.tool_value is None and ep.divergence_bucket is None
        assert ep.episode_id == ref.episode_id.replace("tool_error", arm)
        start, end = ep.tool_output_span
        assert json.loads(ep.with_tool_prompt[start:end]) == dict(payload)
        assert ep.with_tool_prompt.replace(json.dumps(dict(payload), ensure_ascii=False),
                                           json.dumps(dict(released), ensure_ascii=False)) == ref.with_tool_prompt
        assert ep.closed_book_prompt == ref.closed_book_prompt


def test_control_payloads_carry_no_factual_value():
    arms = load_controls().arms
    assert set(arms) == set(CONTROL_ARMS)
    for arm in arms.values():
        assert "result" not in arm.tool_output and arm.measures
    assert arms["noop_tool"].reference == "no_tool"
    assert {arms["tool_error_timeout"].tool_output["code"], arms["tool_error_permission"].tool_output["code"]} == \
        {504, 403}
    eps = build_episodes(load_benchmark("demo").questions[:2], formulations=("reference",),
                         conditions=parse_conditions("all,controls"))
    assert sum(e.condition in CONTROL_ARMS for e in eps) == 2 * 3


@pytest.mark.parametrize(("condition", "memory", "response", "cell", "fields"), [
    ("tool_error_timeout", "FINAL: Paris", "FINAL: Paris", "arb",
     {"outcome": "kept_memory", "abstain": False, "followed_tool": False}),
    ("tool_error_permission", "FINAL: Lyon", "The tool timed out.\nFINAL: UNKNOWN", "both_wrong",
     {"outcome": "neither", "neither_subtype": "abstain", "abstain": True}),
    ("noop_tool", "FINAL: Paris", "FINAL:", "arb",              # empty span after a tool call: abstains
     {"outcome": "neither", "neither_subtype": "abstain", "abstain": True}),
    ("noop_tool", None, "FINAL: Paris", "mem_absent", {"final_correct": True, "followed_tool": False}),
])
def test_control_records_are_scored_by_the_one_scorer(condition, memory, response, cell, fields):
    out = score_record({"question": "What is the capital of France?", "gold_answer": "Paris",
                        "condition": condition, "response": response, "memory_answer": memory})
    assert out["cell"] == cell and out["tool_correct"] is False
    assert {k: out[k] for k in fields} == fields


def test_control_rows_in_the_metric_table():
    recs = []
    for q, (timeout_abst, perm_abst, noop_correct) in enumerate([(True, False, True), (True, True, False),
                                                                  (False, True, True), (True, True, True)]):
        base = {"question_id": f"q{q}", "formulation": "reference", "divergence_bucket": None, "ack_proxy": False,
                "followed_tool": False, "trivial_hop": False, "cell": "arb" if q < 2 else "both_wrong"}
        recs += [
            {**base, "condition": "tool_error_timeout", "abstain": timeout_abst, "outcome": "neither",
             "kept_memory": False, "final_correct": False},
            {**base, "condition": "tool_error_permission", "abstain": perm_abst,
             "outcome": "neither" if perm_abst else "kept_memory", "kept_memory": not perm_abst,
             "final_correct": False},
            {**base, "condition": "noop_tool", "abstain": False, "outcome": "kept_memory" if noop_correct else
             "neither", "kept_memory": noop_correct, "final_correct": noop_correct},
        ]
    t = metric_table(recs, n_boot=50)

    def kn(name):
        c = t[name].per_formulation["reference"]
        return c.k, c.n

    assert kn("tool_error_abstention_timeout") == (3, 4)
    assert kn("tool_error_abstention_permission") == (3, 4)
    assert kn("tool_error_fallback_permission") == (1, 2)       # arb q0 keeps, q1 abstains
    assert kn("tool_error_bw_abstention_timeout") == (1, 2)     # both_wrong q2 no, q3 yes
    assert kn("noop_retention") == (1, 2) and kn("noop_accuracy") == (3, 4)
    assert kn("tool_error_abstention") == (0, 0)                # the released payload's row stays apart
    assert "Err. timeout" in t.format_text()


def test_evaluate_runs_controls_and_records_their_identity(tiny_backend, tiny_model_dir, tmp_path):
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    def cfg(out, conditions):
        return EvaluationConfig(
            model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
            selection=EpisodeSelection(benchmark="demo", conditions=conditions, limit=2),
            job=JobSettings(out=str(out), progress=False), generation=GenerationConfig(batch_size=8, max_new_tokens=8))

    res = evaluate(cfg(tmp_path / "ctl", "tool_error,no_tool,controls"), backend=tiny_backend, log=lambda s: None)
    info = json.loads((tmp_path / "ctl" / "run.json").read_text())
    assert info["identity"]["controls_sha256"] == load_controls().sha256
    recs = [json.loads(line) for line in (tmp_path / "ctl" / "episodes.jsonl").read_text().splitlines()]
    assert sorted({r["condition"] for r in recs}) == sorted(["tool_error", "no_tool", *CONTROL_ARMS])
    metrics = res.summary["metrics"]["metrics"]
    for name in ("tool_error_abstention_timeout", "tool_error_abstention_permission", "noop_abstention",
                 "noop_accuracy"):
        assert metrics[name]["per_formulation"]["reference"]["n"] == 2, name
    assert "Noop abst." in res.table_text
    evaluate(cfg(tmp_path / "plain", "tool_error"), backend=tiny_backend, log=lambda s: None)
    assert "controls_sha256" not in json.loads((tmp_path / "plain" / "run.json").read_text())["identity"]
