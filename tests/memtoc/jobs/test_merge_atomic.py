"""``memtoc merge --overwrite`` is atomic: a merge killed at any step leaves the old complete output or the new
one, never none and never a mix; what a killed merge leaves behind is repaired or removed by the next one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import memtoc.core.fileio as fileio
from memtoc.core.errors import MemtocError
from memtoc.core.values import build_config
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.jobs.merge import merge_runs

REPO = Path(__file__).resolve().parents[3]
QUIET = lambda s: None  # noqa: E731

#: Every file-system mutation a merge makes goes through one of these; a "kill" at step N stops the process
#: (os._exit, no cleanup handlers) just before the N-th such call.
STEPS = [(os, "rename"), (os, "replace"), (os, "fsync"), (os, "mkdir"), (os, "unlink"), (os, "rmdir"),
         (shutil, "rmtree"), (fileio, "exchange_paths")]


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right", limit=2, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def snapshot(root: Path) -> dict[str, str] | None:
    if not root.exists():
        return None
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_backend, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("atomic")
    evaluate(_cfg(tiny_model_dir, root / "a", conditions="tool_wrong"), backend=tiny_backend, log=QUIET)
    evaluate(_cfg(tiny_model_dir, root / "b", conditions="tool_right"), backend=tiny_backend, log=QUIET)
    return root


@pytest.fixture()
def outputs(shards, tmp_path):
    """The old output (a merge of shard a) and the new one (a + b) at ``work/out``, as file snapshots; the old
    one is kept in ``ref/old`` to be put back before each try."""
    out = tmp_path / "work" / "out"
    merge_runs([shards / "a"], out, log=QUIET)
    old = snapshot(out)
    (tmp_path / "ref").mkdir()
    shutil.move(str(out), str(tmp_path / "ref" / "old"))
    merge_runs([shards / "a", shards / "b"], out, log=QUIET)
    new = snapshot(out)
    shutil.rmtree(out)
    assert old != new
    return tmp_path / "ref" / "old", old, new


def _count_steps(monkeypatch, fn) -> int:
    n = [0]
    for mod, name in STEPS:
        orig = getattr(mod, name)

        def counted(*a, _orig=orig, **k):
            n[0] += 1
            return _orig(*a, **k)
        monkeypatch.setattr(mod, name, counted)
    fn()
    monkeypatch.undo()
    return n[0]


def _run_killed_at(step: int, fn, no_exchange: bool) -> int:
    """Run ``fn`` in a forked child that dies (os._exit(137), like SIGKILL: no handlers run) just before its
    ``step``-th file-system mutation. Returns the child's exit status."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            if no_exchange:     # before wrapping, so the (refused) exchange call is still one counted step
                fileio.exchange_paths = lambda a, b: False
            n = [0]
            for mod, name in STEPS:
                orig = getattr(mod, name)

                def killing(*a, _orig=orig, **k):
                    n[0] += 1
                    if n[0] == step:
                        os._exit(137)
                    return _orig(*a, **k)
                setattr(mod, name, killing)
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("no_exchange", [False, True], ids=["renameat2-exchange", "two-rename-fallback"])
def test_kill_at_every_step_leaves_old_or_new(shards, outputs, tmp_path, monkeypatch, no_exchange):
    old_dir, old, new = outputs
    out = tmp_path / "work" / "out"

    def merge():
        merge_runs([shards / "a", shards / "b"], out, overwrite=True, log=QUIET)

    def reset():
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(old_dir, out)

    reset()
    if no_exchange:
        monkeypatch.setattr(fileio, "exchange_paths", lambda a, b: False)
    n_steps = _count_steps(monkeypatch, merge)
    assert snapshot(out) == new and n_steps >= 8
    seen = set()
    for step in range(1, n_steps + 1):
        reset()
        code = _run_killed_at(step, merge, no_exchange)
        assert code == 137, (step, code)
        now = snapshot(out)
        if now == old:
            seen.add("old")
        elif now == new:
            seen.add("new")
        else:
            # only the fallback has a gap, and there the complete old output waits beside out
            assert no_exchange and now is None, (step, now)
            parked = list(out.parent.glob(".out.merge-old-*"))
            assert len(parked) == 1 and snapshot(parked[0]) == old, step
            seen.add("gap")
        # the next merge repairs whatever was left and leaves nothing hidden behind
        merge_runs([shards / "a", shards / "b"], out, overwrite=True, log=QUIET)
        assert snapshot(out) == new, step
        assert sorted(p.name for p in out.parent.iterdir()) == ["out"], step
    assert {"old", "new"} <= seen
    if not no_exchange:
        assert "gap" not in seen


