"""``--executor ray`` on a local Ray instance (2 CPUs, started once for this module): a recipe of two arms x two
shards gives the same merged run directories as ``--executor local``, record for record; a task whose worker
dies mid-run is retried by Ray and resumes from its run directory (complete records, no duplicates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from memtoc.cli.recipes import run_experiment  # noqa: E402
from memtoc.jobs.executor import Resources, init_ray  # noqa: E402

RECIPE = """
name = "scale"
description = "two prompt arms, each run as two question-fold shards and merged"
[defaults]
benchmark = "demo"
formulations = "reference"
conditions = "tool_wrong,no_conflict"
limit = 2
max_new_tokens = 4
batch_size = 1
no_progress = true
[[steps]]
name = "standard"
command = "evaluate"
out = "runs/standard"
shards = { question_set = ["fold-A", "fold-B"] }
[[steps]]
name = "warn"
command = "evaluate"
out = "runs/warn"
args = { prompt_intervention = "warn" }
shards = { question_set = ["fold-A", "fold-B"] }
"""


@pytest.fixture(scope="module")
def ray_local():
    started = not ray.is_initialized()
    if started:
        init_ray(ray, num_cpus=2, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


def _niceness() -> int:
    import os

    return os.nice(0)


def test_a_local_instance_runs_its_workers_at_the_callers_priority(ray_local):
    """Ray's default puts workers at nice 15, where any other busy process on the machine starves the job's work."""
    import os

    assert ray_local.get(ray_local.remote(_niceness).remote()) == os.nice(0)


def _records(run: Path, name: str, key: str) -> list[dict]:
    recs = [json.loads(line) for line in (run / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    keys = [r[key] for r in recs]
    assert len(keys) == len(set(keys)), f"duplicate {key} in {run / name}"
    return sorted(recs, key=lambda r: r[key])


def _same_runs(a: Path, b: Path, ignore: tuple[str, ...] = ()) -> int:
    n = 0
    for name, key in (("closed_book.jsonl", "key"), ("episodes.jsonl", "episode_id")):
        ra, rb = _records(a, name, key), _records(b, name, key)
        assert [r[key] for r in ra] == [r[key] for r in rb], name
        for x, y in zip(ra, rb):
            assert {k: v for k, v in x.items() if k not in ignore} == \
                {k: v for k, v in y.items() if k not in ignore}, (name, x[key])
        n += len(ra)
    return n


def _recipe(tmp_path: Path) -> Path:
    p = tmp_path / "scale.toml"
    p.write_text(RECIPE, encoding="utf-8")
    return p


def test_ray_executor_gives_the_local_merged_runs(ray_local, tmp_path, tiny_model_dir):
    recipe = _recipe(tmp_path)
    runs = {}
    for executor in ("local", "ray"):
        lines: list[str] = []
        res = run_experiment(recipe, out=tmp_path / executor, model=str(tiny_model_dir), report=False,
                             log=lines.append, executor=executor, resources=Resources(cpus=1, max_retries=1))
        assert res.ok, lines
        assert [s["status"] for s in res.steps] == ["ok", "ok"]
        assert [len(s["tasks"]) for s in res.steps] == [2, 2]
        progress = [ln for ln in lines if "arms]" in ln]
        assert len(progress) == 2 and all(": ok (2 tasks" in ln for ln in progress), progress
        runs[executor] = tmp_path / executor / "runs"
    for arm in ("standard", "warn"):
        for shard in ("fold-A", "fold-B"):      # each shard wrote its own run directory
            assert (runs["ray"] / f"{arm}.{shard}" / "run.json").exists()
        assert _same_runs(runs["local"] / arm, runs["ray"] / arm) == 2 * 2 + 2 * 2 * 2
        info = json.loads((runs["ray"] / arm / "run.json").read_text())
        assert len(info["merged_from"]) == 2
        assert info["status"] == "complete" and (runs["ray"] / arm / "summary.json").exists()


def test_killed_task_is_retried_and_resumes_from_its_run_directory(ray_local, tmp_path, tiny_model_dir):
    marker = tmp_path / "killed-once"
    resumed = tmp_path / "found-by-the-retry.jsonl"

    def dying_step(command, values):
        """On its first attempt the standard/fold-A task kills its own worker after the first episode batch."""
        import os
        from pathlib import Path

        from memtoc.recipes.experiment import run_job_step
        from memtoc.runs.runstore import JsonlLog

        out = str(values.get("out", ""))
        if out.endswith("standard.fold-A") and not marker.exists():
            original = JsonlLog.append

            def append_then_die(self, records):
                n = original(self, records)
                if self.path.name == "episodes.jsonl" and n:
                    marker.write_text(str(len(self)), encoding="utf-8")
                    os._exit(9)              # the worker process dies; Ray sees a crashed worker
                return n

            JsonlLog.append = append_then_die
        elif out.endswith("standard.fold-A"):      # the retry: what the dead attempt left behind
            episodes = Path(out) / "episodes.jsonl"
            resumed.write_text(episodes.read_text(encoding="utf-8"), encoding="utf-8")
        return run_job_step(command, values)

    recipe = _recipe(tmp_path)
    lines: list[str] = []
    res = run_experiment(recipe, out=tmp_path / "ray", model=str(tiny_model_dir), report=False, log=lines.append,
                         executor="ray", resources=Resources(cpus=1, max_retries=2), step=dying_step)
    assert res.ok, lines
    assert marker.read_text() == "1"         # it died after one episode had been written
    shard = tmp_path / "ray" / "runs" / "standard.fold-A"
    eps = _records(shard, "episodes.jsonl", "episode_id")     # no duplicates (checked inside)
    assert len(eps) == 2 * 2
    left = resumed.read_text(encoding="utf-8")        # the retry found the dead attempt's record and kept it
    assert len(left.splitlines()) == 1 and (shard / "episodes.jsonl").read_text(encoding="utf-8").startswith(left)
    # the same records as an undisturbed local run
    ref = run_experiment(recipe, out=tmp_path / "local", model=str(tiny_model_dir), report=False,
                         log=lambda s: None, executor="local")
    assert ref.ok
    for arm in ("standard", "warn"):
        assert _same_runs(tmp_path / "local" / "runs" / arm, tmp_path / "ray" / "runs" / arm) == 12


def _unit(d: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def test_sweep_strengths_as_ray_tasks_give_the_local_sweep(ray_local, tmp_path, tiny_model_dir, capsys):
    from memtoc.cli import main
    from steering import DirectionEdit
    from steering.kinds.direction import save_direction_edit

    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: _unit(32, 1)}, scale={1: 3.0},
                               positions="from_tool_return", strength=1.0, toward="tool")
    spec = save_direction_edit(tmp_path / "edit.json", edit)
    argv = ["sweep", "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--edit", str(spec),
            "--strengths", "8", "--benchmark", "demo", "--conditions", "tool_wrong,no_conflict", "--limit", "2",
            "--batch-size", "2", "--max-new-tokens", "6", "--n-boot", "50", "--no-progress", "--no-plot"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--executor", "ray", "--max-retries", "1"]) == 0
    err = capsys.readouterr().err
    assert "sweep: [1/1 arms] closed_book: ok" in err and "sweep: [2/2 arms]" in err   # the closed book, then 2 groups
    for s in ("strength_0", "strength_8"):     # (the shared closed book's source path is each sweep's own)
        assert _same_runs(tmp_path / "local" / s, tmp_path / "ray" / s, ignore=("closed_book_source",)) == 2 + 4
    src = [r["closed_book_source"] for r in _records(tmp_path / "ray" / "strength_8", "closed_book.jsonl", "key")]
    assert set(src) == {str((tmp_path / "ray" / "strength_0").resolve())}
    rows = [json.loads((tmp_path / d / "sweep.json").read_text())["rows"] for d in ("local", "ray")]
    assert rows[0] == rows[1]


def test_api_sweep_on_ray_gives_the_local_sweep_and_resumes_under_any_executor(ray_local, tmp_path, tiny_model_dir,
                                                                                capsys):
    """``mt.sweep(..., executor="ray")`` runs the strengths as Ray tasks, as ``memtoc sweep --executor ray`` does;
    the executor is no part of the sweep's record, so the same sweep resumes locally (only the table is built)."""
    import memtoc as mt
    from steering import DirectionEdit
    from steering.kinds.direction import save_direction_edit

    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: _unit(32, 2)}, scale={1: 3.0},
                               positions="from_tool_return", strength=1.0, toward="tool")
    spec = save_direction_edit(tmp_path / "edit.json", edit)
    opts = dict(model=str(tiny_model_dir), device="cpu", dtype="float32", strengths=[8], benchmark="demo",
                conditions="tool_wrong,no_conflict", limit=2, batch_size=2, max_new_tokens=6, n_boot=50,
                progress=False, plot=False)
    local = mt.sweep(spec, out=tmp_path / "local", log=lambda s: None, **opts)
    lines: list[str] = []
    ray_sweep = mt.sweep(spec, out=tmp_path / "ray", log=lines.append, executor="ray", max_retries=1, **opts)
    err = capsys.readouterr().err
    assert "sweep: [1/1 arms] closed_book: ok" in err and "sweep: [2/2 arms]" in err   # the executor's waves
    assert any("every strength of" in ln and "assembling the table" in ln for ln in lines)
    for s in ("strength_0", "strength_8"):
        assert _same_runs(tmp_path / "local" / s, tmp_path / "ray" / s, ignore=("closed_book_source",)) == 2 + 4
    assert ray_sweep.result.rows == local.result.rows
    doc = [json.loads((tmp_path / d / "sweep.json").read_text()) for d in ("local", "ray")]
    assert not {"executor", "address", "cpus_per_arm", "max_retries"} & set(doc[1]["config"])
    assert {k: v for k, v in doc[0]["config"].items() if k != "out"} == \
        {k: v for k, v in doc[1]["config"].items() if k != "out"}
    lines.clear()                                # the Ray sweep, resumed locally: nothing is run again
    again = mt.sweep(spec, out=tmp_path / "ray", log=lines.append, **opts)
    assert again.result.rows == local.result.rows and any("assembling the table" in ln for ln in lines)


