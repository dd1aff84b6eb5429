"""Loading the benchmark in each form, and clear errors for malformed input."""

from __future__ import annotations

import json
import shutil

import pytest

from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import BenchmarkDataError
from memtoc.bench.questions import load_mapping, load_release_episodes, make_qkey

ROW = {"id": "1.0", "instance_id": 1, "hop_idx": 0, "qkey": "q", "question": "Q?", "gold_answer": "A",
       "gold_kind": "person", "family": "free_form", "final_near": "B", "far": "C"}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_demo_benchmark_loads_with_folds():
    bench = load_benchmark("demo")
    assert len(bench.questions) == 60
    assert len(bench.fold("A")) + len(bench.fold("B")) == 60
    assert bench.default_frame == "tool-no-schema"
    assert set(bench.files) == {"demo/questions.jsonl", "demo/folds.json"}


def test_missing_file_named(tmp_path):
    with pytest.raises(BenchmarkDataError, match="nope.jsonl.*not found"):
        load_mapping(tmp_path / "nope.jsonl")
    with pytest.raises(BenchmarkDataError, match="not found"):
        load_benchmark(tmp_path / "nothing-here")


def test_bad_json_names_file_and_row(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(ROW) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=r"m\.jsonl, row 2: invalid JSON"):
        load_mapping(p)


def test_row_without_gold_names_field(tmp_path):
    p = _write_jsonl(tmp_path / "m.jsonl", [ROW, {**ROW, "id": "2.0", "gold_answer": ""}])
    with pytest.raises(BenchmarkDataError, match=r"row 2, field 'gold_answer'"):
        load_mapping(p)


def test_duplicate_ids_refused(tmp_path):
    p = _write_jsonl(tmp_path / "m.jsonl", [ROW, ROW])
    with pytest.raises(BenchmarkDataError, match="duplicate question id '1.0'"):
        load_mapping(p)


def test_unknown_condition_in_release_file(tmp_path, shared_memtoc):
    doc = json.loads((shared_memtoc / "sample_reference_episodes.json").read_text(encoding="utf-8"))
    doc["episodes"][3]["condition"] = "tool_sometimes"
    p = tmp_path / "reference.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=r"row 3, field 'condition'.*tool_sometimes"):
        load_release_episodes(p)


def test_duplicate_episode_id_in_release_file(tmp_path, shared_memtoc):
    doc = json.loads((shared_memtoc / "sample_reference_episodes.json").read_text(encoding="utf-8"))
    doc["episodes"].append(doc["episodes"][0])
    p = tmp_path / "reference.json"
    p.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match="duplicate episode id"):
        load_release_episodes(p)


def test_release_folder_takes_schemas_and_repaired_values(tmp_path, shared_memtoc):
    # A release-shaped folder: mapping + benchmark/reference.json (here the 10-episode sample).
    shutil.copy(shared_memtoc / "mapping_575.jsonl", tmp_path / "mapping_575.jsonl")
    rows = [json.loads(l) for l in (tmp_path / "mapping_575.jsonl").read_text(encoding="utf-8").splitlines()]
    _write_jsonl(tmp_path / "mapping_575.jsonl", [r for r in rows if r["id"] in ("0.0", "0.1")])
    (tmp_path / "benchmark").mkdir()
    shutil.copy(shared_memtoc / "sample_reference_episodes.json", tmp_path / "benchmark" / "reference.json")
    bench = load_benchmark(tmp_path)
    assert bench.default_frame == "tool"
    assert [q.id for q in bench.questions] == ["0.0", "0.1"]
    assert bench.questions[1].far == "Johannes von Tepl"
    assert set(bench.release_files) == {"reference"}


def test_single_release_file_is_a_benchmark(shared_memtoc):
    bench = load_benchmark(shared_memtoc / "sample_reference_episodes.json")
    assert len(bench.questions) == 2 and bench.has_schemas


@pytest.mark.parametrize("question,qkey", [
    ("Who wrote \"Hamlet\"?", "who wrote hamlet"),
    ("Joseph-André's place of birth?", "josephandrs place of birth"),
])
def test_make_qkey(question, qkey):
    assert make_qkey(question) == qkey


def test_qkeys_of_release_mapping_follow_rule(shared_memtoc):
    rows = [json.loads(l) for l in (shared_memtoc / "mapping_575.jsonl").read_text(encoding="utf-8").splitlines()]
    agree = sum(make_qkey(r["question"]) == r["qkey"] for r in rows)
    assert agree / len(rows) > 0.98
