"""The offline commands: score, metrics, episodes, compare."""

from __future__ import annotations

import json


from memtoc.cli import main
from memtoc.core.config import EpisodeSelection, GenerationConfig, Intervention, JobSettings, ModelSpec


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [
    # kept memory against a wrong tool
    {"question": "What is the capital of Australia?", "gold_answer": "Canberra", "condition": "tool_wrong",
     "response": "The tool says Sydney but I know better.\nFINAL: Canberra", "tool_value": "Sydney",
     "memory_answer": "FINAL: Canberra", "question_id": "q1"},
    # followed the wrong tool
    {"question": "Who painted the Mona Lisa?", "gold_answer": "Leonardo da Vinci", "condition": "tool_wrong",
     "response": "FINAL: Michelangelo", "tool_value": "Michelangelo", "memory_answer": "Leonardo da Vinci",
     "question_id": "q2"},
    # abstained on a tool error; memory absent
    {"question": "Who wrote Hamlet?", "gold_answer": "William Shakespeare", "condition": "tool_error",
     "response": "FINAL: UNKNOWN", "tool_value": None, "memory_answer": None, "question_id": "q3"},
    # alias accepted as correct
    {"question": "Who wrote Hamlet?", "gold_answer": "William Shakespeare", "condition": "tool_right",
     "response": "FINAL: the Bard", "tool_value": "William Shakespeare", "memory_answer": "I don't know",
     "aliases": ["the Bard"], "question_id": "q3"},
]


def test_score_adds_every_field(tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    assert main(["score", "--input", str(_write(tmp_path / "in.jsonl", ROWS)), "--out", str(out)]) == 0
    scored = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["outcome"] for r in scored] == ["kept_memory", "followed_tool", "neither", "neither"]
    assert [r["cell"] for r in scored] == ["arb", "arb", "mem_absent", "mem_absent"]
    assert scored[2]["abstain"] and scored[2]["neither_subtype"] == "abstain"
    assert scored[3]["final_correct"] and not scored[3]["followed_tool"]
    assert scored[0]["extracted"] == "Canberra" and scored[0]["final_correct"]
    for r in scored:
        for f in ("extracted", "followed_tool", "kept_memory", "abstain", "outcome", "neither_subtype", "final_correct"):
            assert f in r
    assert "outcomes: followed_tool=1, kept_memory=1, neither=2" in capsys.readouterr().out


def test_score_names_bad_row(tmp_path, capsys):
    bad = ROWS[:1] + [{**ROWS[1], "condition": "tool_maybe"}]
    assert main(["score", "--input", str(_write(tmp_path / "in.jsonl", bad)), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "row 2" in err and "condition" in err and "tool_maybe" in err
    assert not (tmp_path / "o").exists()


def test_metrics_prints_and_writes_table(tmp_path, capsys):
    scored = tmp_path / "scored.jsonl"
    main(["score", "--input", str(_write(tmp_path / "in.jsonl", ROWS)), "--out", str(scored)])
    capsys.readouterr()
    assert main(["metrics", "--input", str(scored), "--out", str(tmp_path / "m.json"), "--n-boot", "200"]) == 0
    text = capsys.readouterr().out
    assert "retention" in text and "tool_error_abstention" in text
    table = json.loads((tmp_path / "m.json").read_text())
    flat = json.dumps(table)
    assert "retention" in flat and "pooled" in flat


def test_episodes_export(tmp_path, capsys):
    out = tmp_path / "eps.jsonl"
    assert main(["episodes", "--benchmark", "demo", "--formulations", "reference", "--conditions",
                 "tool_right,tool_wrong_far", "--out", str(out)]) == 0
    eps = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(eps) == 120
    for e in eps:
        for f in ("episode_id", "question", "gold_answer", "condition", "formulation", "tool_output", "prompts"):
            assert f in e
        assert e["question"] in e["prompts"]["with_tool"]
    assert "120 episodes from 60 questions" in capsys.readouterr().out


def test_compare_two_runs(tiny_backend, tiny_model_dir, tmp_path, capsys):
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    def run(name, intervention):
        cfg = EvaluationConfig(
            model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
            job=JobSettings(out=str(tmp_path / name), progress=False),
            selection=EpisodeSelection(limit=4, conditions="tool_right,tool_wrong"),
            generation=GenerationConfig(max_new_tokens=8), intervention=Intervention(prompt_intervention=intervention))
        evaluate(cfg, backend=tiny_backend, log=lambda s: None)

    run("a", "none")
    run("b", "warn")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "verdict:" in out and "retention" in out
    doc = json.loads((tmp_path / "c.json").read_text())
    assert "verdict" in doc and "retention" in doc["comparisons"]