def test_crossfit_pieces_as_ray_tasks_give_the_local_crossfit(ray_local, tmp_path, tiny_model_dir, capsys):
    from memtoc.cli import main

    argv = ["finetune", "crossfit", "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
            "--benchmark", "demo", "--objective", "sft", "--limit", "4", "--conditions", "tool_wrong,tool_right",
            "--lr", "0.05", "--train-batch-size", "2", "--batch-size", "8", "--max-new-tokens", "6", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--out", str(tmp_path / "ray"), "--executor", "ray"]) == 0
    err = capsys.readouterr().err
    assert "crossfit: [3/3 arms]" not in err and "crossfit: [2/2 arms]" in err    # base, sft (two folds)
    for d in ("runs/base", "arms/sft"):
        _same_runs(tmp_path / "local" / d, tmp_path / "ray" / d)
    manifests = [json.loads((tmp_path / d / "crossfit.json").read_text()) for d in ("local", "ray")]
    assert ({k: v["sha256"] for k, v in manifests[0]["adapters"].items()}
            == {k: v["sha256"] for k, v in manifests[1]["adapters"].items()})


def _load_and_note(model_dir: str, note: str) -> int:
    """A task: load the model through the one factory and note (worker pid, backend object) in ``note``."""
    import os

    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    backend = load_backend(ModelSpec(model=model_dir, device="cpu", dtype="float32"))
    with open(note, "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {id(backend)}\n")
    return 0


def test_ray_actors_keep_their_model_across_tasks(ray_local, tmp_path, tiny_model_dir):
    from memtoc.jobs.executor import RayExecutor, WorkUnit

    note = tmp_path / "notes.txt"
    ex = RayExecutor(Resources(cpus=1, max_retries=1))
    try:
        assert ex.slots == 2
        tasks = [WorkUnit(f"t{i}", f"t{i}", _load_and_note, (str(tiny_model_dir), str(note))) for i in range(6)]
        assert ex.run(tasks, log=lambda s: None).ok
        assert ex.run(tasks[:2], log=lambda s: None).ok          # a later batch reuses the same actors
    finally:
        ex.close()
    seen = [tuple(line.split()) for line in note.read_text(encoding="utf-8").splitlines()]
    assert len(seen) == 8
    pids = {pid for pid, _ in seen}
    assert 1 <= len(pids) <= 2                                   # one process per worker slot, not per task
    for pid in pids:                                             # each loaded the model once
        assert len({obj for p, obj in seen if p == pid}) == 1