def test_next_run_restores_old_output_after_a_gap_kill(shards, outputs, tmp_path):
    """Killed between the fallback's two renames: a reader-facing command that is refused (no --overwrite)
    still gets the old output back in place."""
    old_dir, old, _ = outputs
    out = tmp_path / "work" / "out"
    shutil.copytree(old_dir, fileio.temp_sibling(out, "merge-old", pid=_dead_pid()))
    assert not out.exists()
    from memtoc.runs.runstore import RunStore
    with pytest.raises(MemtocError, match="merge --overwrite' into it was interrupted"):
        RunStore.read(out)                      # a reader in the gap is told where the old output is
    with pytest.raises(MemtocError, match="already exists"):
        merge_runs([shards / "a"], out, log=QUIET)
    assert snapshot(out) == old and sorted(p.name for p in out.parent.iterdir()) == ["out"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temps_of_dead_merges_are_removed_live_ones_kept(tmp_path):
    target = tmp_path / "out"
    dead = fileio.temp_sibling(target, "merge-tmp", pid=_dead_pid())
    mine = fileio.temp_sibling(target, "merge-tmp")
    other = tmp_path / ".other.merge-tmp-1"
    for d in (dead, mine, other):
        d.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        alive = fileio.temp_sibling(target, "merge-tmp", pid=live.pid)
        alive.mkdir()
        removed = fileio.clean_stale_siblings(target, ("merge-tmp",))
        assert removed == [dead]
        assert not dead.exists() and mine.exists() and alive.exists() and other.exists()
    finally:
        live.kill()
        live.wait()


def test_real_sigkill_before_the_swap_keeps_the_old_output(shards, outputs, tmp_path):
    old_dir, old, new = outputs
    out = tmp_path / "work" / "out"
    shutil.copytree(old_dir, out)
    # a real merge process, stopped (by itself) once its new directory is complete and fsynced, then SIGKILLed
    script = ("import sys, time, memtoc.core.fileio as f, memtoc.jobs.merge as m\n"
              "orig = f.fsync_tree\n"
              "def stop(p):\n    orig(p); print('built', flush=True); time.sleep(3600)\n"
              "m.fsync_tree = stop\n"
              "from memtoc.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script, "merge", str(shards / "a"), str(shards / "b"),
                             "--out", str(out), "--overwrite"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "built"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert snapshot(out) == old
    left = list(out.parent.glob(f".out.merge-tmp-{proc.pid}"))
    assert len(left) == 1 and snapshot(left[0]) == new      # the finished new copy, never swapped in
    res = merge_runs([shards / "a", shards / "b"], out, overwrite=True, log=QUIET)
    assert res.status == "complete" and snapshot(out) == new
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_overwrite_refuses_a_directory_that_is_not_a_run(shards, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(MemtocError, match="not a run directory"):
        merge_runs([shards / "a"], precious, overwrite=True, log=QUIET)
    assert (precious / "notes.txt").read_text() == "keep me"


def test_replace_dir_swaps_whole_directories(tmp_path):
    target, new = tmp_path / "t", tmp_path / ".t.merge-tmp-1"
    target.mkdir()
    (target / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    fileio.replace_dir(new, target)
    assert [p.name for p in target.iterdir()] == ["new.txt"] and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_atomic_file_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    fileio.write_json_atomic(path, {"v": 1})

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(MemtocError, match=r"x\.json: cannot write \(No space left on device \(ENOSPC\)\)"):
        fileio.write_json_atomic(path, {"v": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
