"""End-to-end evaluation: run directory contents, resume, crash safety, refusal of mixed settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.core.errors import RunStoreError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec

REPO = Path(__file__).resolve().parents[3]


def _lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_right,tool_wrong,tool_error,no_tool", limit=3, batch_size=4, max_new_tokens=10,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def test_evaluate_writes_complete_run_and_rerun_is_noop(tiny_backend, tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run")
    first = evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    root = tmp_path / "run"
    assert {p.name for p in root.iterdir()} == {"run.json", "closed_book.jsonl", "episodes.jsonl", "summary.json",
                                               ".writer.lock"}
    info = json.loads((root / "run.json").read_text())
    assert info["status"] == "complete"
    assert len(info["identity"]["weights_sha256"]) == 64
    assert info["identity"]["benchmark_files"]["demo/questions.jsonl"] == info["benchmark"]["files"]["demo/questions.jsonl"]
    assert info["identity"]["prompt_version"] == 2 and info["provenance"]["n_layers"] == 3
    cb, eps = _lines(root / "closed_book.jsonl"), _lines(root / "episodes.jsonl")
    assert len(cb) == 3 and len(eps) == 12
    assert first.n_closed_book_new == 3 and first.n_episodes_new == 12
    for rec in eps:
        for field in ("episode_id", "question_id", "condition", "formulation", "prompt", "response", "extracted",
                      "followed_tool", "kept_memory", "final_correct", "outcome", "neither_subtype", "abstain",
                      "abstain_raw", "ack_proxy", "cell", "memory_span", "mem_absent", "memory_correct",
                      "trivial_hop", "n_new_tokens", "stop_reason"):
            assert field in rec, field
    summary = json.loads((root / "summary.json").read_text())
    assert summary["n_episodes"] == {"planned": 12, "done": 12}
    assert "retention" in summary["metrics"]["metrics"] or "retention" in json.dumps(summary["metrics"])
    before = (root / "episodes.jsonl").read_bytes(), (root / "closed_book.jsonl").read_bytes()
    again = evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    assert again.n_closed_book_new == 0 and again.n_episodes_new == 0
    assert ((root / "episodes.jsonl").read_bytes(), (root / "closed_book.jsonl").read_bytes()) == before


def test_records_are_scored_by_the_one_scorer(tiny_backend, tiny_model_dir, tmp_path):
    from memtoc.bench.offline import score_record

    evaluate(_cfg(tiny_model_dir, tmp_path / "run"), backend=tiny_backend, log=lambda s: None)
    cb = {r["question_id"]: r for r in _lines(tmp_path / "run" / "closed_book.jsonl")}
    for rec in _lines(tmp_path / "run" / "episodes.jsonl"):
        mem = cb[rec["question_id"]]
        again = score_record({"question": rec["question"], "gold_answer": rec["gold_answer"],
                              "condition": rec["condition"], "response": rec["response"],
                              "tool_value": rec["tool_value"], "memory_answer": mem["response"],
                              "aliases": rec["aliases"]})
        for field in ("extracted", "followed_tool", "kept_memory", "final_correct", "outcome", "abstain", "cell"):
            assert again[field] == rec[field], field


@pytest.mark.parametrize("first,then,named", [
    (dict(limit=None, question_set="fold-A"), ["--limit", "4"], "limit: None in the folder, 4 now"),
    (dict(limit=2), [], "limit: 2 in the folder, None now"),
    (dict(limit=2), ["--limit", "3"], "limit: 2 in the folder, 3 now"),
    (dict(limit=2), ["--limit", "2", "--question-set", "fold-B"], "question_set: 'all' in the folder, 'fold-B' now"),
])
def test_another_selection_into_a_run_folder_is_refused_before_loading(
        tiny_backend, tiny_model_dir, tmp_path, monkeypatch, capsys, first, then, named):
    """A folder is one plan: a full run and a limited one never mix (the README's "made with different settings
    is refused"), in one line naming the folder and the setting, before the model loads."""
    root = tmp_path / "run"
    evaluate(_cfg(tiny_model_dir, root, conditions="no_tool", **first), backend=tiny_backend, log=lambda s: None)
    eps = root / "episodes.jsonl"                        # as an interrupted run (make demo stopped) leaves it
    eps.write_text(eps.read_text(encoding="utf-8").splitlines(keepends=True)[0], encoding="utf-8")
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}
    from memtoc.backends.hf import HFBackend

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: pytest.fail("weights were loaded")))
    qs = ["--question-set", first["question_set"]] if "question_set" in first else []
    code = main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "demo", "--conditions", "no_tool",
                 "--formulations", "reference", "--max-new-tokens", "10", "--out", str(root), *qs, *then])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(root) in err and "another episode selection" in err and named in err
    assert {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()} == before


def test_a_smaller_selection_the_folder_already_holds_is_only_re_read(tiny_backend, tiny_model_dir, tmp_path):
    """Nothing is added, so nothing mixes (a cross-fit reruns its base run on fewer conditions this way)."""
    root = tmp_path / "run"
    evaluate(_cfg(tiny_model_dir, root, conditions="no_tool,tool_wrong", limit=2), backend=tiny_backend,
             log=lambda s: None)
    before = (root / "episodes.jsonl").read_bytes(), (root / "closed_book.jsonl").read_bytes()
    again = evaluate(_cfg(tiny_model_dir, root, conditions="tool_wrong", limit=1), backend=tiny_backend,
                     log=lambda s: None)
    assert again.n_episodes_new == 0 and again.n_closed_book_new == 0 and len(again.records) == 1
    assert ((root / "episodes.jsonl").read_bytes(), (root / "closed_book.jsonl").read_bytes()) == before


