"""``memtoc judge`` on a tiny random model: judge.jsonl, resume after a torn write, no-op, refusal, layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.core.errors import RunStoreError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.scoring.judge.prompts import load_judge_prompts
from memtoc.scoring.judge.requests import build_requests
from memtoc.jobs.judge import JudgeConfig, run_judge
from memtoc.scoring.judge.store import read_judge_records
from memtoc.runs.runstore import RunStore
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec


@pytest.fixture(scope="module")
def tiny_run(tiny_backend, tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("judge") / "run"
    evaluate(EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", formulations="reference", conditions="tool_right,tool_wrong",
                                   limit=4),
        job=JobSettings(out=str(out), progress=False), generation=GenerationConfig(batch_size=4, max_new_tokens=8)), backend=tiny_backend,
             log=lambda s: None)
    return out


def _cfg(run, model_dir, **kw) -> JudgeConfig:
    return JudgeConfig(run_dir=str(run), judge_model=str(model_dir), device="cpu", dtype="float32", batch_size=3,
                       progress=False, **kw)


def test_judge_pass_resume_noop_and_refusal(tiny_run, tiny_backend, tiny_model_dir):
    expected = build_requests(RunStore.read(tiny_run).episodes.records(), load_judge_prompts())
    assert sum(r.kind == "ack" for r in expected) == 4           # one per tool_wrong final
    res = run_judge(_cfg(tiny_run, tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    path = tiny_run / "judge.jsonl"
    recs = read_judge_records(path)
    assert res.n_new == len(expected) == len(recs)
    assert set(recs) == {r.request_id for r in expected}
    one = next(iter(recs.values()))
    assert one["prompt"] and "reply" in one and "verdict" in one
    ident = one["judge"]
    assert ident["model"] == str(tiny_model_dir) and ident["prompt_version"] == "release-1"
    assert ident["weights_sha256"] and ident["max_new_tokens"] == 32
    # garbage replies of a random model are discarded, never turned into labels
    for r in recs.values():
        if r["kind"] != "ack" and r["verdict"]["status"] == "span":
            assert 0 < len(r["verdict"]["span"].split()) <= 12

    # a torn last line (a kill mid-write): readers ignore it, the resumed pass repairs it
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert len(read_judge_records(path)) == len(expected) - 1
    again = run_judge(_cfg(tiny_run, tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    assert again.n_new == 1
    assert len(path.read_text(encoding="utf-8").splitlines()) == len(expected)
    assert read_judge_records(path).keys() == recs.keys()

    # a finished pass re-run is a no-op and loads no model (backend=None would load one)
    msgs = []
    assert run_judge(_cfg(tiny_run, tiny_model_dir), log=msgs.append).n_new == 0
    assert "nothing left" in msgs[0]

    # another judge model is refused before loading, naming the field
    with pytest.raises(RunStoreError, match="field model"):
        run_judge(_cfg(tiny_run, "some/other-judge"), log=lambda s: None)
    # ... and can go to its own file
    other = run_judge(_cfg(tiny_run, tiny_model_dir, out="judge_second.jsonl"), backend=tiny_backend,
                      log=lambda s: None)
    assert other.n_new == len(expected)


def test_layers_through_the_cli(tiny_run, tiny_backend, tiny_model_dir, capsys, tmp_path):
    if not (tiny_run / "judge.jsonl").exists():
        run_judge(_cfg(tiny_run, tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    assert main(["metrics", str(tiny_run), "--score-layer", "judged", "--n-boot", "20",
                 "--out", str(tmp_path / "j.json")]) == 0
    out = capsys.readouterr().out
    assert "MemToC metrics" in out and "CAR judge" in out
    saved = json.loads((tmp_path / "j.json").read_text())
    assert saved["judge"]["model"] == str(tiny_model_dir) and "changes" in saved
    assert main(["metrics", str(tiny_run), "--score-layer", "both", "--n-boot", "20"]) == 0
    assert "judged - det (pp)" in capsys.readouterr().out
    # the report shows both layers side by side when a judge pass exists
    assert main(["report", str(tiny_run), "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")
    assert "Deterministic vs judged layer" in md and "judged - det (pp)" in md
    # deterministic through the old --input path is unchanged
    assert main(["metrics", "--input", str(tiny_run / "episodes.jsonl"), "--n-boot", "20"]) == 0
    capsys.readouterr()
    # a judged comparison refuses arms judged by different judges
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(tiny_run, twin)
    lines = (twin / "judge.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(x) for x in lines]
    for r in recs:
        r["judge"]["weights_sha256"] = "0" * 64
    (twin / "judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    assert main(["compare", str(tiny_run), str(twin), "--score-layer", "judged"]) == 2
    assert "weights_sha256" in capsys.readouterr().err
    # without a judge pass the judged layer is a clear error
    assert main(["metrics", str(tmp_path), "--score-layer", "judged"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.real_model
def test_default_judge_on_a_tiny_default_run(default_backend, tmp_path):
    run = tmp_path / "run"
    evaluate(EvaluationConfig(
        model_spec=ModelSpec(model="default"),
        selection=EpisodeSelection(benchmark="demo", limit=3, conditions="tool_wrong"),
        job=JobSettings(out=str(run), progress=False), generation=GenerationConfig(max_new_tokens=48)), backend=default_backend,
             log=lambda s: None)
    res = run_judge(JudgeConfig(run_dir=str(run), judge_model="default", progress=False), backend=default_backend,
                    log=lambda s: None)
    recs = read_judge_records(res.path)
    assert res.n_new == len(recs) >= 3
    assert all(r["judge"]["model"] == "default" for r in recs.values())
    acks = [r["verdict"]["ack"] for r in recs.values() if r["kind"] == "ack"]
    assert len(acks) == 3


# -- the judged layer refuses what it cannot vouch for ----------------------------------------------------------

@pytest.fixture()
def judged_copy(tiny_run, tiny_backend, tiny_model_dir, tmp_path) -> Path:
    import shutil

    if not (tiny_run / "judge.jsonl").exists():
        run_judge(_cfg(tiny_run, tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("judge_*.jsonl"))
    return run


def _judge_lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "judge.jsonl").read_text(encoding="utf-8").splitlines()]


def _write_judge(run: Path, recs: list[dict]) -> None:
    (run / "judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")


def test_records_carry_the_run_identity_and_span_hash(judged_copy):
    from memtoc.scoring.judge.binding import run_identity_sha256, span_sha256

    recs = _judge_lines(judged_copy)
    rid = run_identity_sha256(judged_copy)
    assert rid and all(r["run_identity_sha256"] == rid for r in recs)
    assert all(r["span_sha256"] == span_sha256(r["answer"]) for r in recs)


def test_a_partial_pass_is_refused_unless_allowed_and_then_marked(judged_copy, capsys, tmp_path):
    recs = _judge_lines(judged_copy)
    _write_judge(judged_copy, recs[: len(recs) // 2])           # a judge killed half way
    assert main(["metrics", str(judged_copy), "--score-layer", "judged", "--n-boot", "20"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "partial judge pass" in err
    assert f"{len(recs) // 2} of {len(recs)} judge requests judged" in err and "--allow-partial" in err
    import shutil

    twin = tmp_path / "twin"                                   # one run twice is refused: compare it with a copy
    shutil.copytree(judged_copy, twin)
    for argv in (["compare", str(judged_copy), str(twin), "--score-layer", "judged"],
                 ["ack", "car", str(judged_copy)]):
        assert main(argv) == 2 and "partial judge pass" in capsys.readouterr().err
    out = tmp_path / "j.json"
    assert main(["metrics", str(judged_copy), "--score-layer", "judged", "--n-boot", "20", "--allow-partial",
                 "--out", str(out)]) == 0
    assert f"PARTIAL judge pass (--allow-partial): {len(recs) // 2} of {len(recs)}" in capsys.readouterr().out
    cov = json.loads(out.read_text())["coverage"]
    assert cov["partial"] is True and (cov["n_judged"], cov["n_requests"]) == (len(recs) // 2, len(recs))


def test_a_judge_file_of_another_run_is_refused(judged_copy, capsys):
    from memtoc.scoring.judge.binding import span_sha256

    recs = _judge_lines(judged_copy)
    other = [{**r, "run_identity_sha256": "f" * 64} for r in recs]       # judged on another run
    _write_judge(judged_copy, other)
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    assert "judged on another run" in capsys.readouterr().err
    # another model's answers under the same request ids (a forged YES file, no run identity): the span differs
    forged = [{k: v for k, v in r.items() if k != "run_identity_sha256"} for r in recs]
    for r in forged:
        r["answer"] = "McLean Stevenson"
        r["span_sha256"] = span_sha256("McLean Stevenson")
        r["reply"], r["verdict"] = "YES", ({"ack": True} if r["kind"] == "ack" else r["verdict"])
    _write_judge(judged_copy, forged)
    assert main(["ack", "car", str(judged_copy)]) == 2
    err = capsys.readouterr().err
    assert "judged another answer than the run's" in err and len(err.strip().splitlines()) == 1
    # an older file without the hash is matched on its answer text
    _write_judge(judged_copy, [{k: v for k, v in r.items() if k != "span_sha256"} for r in forged])
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    assert "judged another answer" in capsys.readouterr().err
    # a record for a request this run does not have
    _write_judge(judged_copy, recs + [{**recs[0], "request_id": "ack|no-such-episode"}])
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    assert "is not a judge request of the run" in capsys.readouterr().err


def test_a_forged_verdict_or_answer_text_is_refused(judged_copy, capsys):
    """The judged layer re-derives each verdict from the stored reply: a verdict flipped against its
    own reply, or an answer text edited under an unchanged span hash, is refused; the genuine file is read."""
    recs = _judge_lines(judged_copy)
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 0
    capsys.readouterr()
    ack = next(i for i, r in enumerate(recs) if r["kind"] == "ack")
    flipped = [dict(r) for r in recs]
    flipped[ack] = {**recs[ack], "verdict": {"ack": recs[ack]["verdict"]["ack"] is not True}}
    _write_judge(judged_copy, flipped)
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    err = capsys.readouterr().err
    assert "is not what its reply gives" in err and len(err.strip().splitlines()) == 1
    edited = [dict(r) for r in recs]
    edited[ack] = {**recs[ack], "answer": str(recs[ack].get("answer")) + " (edited)"}
    _write_judge(judged_copy, edited)
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    assert "is not the span it was judged on" in capsys.readouterr().err
    extract = [i for i, r in enumerate(recs) if r["kind"] != "ack"]
    if extract:                                    # an extraction's span rewritten, its reply kept
        i = extract[0]
        forged = [dict(r) for r in recs]
        forged[i] = {**recs[i], "verdict": {**recs[i]["verdict"], "status": "span", "span": "forged answer"}}
        _write_judge(judged_copy, forged)
        assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
        assert "the record was edited" in capsys.readouterr().err
    _write_judge(judged_copy, recs)
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 0


def test_duplicate_ids_and_mixed_judges_are_refused(judged_copy, capsys):
    recs = _judge_lines(judged_copy)
    flipped = {**recs[0], "verdict": {"ack": True}, "judge": {**recs[0]["judge"], "model": "another-judge"}}
    _write_judge(judged_copy, recs + [flipped])         # first-wins used to hide the second judge entirely
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    err = capsys.readouterr().err
    assert "duplicate request_id" in err and f"line {len(recs) + 1}" in err and "first on line 1" in err
    _write_judge(judged_copy, [flipped] + recs[1:])      # two judges on different ids
    assert main(["metrics", str(judged_copy), "--score-layer", "judged"]) == 2
    assert "two judges" in capsys.readouterr().err


def test_judge_refuses_to_resume_another_runs_file(judged_copy, tiny_model_dir):
    recs = _judge_lines(judged_copy)
    _write_judge(judged_copy, [{**r, "run_identity_sha256": "f" * 64} for r in recs[:2]])
    with pytest.raises(RunStoreError, match="judged on another run"):
        run_judge(_cfg(judged_copy, tiny_model_dir), log=lambda s: None)
