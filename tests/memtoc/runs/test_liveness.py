"""Liveness of a run directory: a live writer (its lock held) reads as ``running``, a killed one as
``interrupted``; a second writer on the same directory is refused with a clear message."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.core.errors import RunStoreError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.runs.runstore import RunStore, run_state

REPO = Path(__file__).resolve().parents[3]

#: A stand-in writer: takes the run's writer lock exactly as ``memtoc evaluate`` does, marks the run running,
#: says so, and sleeps until killed.
HOLDER = r'''
import sys, time
from pathlib import Path
from memtoc.runs.runstore import RunStore
root = Path(sys.argv[1])
info = RunStore.read(root, warn=None).run_info()
store = RunStore.open(root, identity=info["identity"], run_info={"status": "running"})
print("locked", flush=True)
time.sleep(3600)
'''


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right", limit=2, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


@pytest.fixture(scope="module")
def done_run(tmp_path_factory, tiny_backend, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("live") / "run"
    evaluate(_cfg(tiny_model_dir, root), backend=tiny_backend, log=lambda s: None)
    return root


def _holder(run: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_live_writer_is_running_killed_writer_is_interrupted(done_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    proc = _holder(run)
    try:
        state = run_state(run)
        assert state.status == "running" and state.live is True and state.state == "running"
        assert state.writer["pid"] == proc.pid
        assert main(["metrics", "--input", str(run), "--n-boot", "20"]) == 0
        err = capsys.readouterr().err
        assert "still being written" in err and f"pid {proc.pid}" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    state = run_state(run)
    assert state.status == "running" and state.live is False and state.state == "interrupted"
    for argv in (["metrics", "--input", str(run / "episodes.jsonl"), "--n-boot", "20"],
                 ["compare", str(run), str(done_run)],
                 ["report", str(run), "--out", str(tmp_path / "rep")]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        lines = [l for l in err.splitlines() if l.startswith("warning:")]
        assert len(lines) == 1 and "interrupted" in lines[0] and f"pid {proc.pid}" in lines[0], (argv, err)
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert 'class="warn"' in html and "interrupted" in html
    assert "interrupted" in (tmp_path / "rep" / "report.md").read_text(encoding="utf-8")


def test_second_writer_is_refused_while_the_first_lives(done_run, tmp_path, tiny_backend, tiny_model_dir, capsys):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".writer.lock"}
    proc = _holder(run)
    try:
        with pytest.raises(RunStoreError, match=rf"being written by another memtoc process \(pid {proc.pid}"):
            evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)
        # the same through the CLI: one line, exit 2, before any model loads (a missing model would fail later)
        assert main(["evaluate", "--model", str(tiny_model_dir), "--out", str(run), "--limit", "2",
                     "--conditions", "tool_wrong,tool_right", "--batch-size", "1", "--max-new-tokens", "6",
                     "--device", "cpu", "--dtype", "float32", "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "being written by another memtoc process" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    after = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".writer.lock"}
    assert set(after) == set(before)
    assert after["episodes.jsonl"] == before["episodes.jsonl"]
    # once the holder is dead the run resumes (nothing left to do) and is complete again
    evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)
    assert run_state(run).state == "complete"
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


def test_same_process_can_resume_while_holding_its_result(done_run, tmp_path, tiny_backend, tiny_model_dir):
    """The lock is per process: an evaluation resumed in the process that ran the first is not refused."""
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    first = evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)
    second = evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)
    assert second.n_episodes_new == 0 and first.store.root == second.store.root


def test_readonly_store_refuses_to_append(done_run):
    store = RunStore.read(done_run, warn=None)
    with pytest.raises(RunStoreError, match="reading only"):
        store.episodes.append([{"episode_id": "x"}])


def _alive_elsewhere(run: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from memtoc.runs.runstore "
                           "import writer_alive; print(writer_alive(Path(sys.argv[1])))", str(run)],
                          capture_output=True, text=True, env=env, check=True).stdout.strip()


def test_lock_follows_a_directory_made_anew_in_the_same_process(done_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(done_run, run)
    identity = RunStore.read(run, warn=None).run_info()["identity"]
    first = RunStore.open(run, identity=identity, run_info={"status": "running"})
    shutil.rmtree(run)                          # e.g. derived data rebuilt from scratch
    shutil.copytree(done_run, run)
    second = RunStore.open(run, identity=identity, run_info={"status": "running"})
    assert _alive_elsewhere(run) == "True"
    first.close()
    assert _alive_elsewhere(run) == "True"      # the old lease does not release the new lock
    second.close()
    assert _alive_elsewhere(run) == "False"
    assert run_state(run).state == "interrupted"    # status left 'running', nobody holds it
