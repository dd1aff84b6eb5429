"""Episodes rebuilt from the frozen mapping must equal the release's own episodes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episode, build_episodes, parse_conditions
from memtoc.core.errors import BenchmarkDataError
from memtoc.bench.prompts import load_prompt_set
from memtoc.core.vocab import FORMULATIONS
from memtoc.bench.questions import load_release_episodes

SAMPLES = {"reference": "sample_reference_episodes.json", "paraphrase_a": "sample_paraphrase_a_episodes.json",
           "paraphrase_b": "sample_paraphrase_b_episodes.json"}


def _release_files(shared):
    for formulation, name in SAMPLES.items():
        yield formulation, shared / name
        yield formulation, shared / f"repair_overlay_{formulation}.json"


def test_rebuilt_episodes_equal_release_samples_and_overlays(shared_memtoc):
    bench = load_benchmark(shared_memtoc)
    by_id = {q.id: q for q in bench.questions}
    checked = 0
    for formulation, path in _release_files(shared_memtoc):
        for ep in json.loads(path.read_text(encoding="utf-8"))["episodes"]:
            qid = f"{ep['instance_id']}.{ep['hop_idx']}"
            q = replace(by_id[qid], tool_schema=ep["tool_schema"])
            mine = build_episode(q, ep["condition"], formulation, frame="tool", closed_book="permissive")
            assert mine.episode_id == ep["episode_id"]
            assert mine.question.question == ep["question"]
            assert mine.question.gold_answer == ep["gold_answer"]
            assert dict(mine.tool_output or {}) == dict(ep["tool_output"] or {})
            assert mine.tool_correct == ep["tool_correct"]
            assert mine.divergence_bucket == ep["divergence_bucket"]
            assert mine.closed_book_prompt == ep["prompts"]["closed_book"]
            assert mine.with_tool_prompt == ep["prompts"]["with_tool"]
            if mine.condition == "tool_wrong":
                assert q.repaired == (path.name.startswith("repair_overlay"))
                assert mine.tool_value == ep["distractor"]
            checked += 1
    assert checked == 10 + 2 + 2 + 3 * 39


def test_release_counts(shared_memtoc):
    bench = load_benchmark(shared_memtoc)
    assert len(bench.questions) == 575
    assert sum(q.far is not None for q in bench.questions) == 463
    assert len(bench.analysis_set()) == 542
    assert sum(q.repaired for q in bench.questions) == 39
    assert {len(bench.fold("A")), len(bench.fold("B"))} == {287, 288}
    eps = build_episodes(bench.questions, conditions=parse_conditions("tool_right,tool_wrong,tool_error,no_tool,no_conflict"))
    for formulation in FORMULATIONS:
        assert sum(e.formulation == formulation for e in eps) == 2875
    far = build_episodes(bench.questions, conditions=("tool_wrong_far",), formulations=("reference",))
    assert len(far) == 463 and all(e.divergence_bucket == "far" and e.condition == "tool_wrong" for e in far)
    # Question text is byte-identical across formulations, and every formulation's prompt embeds it.
    texts = {f: [e.question.question for e in eps if e.formulation == f] for f in FORMULATIONS}
    assert texts["reference"] == texts["paraphrase_a"] == texts["paraphrase_b"]
    assert all(e.question.question in e.prompt for e in eps)


def test_repaired_values_match_overlay(shared_memtoc):
    bench = load_benchmark(shared_memtoc)
    overlay = load_release_episodes(shared_memtoc / "repair_overlay_paraphrase_b.json")
    by_id = {q.id: q for q in bench.questions}
    assert len(overlay.near) == 39
    for qid, value in overlay.near.items():
        assert by_id[qid].near == value


def test_tool_output_span_points_at_the_serialized_output():
    bench = load_benchmark("demo")
    for ep in build_episodes(bench.questions[:5], conditions=("tool_right", "tool_wrong", "tool_error")):
        start, end = ep.tool_output_span
        assert json.loads(ep.with_tool_prompt[start:end]) == dict(ep.tool_output)


@pytest.mark.parametrize("intervention", ["warn", "source-priority", "abstain-and-flag"])
def test_intervention_sentence_sits_right_before_the_final_line(intervention):
    prompts = load_prompt_set()
    q = load_benchmark("demo").questions[0]
    for formulation in FORMULATIONS:
        ep = build_episode(q, "tool_wrong", formulation, intervention=intervention)
        base = build_episode(q, "tool_wrong", formulation)
        sentence = prompts.interventions[intervention]
        anchor = prompts.formulations[formulation]["final_instruction_anchor"]
        assert sentence + "\n" + anchor in ep.with_tool_prompt
        assert ep.with_tool_prompt.replace(sentence + "\n", "", 1) == base.with_tool_prompt
        assert ep.closed_book_prompt == base.closed_book_prompt
        assert build_episode(q, "no_tool", formulation, intervention=intervention).with_tool_prompt is None


def test_frames_differ_only_in_header_and_schema_line():
    q = replace(load_benchmark("demo").questions[0], tool_schema={"name": "lookup"})
    tool = build_episode(q, "tool_right", "reference", frame="tool").with_tool_prompt
    nos = build_episode(q, "tool_right", "reference", frame="tool-no-schema").with_tool_prompt
    passage = build_episode(q, "tool_right", "reference", frame="passage").with_tool_prompt
    assert 'Tool schema: {"name": "lookup"}\n' in tool
    assert tool.replace('Tool schema: {"name": "lookup"}\n', "") == nos
    assert "Retrieved snippet:" in passage and "schema" not in passage.lower()


def test_tool_frame_without_schema_is_refused():
    q = replace(load_benchmark("demo").questions[0], tool_schema=None)
    with pytest.raises(BenchmarkDataError, match="schema"):
        build_episode(q, "tool_right", "reference", frame="tool")


def test_unknown_condition_is_named():
    with pytest.raises(BenchmarkDataError, match="tool_maybe"):
        parse_conditions("tool_right,tool_maybe")


# -- the one-sentence protocol ablation (paper section 5.3, Appendix E) -----------------------------------------

@pytest.mark.parametrize("frame", ["tool", "tool-no-schema", "passage"])
def test_protocol_ablation_removes_exactly_its_sentence(frame):
    """The ablation arm is the standard prompt minus one sentence (the paper's Reference sentence, and the
    sentence of the same role in the paraphrases); nothing else changes, and the tool-output span still points
    at the serialized return."""
    prompts = load_prompt_set()
    q = replace(load_benchmark("demo").questions[0], tool_schema={"name": "lookup"})
    for formulation in FORMULATIONS:
        sentence = prompts.ablations["no-protocol-sentence"]["remove"][formulation][frame]
        for arm in ("tool_wrong", "tool_right", "tool_error"):
            base = build_episode(q, arm, formulation, frame=frame)
            ab = build_episode(q, arm, formulation, frame=frame, intervention="no-protocol-sentence")
            assert sentence in base.with_tool_prompt and sentence not in ab.with_tool_prompt
            assert ab.with_tool_prompt == base.with_tool_prompt.replace(sentence, "", 1)
            assert ab.closed_book_prompt == base.closed_book_prompt
            start, end = ab.tool_output_span
            assert json.loads(ab.with_tool_prompt[start:end]) == dict(ab.tool_output)
            assert ab.intervention == "no-protocol-sentence"
    ref = build_episode(q, "tool_wrong", "reference", frame="tool", intervention="no-protocol-sentence")
    assert "cannot be called again" not in ref.with_tool_prompt  # the paper's sentence
    assert ref.with_tool_prompt.startswith("You called the tool below; its output is shown. Use the output")


def test_protocol_ablation_has_its_own_template_identity():
    prompts = load_prompt_set()
    ids = {arm: prompts.templates_sha256(frame="tool", intervention=arm) for arm in prompts.prompt_arms}
    assert len(set(ids.values())) == len(ids)
    with pytest.raises(BenchmarkDataError, match="no-such-arm"):
        build_episode(load_benchmark("demo").questions[0], "tool_wrong", "reference", intervention="no-such-arm")
