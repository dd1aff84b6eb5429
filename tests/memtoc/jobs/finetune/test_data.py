"""Pairs and SFT examples from the benchmark: counts, preferred/rejected per condition, near distractors only."""

from __future__ import annotations

import json

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episode
from memtoc.core.errors import MemtocError
from memtoc.jobs.finetune.data import (COMPLETION_FORMAT, build_pairs, completion_text, make_pair_set, read_pair_set,
                                  write_pair_set)


@pytest.fixture(scope="module")
def questions():
    return load_benchmark("demo").questions[:5]


def test_two_balanced_conditions_per_question_and_formulation(questions, tiny_backend):
    pairs = build_pairs(questions, tiny_backend.format_prompt, formulations=("reference", "paraphrase_a"))
    assert len(pairs) == 2 * 2 * len(questions)
    assert [p.condition for p in pairs[:4]] == ["tool_wrong", "tool_right", "tool_wrong", "tool_right"]
    assert len({p.pair_id for p in pairs}) == len(pairs)
    by_q = {}
    for p in pairs:
        by_q.setdefault((p.question_id, p.formulation), []).append(p.condition)
    assert all(sorted(v) == ["tool_right", "tool_wrong"] for v in by_q.values())
    assert len(by_q) == 2 * len(questions)


def test_preferred_and_rejected_per_condition(questions, tiny_backend):
    qmap = {q.id: q for q in questions}
    for p in build_pairs(questions, tiny_backend.format_prompt):
        q = qmap[p.question_id]
        assert p.chosen_answer == q.gold_answer and p.rejected_answer == q.near
        assert p.chosen == f"FINAL: {q.gold_answer}" and p.rejected == f"FINAL: {q.near}"
        assert p.chosen == completion_text(q.gold_answer) == COMPLETION_FORMAT.format(answer=q.gold_answer)
        if p.condition == "tool_wrong":
            assert p.tool_value == q.near          # the returned (wrong) value is the rejected one
            assert p.tool_value == p.rejected_answer
        else:
            assert p.tool_value == q.gold_answer   # the returned (right) value is the preferred one
            assert p.tool_value == p.chosen_answer
        assert f"Tool output: {json.dumps({'result': p.tool_value}, ensure_ascii=False)}\n" in p.user_prompt


def test_only_near_distractors_are_used(questions, tiny_backend):
    assert all(q.far and q.far != q.near for q in questions)
    pairs = build_pairs(questions, tiny_backend.format_prompt)
    qmap = {q.id: q for q in questions}
    for p in pairs:
        far = qmap[p.question_id].far
        assert far not in json.dumps(p.to_dict(), ensure_ascii=False)


def test_prompts_are_the_benchmark_prompts_through_the_chat_template(questions, tiny_backend):
    for p in build_pairs(questions, tiny_backend.format_prompt, frame="tool-no-schema"):
        ep = build_episode(next(q for q in questions if q.id == p.question_id), p.condition, p.formulation,
                           frame="tool-no-schema")
        assert p.user_prompt == ep.prompt
        assert p.prompt == tiny_backend.format_prompt(ep.prompt)
        assert p.prompt.startswith("<|im_start|>user\n") and p.prompt.endswith("<|im_start|>assistant\n")


def test_hash_is_stable_changes_with_content_and_roundtrips(questions, tiny_backend, tmp_path):
    a = make_pair_set(build_pairs(questions, tiny_backend.format_prompt))
    b = make_pair_set(build_pairs(questions, tiny_backend.format_prompt))
    c = make_pair_set(build_pairs(questions[:4], tiny_backend.format_prompt))
    assert a.sha256 == b.sha256 and len(a.sha256) == 64 and a.sha256 != c.sha256
    path = write_pair_set(tmp_path / "pairs.jsonl", a)
    back = read_pair_set(path)
    assert back.pairs == a.pairs and back.sha256 == a.sha256
    meta = json.loads((tmp_path / "pairs.jsonl.meta.json").read_text())
    assert meta["sha256"] == a.sha256 and meta["n_pairs"] == 10 and meta["completion_format"] == "FINAL: {answer}"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace("FINAL: ", "FINAL:  ", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MemtocError, match="content hash"):
        read_pair_set(path)


def test_a_question_without_conflict_is_refused(questions, tiny_backend):
    from dataclasses import replace

    bad = replace(questions[0], near=questions[0].gold_answer)
    with pytest.raises(MemtocError, match="equals the gold"):
        build_pairs([bad], tiny_backend.format_prompt)