def test_a_resume_says_how_much_was_already_done(tiny_backend, tiny_model_dir, tmp_path):
    root = tmp_path / "run"
    cfg = _cfg(tiny_model_dir, root, conditions="no_tool,tool_wrong", limit=2)
    evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    lines = (root / "episodes.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (root / "episodes.jsonl").write_text("".join(lines[:1]), encoding="utf-8")     # as if killed after one batch
    said: list[str] = []
    again = evaluate(cfg, backend=tiny_backend, log=said.append)
    assert again.n_episodes_new == len(lines) - 1
    assert f"{root}: resuming: 1 of {len(lines)} episodes and 2 of 2 closed-book answers already done; " \
           f"{len(lines) - 1} episodes to run" in said
    said.clear()
    evaluate(cfg, backend=tiny_backend, log=said.append)        # finished: no resume line, the no-op line
    assert not any("resuming" in s for s in said) and any("nothing left to run" in s for s in said)


def test_different_settings_are_refused(tiny_backend, tiny_model_dir, tmp_path):
    evaluate(_cfg(tiny_model_dir, tmp_path / "run"), backend=tiny_backend, log=lambda s: None)
    with pytest.raises(RunStoreError, match="max_new_tokens"):
        evaluate(_cfg(tiny_model_dir, tmp_path / "run", max_new_tokens=11), backend=tiny_backend, log=lambda s: None)
    with pytest.raises(RunStoreError, match="prompt_intervention"):
        evaluate(_cfg(tiny_model_dir, tmp_path / "run", prompt_intervention="warn"), backend=tiny_backend,
                 log=lambda s: None)


def test_cli_error_is_one_clear_line(tmp_path, capsys):
    assert main(["evaluate", "--benchmark", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "not found" in err and "Traceback" not in err


def _evaluate_cmd(model_dir: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "memtoc.cli", "evaluate", "--model", str(model_dir), "--out", str(out),
            "--limit", "6", "--conditions", "tool_right,tool_wrong,no_tool", "--batch-size", "1",
            "--max-new-tokens", "24", "--device", "cpu", "--dtype", "float32", "--no-progress"]


def test_killed_run_resumes_to_the_same_records(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ref = tmp_path / "ref"
    subprocess.run(_evaluate_cmd(tiny_model_dir, ref), check=True, env=env, capture_output=True, timeout=300)
    victim = tmp_path / "victim"
    proc = subprocess.Popen(_evaluate_cmd(tiny_model_dir, victim), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    eps = victim / "episodes.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if eps.exists() and eps.read_text(encoding="utf-8").count("\n") >= 4:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done_before = len(_lines(eps))
    assert 4 <= done_before < 18
    subprocess.run(_evaluate_cmd(tiny_model_dir, victim), check=True, env=env, capture_output=True, timeout=300)
    for name in ("closed_book.jsonl", "episodes.jsonl"):
        a = {r.get("episode_id", r.get("key")): r for r in _lines(ref / name)}
        b = {r.get("episode_id", r.get("key")): r for r in _lines(victim / name)}
        assert len(_lines(victim / name)) == len(b)  # no duplicates
        assert a == b
    assert json.loads((victim / "run.json").read_text())["status"] == "complete"


def test_torn_last_line_is_dropped_on_resume(tiny_backend, tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run")
    evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    path = tmp_path / "run" / "episodes.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2], encoding="utf-8")
    again = evaluate(cfg, backend=tiny_backend, log=lambda s: None)
    assert again.n_episodes_new == 1
    assert [json.loads(l)["episode_id"] for l in path.read_text().splitlines()] == \
        [json.loads(l)["episode_id"] for l in lines]


@pytest.mark.real_model
def test_default_model_end_to_end(default_backend, tmp_path):
    cfg = EvaluationConfig(
        model_spec=ModelSpec(model="default"),
        selection=EpisodeSelection(benchmark="demo", limit=2, conditions="tool_right,tool_wrong"),
        job=JobSettings(out=str(tmp_path / "run"), progress=False), generation=GenerationConfig(max_new_tokens=48))
    res = evaluate(cfg, backend=default_backend, log=lambda s: None)
    eps = _lines(tmp_path / "run" / "episodes.jsonl")
    assert len(eps) == 4 and res.n_closed_book_new == 2
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["provenance"]["gguf_file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert info["identity"]["weights_sha256"] == info["provenance"]["weights"]["sha256"]
    assert all(r["response"].strip() for r in eps)
    assert evaluate(cfg, backend=default_backend, log=lambda s: None).n_episodes_new == 0


def test_an_edited_run_says_so_at_its_start(tiny_backend, tiny_model_dir, tmp_path):
    """The console names the edit (kind, sites, positions, strength) before anything is generated;
    an untreated run prints no such line."""
    import torch

    import memtoc as mt

    d = tiny_backend.parts.d_model
    unit = torch.zeros(d)
    unit[0] = 1.0
    edit = mt.vector_edit({1: unit}, positions="last_input", strength=2.0)
    lines: list[str] = []
    evaluate(_cfg(tiny_model_dir, tmp_path / "edited", limit=1, conditions="tool_wrong"), backend=tiny_backend,
             edit=edit, log=lines.append)
    said = [x for x in lines if x.startswith("EDIT applied:")]
    assert len(said) == 1 and "sites 1" in said[0] and "last_input" in said[0] and "strength 2" in said[0]
    plain: list[str] = []
    evaluate(_cfg(tiny_model_dir, tmp_path / "plain", limit=1, conditions="tool_wrong"), backend=tiny_backend,
             log=plain.append)
    assert not [x for x in plain if x.startswith("EDIT applied:")]
