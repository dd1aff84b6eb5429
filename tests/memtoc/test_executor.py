"""``memtoc.executor`` without Ray: the local executor's results, progress lines and failure summary, the
registry, and ``--executor ray`` failing with the install command where Ray is not installed."""

from __future__ import annotations

import sys

import pytest

from memtoc.executor import EXECUTORS, ExecutorError, Resources, Task, make_executor, run_tasks


def _ok(x):
    return 0


def _user_error(x):
    print("noise", file=sys.stderr)
    print(f"memtoc evaluate: error: bad value {x}", file=sys.stderr)
    return 2


def _raises(x):
    raise RuntimeError(f"boom {x}")


def test_local_executor_runs_every_task_and_reports_per_arm():
    lines = []
    tasks = [Task("a.1", "a", _ok, (1,)), Task("b.1", "b", _user_error, (7,)), Task("a.2", "a", _ok, (2,)),
             Task("c", "c", _raises, (3,))]
    ex = run_tasks(tasks, "local", log=lines.append, label="t")
    assert [r.name for r in ex.results] == ["a.1", "b.1", "a.2", "c"]
    assert [r.rc for r in ex.results] == [0, 2, 0, 1] and not ex.ok
    assert ex.results[1].error == "memtoc evaluate: error: bad value 7"
    assert ex.results[3].error == "RuntimeError: boom 3"
    # one line per arm, when its last task finished (arm a has two tasks: one line)
    assert len(lines) == 3
    assert lines[0].startswith("t: [1/3 arms] b: FAILED (1/1 tasks; last error: memtoc evaluate: error: bad value 7)")
    assert lines[1].startswith("t: [2/3 arms] a: ok (2 tasks")
    assert lines[2].startswith("t: [3/3 arms] c: FAILED")
    assert set(ex.failed_arms()) == {"b", "c"}
    summary = ex.summary()
    assert summary.startswith("2 arm(s) failed:") and "b.1: exit 2: memtoc evaluate: error: bad value 7" in summary
    assert run_tasks([Task("a", "a", _ok, (0,))], "local", log=lines.append).summary() == ""


def test_registry_and_option_checks():
    assert EXECUTORS.names()[:2] == ("local", "ray")
    with pytest.raises(ExecutorError, match="--executor must be one of local, ray"):
        make_executor("slurm")
    with pytest.raises(ExecutorError, match="--address .* needs --executor ray"):
        make_executor("local", address="10.0.0.1:6379")
    with pytest.raises(ExecutorError, match="must not be negative"):
        Resources(gpus=-1).check()


def test_ray_executor_without_ray_names_the_install_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` raises ImportError
    with pytest.raises(ExecutorError, match=r"pip install 'memtoc-toolkit\[ray\]'"):
        make_executor("ray")
    from memtoc.cli import main

    recipe = tmp_path / "r.toml"
    recipe.write_text('[[steps]]\nname = "a"\ncommand = "evaluate"\nout = "x"\n', encoding="utf-8")
    assert main(["run-experiment", str(recipe), "--out", str(tmp_path / "exp"), "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "memtoc run-experiment: error: --executor ray needs Ray" in err and "memtoc-toolkit[ray]" in err
    assert main(["sweep", "--edit", "e.json", "--out", str(tmp_path / "sw"), "--executor", "ray"]) == 2
    assert "memtoc-toolkit[ray]" in capsys.readouterr().err
