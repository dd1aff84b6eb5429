"""``memtoc.jobs.executor`` without Ray: the local executor's results, progress lines and failure summary, the
registry, and ``--executor ray`` failing with the install command where Ray is not installed."""

from __future__ import annotations

import sys

import pytest

from memtoc.jobs.executor import EXECUTORS, ExecutorError, Resources, WorkUnit, make_executor, run_tasks


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
    tasks = [WorkUnit("a.1", "a", _ok, (1,)), WorkUnit("b.1", "b", _user_error, (7,)), WorkUnit("a.2", "a", _ok, (2,)),
             WorkUnit("c", "c", _raises, (3,))]
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
    assert run_tasks([WorkUnit("a", "a", _ok, (0,))], "local", log=lines.append).summary() == ""


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
    (tmp_path / "e.json").write_text("{}", encoding="utf-8")     # an input that exists: the executor is checked next
    assert main(["sweep", "--edit", str(tmp_path / "e.json"), "--out", str(tmp_path / "sw"), "--executor", "ray"]) == 2
    assert "memtoc-toolkit[ray]" in capsys.readouterr().err


def test_a_local_ray_start_sets_worker_priority_and_a_connection_does_not(monkeypatch):
    """Only a new local instance takes a system config (Ray refuses one when connecting to a cluster)."""
    from memtoc.jobs.executor import LOCAL_RAY_SYSTEM_CONFIG, init_ray

    calls = []

    class FakeRay:
        def init(self, **kw):
            calls.append(kw)

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    init_ray(FakeRay(), num_cpus=2)
    init_ray(FakeRay(), "10.0.0.1:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    init_ray(FakeRay())
    assert calls[0] == {"address": None, "include_dashboard": False, "num_cpus": 2,
                        "_system_config": LOCAL_RAY_SYSTEM_CONFIG}
    assert LOCAL_RAY_SYSTEM_CONFIG == {"worker_niceness": 0}
    assert "_system_config" not in calls[1] and calls[1]["address"] == "10.0.0.1:6379"
    assert "_system_config" not in calls[2]


def test_recipe_waves_and_shard_checks(tmp_path):
    from pathlib import Path

    from memtoc.cli.recipes import validate_recipe
    from memtoc.recipes.experiment import ExperimentError, load_recipe, waves

    repo = Path(__file__).resolve().parents[3]
    baseline = load_recipe(repo / "experiments" / "baseline.toml")
    # the five prompt arms run together; the comparisons (which read them) wait for them
    assert [[s.name for s in w] for w in waves(baseline.steps)] == [
        ["standard", "warn", "source_priority", "abstain_and_flag", "passage"],
        ["compare_warn", "compare_source_priority", "compare_abstain_and_flag", "compare_passage"]]
    probe = load_recipe(repo / "experiments" / "probe_and_steer.toml")
    # probe and direction both read the store, not each other: one wave; the sweep reads the direction
    assert [[s.name for s in w] for w in waves(probe.steps)] == [["evaluate"], ["extract"], ["probe", "direction"],
                                                                 ["sweep"]]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[steps]]\nname = "c"\ncommand = "compare"\npositional = ["a", "b"]\n'
                   'shards = { seed = [1, 2] }\n', encoding="utf-8")
    with pytest.raises(ExperimentError, match="shards need a command whose outputs merge"):
        validate_recipe(load_recipe(bad))
    bad.write_text('[[steps]]\nname = "e"\ncommand = "evaluate"\nout = "x"\nshards = { question_sets = ["fold-A"] }\n',
                   encoding="utf-8")
    with pytest.raises(ExperimentError, match="--question-sets"):
        validate_recipe(load_recipe(bad))
    bad.write_text('[[steps]]\nname = "e"\ncommand = "evaluate"\nout = "x"\nshards = { question_set = "fold-A" }\n',
                   encoding="utf-8")
    with pytest.raises(ExperimentError, match="non-empty list"):
        load_recipe(bad)


def test_failed_arms_are_summarised_and_the_exit_status_says_so(tmp_path, capsys):
    from memtoc.cli import main

    recipe = tmp_path / "r.toml"
    recipe.write_text('[[steps]]\nname = "a"\ncommand = "evaluate"\nout = "a"\nargs = { benchmark = "no-such-a" }\n'
                      'shards = { question_set = ["fold-A", "fold-B"] }\n'
                      '[[steps]]\nname = "b"\ncommand = "evaluate"\nout = "b"\nargs = { benchmark = "no-such-b" }\n'
                      '[[steps]]\nname = "c"\ncommand = "compare"\npositional = ["${a}", "${b}"]\n',
                      encoding="utf-8")
    assert main(["run-experiment", str(recipe), "--out", str(tmp_path / "exp"), "--no-report"]) == 1
    cap = capsys.readouterr()
    assert "run-experiment: [1/2 arms] a: FAILED (2/2 tasks; last error: memtoc evaluate: error:" in cap.err
    assert "run-experiment: [2/2 arms] b: FAILED (1/1 tasks" in cap.err
    assert "2 step(s) failed:" in cap.out and "FAILED a: exit 2: memtoc evaluate: error:" in cap.out
    assert "no-such-b" in cap.out.split("FAILED b:")[1]
    import json

    state = json.loads((tmp_path / "exp" / "experiment.json").read_text())
    assert [s["status"] for s in state["steps"]] == ["failed", "failed"]    # c (the next wave) never ran
    assert [t["name"] for t in state["steps"][0]["tasks"]] == ["a.fold-A", "a.fold-B"]


def test_the_executor_is_a_sweep_setting_outside_its_record(tmp_path):
    """The executor settings are a piece of both sweeps' configs (``mt.sweep(executor=...)`` as ``--executor``),
    left out of the sweep's record (a sweep resumes under any executor), and checked before any work."""
    import memtoc as mt
    from memtoc.core.errors import MemtocError
    from memtoc.core.config import ExecutorSettings, flat_record
    from memtoc.core.values import build_config
    from memtoc.jobs.sweep import SweepConfig
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig

    for cls in (SweepConfig, CodeexecSweepConfig):
        on_ray = build_config(cls, {"executor": "ray", "cpus_per_arm": 2.0, "max_retries": 1})
        assert on_ray.execution == ExecutorSettings(executor="ray", cpus_per_arm=2.0, max_retries=1)
        assert flat_record(on_ray) == flat_record(cls()) and "executor" not in flat_record(on_ray)
    (tmp_path / "e.json").write_text("{}")    # the edit input exists: the path contract runs first
    with pytest.raises(ExecutorError, match="--executor must be one of local, ray, not 'slurm'"):
        mt.sweep(tmp_path / "e.json", strengths=[2], executor="slurm", out=tmp_path / "sw")
    with pytest.raises(ExecutorError, match="--address .* needs --executor ray"):
        mt.sweep(tmp_path / "e.json", strengths=[2], address="10.0.0.1:6379", out=tmp_path / "sw")
    with pytest.raises(MemtocError, match="each task loads the model and the edit spec itself"):
        mt.sweep(tmp_path / "e.json", strengths=[2], executor="ray", backend=object(), out=tmp_path / "sw")
    assert not (tmp_path / "sw").exists()
