"""The App. F.1 transfer set: loader refusals (file/row/field), frames, multiple-choice matching with the
unmatched rate, and the developer sample through the one evaluator."""

from __future__ import annotations

import json

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import BenchmarkDataError
from memtoc.bench.transfer import SAMPLE, load_transfer, match_choice, mc_outcomes, to_questions, unmatched_rate
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings

ROW = {"id": "x1", "question": "Which planet is closest to the Sun?",
       "choices": [{"label": "A", "text": "Venus"}, {"label": "B", "text": "Mercury"}],
       "answerKey": "B", "counterfactual_answerKey": "A", "context": "Venus is closest."}


def write(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return p


@pytest.mark.parametrize("change, field", [
    ({"answerKey": "E"}, "answerKey"), ({"counterfactual_answerKey": "B"}, "counterfactual_answerKey"),
    ({"choices": [{"label": "A", "text": "Venus"}]}, "choices"), ({"choices": [{"label": "A"}, {"label": "B"}]},
                                                                   "choices[0]"),
    ({"context": ""}, "context"), ({"question": None}, "question"),
    # gold and counterfactual options with one text (the scorer could not tell them apart)
    ({"choices": [{"label": "A", "text": "Mercury"}, {"label": "B", "text": "mercury "}]}, "choices")])
def test_malformed_rows_are_refused_naming_file_row_and_field(tmp_path, change, field):
    p = write(tmp_path, [ROW, {**ROW, "id": "x2", **change}])
    with pytest.raises(BenchmarkDataError) as e:
        load_transfer(p)
    assert e.value.path == str(p) and e.value.row == 2 and e.value.field == field


def test_missing_field_bad_json_and_duplicate_ids(tmp_path):
    row = dict(ROW)
    del row["context"]
    with pytest.raises(BenchmarkDataError, match="row 1, field 'context'"):
        load_transfer(write(tmp_path, [row]))
    with pytest.raises(BenchmarkDataError, match="row 2, field 'row'"):
        load_transfer(write(tmp_path, [ROW, "{not json"]))
    with pytest.raises(BenchmarkDataError, match="row 2, field 'id'"):
        load_transfer(write(tmp_path, [ROW, ROW]))


def test_sample_loads_and_frames_give_the_value_or_the_passage():
    items = load_transfer(SAMPLE)
    assert len(items) == 6
    value, passage = to_questions(items, "value"), to_questions(items, "passage")
    assert value[0].gold_answer == "Mercury" and value[0].near == "Venus" and "B) Mercury" in value[0].question
    assert passage[0].near == items[0].context


@pytest.mark.parametrize("span, label", [("B", "B"), ("(B)", "B"), ("B) Mercury", "B"), ("Mercury", "B"),
                                         ("venus", "A"), ("B) Venus", "A"), ("Pluto", None), ("", None),
                                         ("Venus or Mercury", None)])
def test_match_choice(span, label):
    assert match_choice(span, [("A", "Venus"), ("B", "Mercury")]) == label


def test_unmatched_rate_and_outcomes_count_explicitly():
    ch = [("A", "Venus"), ("B", "Mercury")]
    assert unmatched_rate(["B", "Pluto", "Venus", ""], [ch] * 4) == 0.5
    items = load_transfer(SAMPLE)
    recs = [{"question_id": "0.0", "extracted": "Mercury"}, {"question_id": "0.0", "extracted": "A"},
            {"question_id": "1.0", "extracted": "I cannot tell"}, {"question_id": "1.0", "extracted": "oxygen"}]
    out = mc_outcomes(recs, items)
    assert out["counts"] == {"gold": 1, "counterfactual": 1, "other": 1, "unmatched": 1}
    assert out["unmatched_rate"] == 0.25


def test_sample_runs_through_evaluate(tmp_path, tiny_backend):
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    bench = load_benchmark("transfer:value")
    assert bench.name == "transfer-value" and len(bench.questions) == 6
    res = evaluate(EvaluationConfig(
        selection=EpisodeSelection(benchmark="transfer:passage", conditions="tool_wrong", limit=2),
        generation=GenerationConfig(max_new_tokens=8), job=JobSettings(out=str(tmp_path / "run"), progress=False)), backend=tiny_backend)
    recs = res.store.episodes.records()
    assert len(recs) == 2 and recs[0]["tool_value"] == load_transfer(SAMPLE)[0].context
    out = mc_outcomes(recs, load_transfer(SAMPLE))
    assert out["n"] == 2 and 0 <= out["unmatched_rate"] <= 1
    # the run's summary carries the multiple-choice reading per condition, and the report shows it
    import json

    from memtoc.jobs.report.build import write_report

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["transfer_mc"] == {"tool_wrong": json.loads(json.dumps(out))}
    rep = write_report(tmp_path / "run", tmp_path / "rep")
    md = rep.markdown.read_text(encoding="utf-8")
    assert "Multiple-choice reading (transfer set, App. F.1)" in md and "unmatched" in md
