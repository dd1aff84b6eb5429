"""The score and metrics jobs (``memtoc.jobs.score``, ``memtoc.jobs.metrics``): the command line only presents
their results, so the job alone writes the command's files, and every check comes before anything is written."""

from __future__ import annotations

import json

import pytest

from memtoc.cli import main
from memtoc.core.errors import MemtocError
from memtoc.core.values import build_config
from memtoc.jobs.metrics import MetricsConfig, run_metrics
from memtoc.jobs.score import ScoreConfig, run_score
from memtoc.scoring.metrics import metric_table

ROWS = [
    {"question": "What is the capital of Australia?", "gold_answer": "Canberra", "condition": "tool_wrong",
     "response": "The tool says Sydney but I know better.\nFINAL: Canberra", "tool_value": "Sydney",
     "memory_answer": "FINAL: Canberra", "question_id": "q1"},
    {"question": "Who painted the Mona Lisa?", "gold_answer": "Leonardo da Vinci", "condition": "tool_wrong",
     "response": "FINAL: Michelangelo", "tool_value": "Michelangelo", "memory_answer": "Leonardo da Vinci",
     "question_id": "q2"},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_score_job_writes_what_the_command_writes(tmp_path, capsys):
    inp = _write(tmp_path / "in.jsonl", ROWS)
    res = run_score(build_config(ScoreConfig, {"input": str(inp), "out": str(tmp_path / "job.jsonl")}))
    assert main(["score", "--input", str(inp), "--out", str(tmp_path / "cli.jsonl")]) == 0
    assert (tmp_path / "job.jsonl").read_text() == (tmp_path / "cli.jsonl").read_text()
    assert res.counts == {"kept_memory": 1, "followed_tool": 1} and len(res.records) == 2
    assert "scored 2 records" in capsys.readouterr().out


def test_the_score_job_refuses_to_overwrite_its_input(tmp_path):
    inp = _write(tmp_path / "in.jsonl", ROWS)
    with pytest.raises(MemtocError, match="--out"):
        run_score(ScoreConfig(input=str(inp), out=str(inp)))
    assert inp.read_text() == "".join(json.dumps(r) + "\n" for r in ROWS)


def test_the_metrics_job_is_the_metric_table_of_the_records(tmp_path):
    scored = tmp_path / "scored.jsonl"
    run_score(ScoreConfig(input=str(_write(tmp_path / "in.jsonl", ROWS)), out=str(scored)))
    res = run_metrics(MetricsConfig(input=str(scored), out=str(tmp_path / "m.json"), n_boot=50, seed=3))
    records = [json.loads(line) for line in scored.read_text().splitlines()]
    want = metric_table(records, n_boot=50, seed=3).to_dict()           # independent: the scorer's table itself
    assert res.layer == "deterministic" and res.judged is None
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(want))


def test_the_metrics_job_checks_before_it_reads(tmp_path):
    with pytest.raises(MemtocError, match="n-boot"):
        run_metrics(MetricsConfig(input=str(tmp_path / "missing.jsonl"), n_boot=0))
    with pytest.raises(MemtocError, match="run directory or --input"):
        run_metrics(MetricsConfig(score_layer="judged"))
