"""``memtoc judge`` on a tiny random model: judge.jsonl, resume after a torn write, no-op, refusal, layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.core.errors import RunStoreError
from memtoc.tasks.memtoc.evaluate import EvaluationConfig, evaluate
from memtoc.scoring.judge.prompts import load_judge_prompts
from memtoc.scoring.judge.requests import build_requests
from memtoc.jobs.judge import JudgeConfig, run_judge
from memtoc.scoring.judge.store import read_judge_records
from memtoc.runs.runstore import RunStore


@pytest.fixture(scope="module")
def tiny_run(tiny_backend, tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("judge") / "run"
    evaluate(EvaluationConfig(model=str(tiny_model_dir), benchmark="demo", out=str(out), formulations="reference",
                              conditions="tool_right,tool_wrong", limit=4, batch_size=4, max_new_tokens=8,
                              device="cpu", dtype="float32", progress=False), backend=tiny_backend,
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
    other = run_judge(_cfg(tiny_run, tiny_model_dir, output="judge_second.jsonl"), backend=tiny_backend,
                      log=lambda s: None)
    assert other.n_new == len(expected)


def test_layers_through_the_cli(tiny_run, tiny_backend, tiny_model_dir, capsys, tmp_path):
    if not (tiny_run / "judge.jsonl").exists():
        run_judge(_cfg(tiny_run, tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    assert main(["metrics", str(tiny_run), "--layer", "judged", "--n-boot", "20",
                 "--output", str(tmp_path / "j.json")]) == 0
    out = capsys.readouterr().out
    assert "MemToC metrics" in out and "CAR judge" in out
    saved = json.loads((tmp_path / "j.json").read_text())
    assert saved["judge"]["model"] == str(tiny_model_dir) and "changes" in saved
    assert main(["metrics", str(tiny_run), "--layer", "both", "--n-boot", "20"]) == 0
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
    assert main(["compare", str(tiny_run), str(twin), "--layer", "judged"]) == 2
    assert "weights_sha256" in capsys.readouterr().err
    # without a judge pass the judged layer is a clear error
    assert main(["metrics", str(tmp_path), "--layer", "judged"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.real_model
def test_default_judge_on_a_tiny_default_run(default_backend, tmp_path):
    run = tmp_path / "run"
    evaluate(EvaluationConfig(model="default", benchmark="demo", out=str(run), limit=3,
                              conditions="tool_wrong", max_new_tokens=48, progress=False), backend=default_backend,
             log=lambda s: None)
    res = run_judge(JudgeConfig(run_dir=str(run), judge_model="default", progress=False), backend=default_backend,
                    log=lambda s: None)
    recs = read_judge_records(res.path)
    assert res.n_new == len(recs) >= 3
    assert all(r["judge"]["model"] == "default" for r in recs.values())
    acks = [r["verdict"]["ack"] for r in recs.values() if r["kind"] == "ack"]
    assert len(acks) == 3
