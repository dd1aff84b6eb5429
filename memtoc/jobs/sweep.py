"""The sweep job of every task: what ``memtoc sweep``, ``mt.sweep(...)`` and a recipe's ``sweep`` step all call.

The family is the config's (``SweepConfig``: MemToC; ``CodeexecSweepConfig``: the code executor), so a family is
chosen one way: by the config an adapter builds. :func:`run_sweep` is the adapters' entry (the executor's waves
first when the strengths run as executor tasks); :func:`sweep` is the job body: every strength an evaluation of
the task (same work items, same backend object, same scorer) into its own run directory ``OUT/strength_<s>``;
strength 0 is always run (it is the baseline: the edit's hooks are installed but add nothing, so it reproduces the
untreated evaluation exactly). A task whose sweep has ``evaluate_strengths`` (MemToC) elicits the untreated closed
book once for the sweep and runs the strengths' tool passes as rows of one batch; a backend with ``row_edits``
(vllm) runs the strengths in shared engine passes (``memtoc.jobs.sweep_pass``); others run
:func:`memtoc.tasks.evaluation.evaluate_task` once per strength. The rows, table and plot are the task's
(``memtoc.tasks.memtoc.sweep``, ``memtoc.tasks.codeexec.sweep``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from memtoc.backends.base import HookedBackend
from memtoc.core.backend_kinds import EDITS, ROW_EDITS
from memtoc.core.errors import MemtocError
from memtoc.core.fileio import (json_ready, sha256_json, write_bytes_atomic, write_json_atomic,
                                write_records_csv_atomic, write_text_atomic)
from memtoc.core.tasks import task_of
from memtoc.core.values import ConfigError
from memtoc.jobs.executor import WorkUnit, executor_of, run_waves
from memtoc.scoring.judge.layer import check_layer
from memtoc.scoring.judge.store import JUDGE_FILE
from memtoc.tasks.evaluation import evaluate_task, load_backend, open_evaluation
from memtoc.tasks.memtoc.sweep import SweepConfig
from memtoc.tasks.sweep_format import parse_strengths, strength_dir_name
from memtoc.tasks.validate import check_edit_for_model, check_run_dir
from steering.spec import DIRECTIONS, EditSpecError

__all__ = ["SweepConfig", "SweepResult", "run_sweep", "sweep", "sweep_waves"]


def _stderr(s: str) -> None:
    print(s, file=sys.stderr)


@dataclass
class SweepResult:
    """A sweep written: its rows, each strength's run directory, the files (json, csv, markdown, plot)."""
    out: Path
    rows: list[dict[str, Any]]
    run_dirs: dict[float, Path]
    files: dict[str, Path]
    markdown: str
    passes: Any = None      # memtoc.backends.shared_pass.PassStats when the strengths shared engine passes


def run_sweep(cfg: Any, *, backend: Any = None, edit: Any = None, log: Callable[[str], None] | None = None,
              layer: str | None = None, judge_file: str | None = None) -> SweepResult:
    """Evaluate the edit (``edit``, else the spec ``cfg.edit``) at every strength of ``cfg`` (0 first) and write
    the sweep table, CSV and plot into ``cfg.out``. ``cfg.score_layer``/``cfg.judge_file`` (or
    ``layer``/``judge_file``): the judged layer beside the deterministic one (as ``metrics --score-layer``).

    ``cfg.executor`` other than ``local`` (``ray``): the strengths first run as the executor's tasks, in the waves
    of :func:`sweep_waves` (each task loads the model and the edit spec itself); this call then only assembles the
    table from their run directories. A sweep resumes under any executor (the executor is no part of its runs).
    """
    task = getattr(type(cfg), "TASK_NAME", "memtoc")
    execution = getattr(cfg, "execution", None)
    if execution is not None:
        executor_of(execution)               # a bad executor name, resource or address: refused before any work
    if execution is not None and execution.executor != "local":
        if backend is not None or edit is not None:
            raise ConfigError(f"executor {execution.executor}: each task loads the model and the edit spec itself; "
                              "pass the edit as a spec path and no loaded backend (or use executor local)")
        run_waves(execution, lambda slots: sweep_waves(cfg, slots, task), label="sweep", kept="finished strengths")
    return sweep(cfg, backend=backend, edit=edit, log=log or _stderr, task=task,
                 layer=layer or getattr(cfg, "score_layer", "deterministic"),
                 judge_file=judge_file or getattr(cfg, "judge_file", None))


def sweep_waves(cfg: Any, slots: int, task: str | None = None) -> list[list[Any]]:
    """The executor tasks of a sweep, in waves that run one after another (``memtoc sweep --executor ray``).

    A task whose sweep solves strengths together (MemToC: one untreated closed book, strengths as rows) runs
    strength 0's closed-book pass first (wave 1), then the strengths in ``slots`` groups of about equal size,
    each group as rows of one batch on one worker, all reusing that closed book (wave 2). Other tasks: one
    task per strength, in one wave. A later :func:`run_sweep` only assembles the table.
    """
    strengths = sweep_strengths(cfg, task)
    if not hasattr(task_of(cfg, task).sweep(cfg), "evaluate_strengths"):
        return [[WorkUnit(name=strength_dir_name(s), arm=strength_dir_name(s), fn=sweep_strength,
                          args=(cfg, s, task)) for s in strengths]]
    n = max(1, min(int(slots), len(strengths)))
    groups = [tuple(strengths[i::n]) for i in range(n)]
    name = lambda g: "strengths_" + "+".join(f"{s:g}" for s in g)  # noqa: E731
    return [[WorkUnit(name="closed_book", arm="closed_book", fn=sweep_closed_book, args=(cfg, task))],
            [WorkUnit(name=name(g), arm=name(g), fn=sweep_strength_group, args=(cfg, g, task))
             for g in groups]]


def sweep_plan(strengths_text: str | Sequence[float], edit: Any, edit_path: str | None,
               log: Callable[[str], None]) -> tuple[list[float], Any]:
    """The strengths to run (0 first, as the baseline, then ascending) and the edit (loaded from its spec when
    not given); shared by the MemToC and the code-executor sweeps."""
    from steering.edits import load_edit

    strengths = parse_strengths(strengths_text)
    if 0.0 not in strengths:
        log("sweep: strength 0 added (the baseline every strength is compared with)")
    strengths = [0.0] + sorted(s for s in strengths if s != 0.0)
    if edit is None:
        if not edit_path:
            raise MemtocError("sweep needs an edit spec (--edit)")
        edit = load_edit(edit_path)
    return strengths, edit


def _judged_records(records: Mapping[float, list[dict[str, Any]]], run_dirs: Mapping[float, Path],
                    judge_file: str) -> dict[float, list[dict[str, Any]]]:
    """Every strength's records in the judged layer (the judge rules of ``memtoc.scoring.judge``, the same code path as
    ``metrics``/``compare --score-layer judged``); every strength must be judged by strength 0's judge."""
    from memtoc.scoring.judge.layer import layer_records, same_judge

    layered = {s: layer_records(list(recs), "judged", run_dir=run_dirs[s], judge_file=judge_file)
               for s, recs in records.items()}
    for s, lr in layered.items():
        same_judge(layered[0.0], lr, str(run_dirs[0.0]), str(run_dirs[s]))
    return {s: lr.records for s, lr in layered.items()}


def _layer_names(layer: str) -> tuple[str, str]:
    """(file stem, title suffix) of a layer: the deterministic sweep keeps ``sweep.*``."""
    return ("sweep", "") if layer == "deterministic" else (f"sweep_{layer}", f" [{layer} layer]")


def sweep(cfg: Any, *, backend: Any = None, edit: Any = None, log: Callable[[str], None] = _stderr,
          task: str | None = None, layer: str = "deterministic", judge_file: str | None = None,
          **options: Any) -> SweepResult:
    """Evaluate every strength of any task (0 always included, run first) and write the sweep table and plot.

    The shared part of every sweep: the strengths and the edit, every strength's run directory checked before
    the model loads or anything is written, one backend for all strengths, one evaluation per strength through
    :func:`memtoc.tasks.evaluation.evaluate_task` (into ``OUT/strength_<s>``), and ``sweep.{json,csv,md,png}``
    written atomically. The rows, table and plot are the task's (:class:`memtoc.core.tasks.TaskSweep`); ``options``
    go to the task's evaluation (the code executor's ``executor``).
    """
    t = task_of(cfg, task)
    job = t.sweep(cfg)
    check_layer(layer)
    judge_file = judge_file or JUDGE_FILE
    if layer != "deterministic" and t.name != "memtoc":
        raise MemtocError(f"--score-layer {layer} applies to MemToC sweeps only (the judge reads MemToC episodes)")
    if cfg.direction is not None and cfg.direction not in DIRECTIONS:
        raise EditSpecError(f"--direction must be one of {', '.join(DIRECTIONS)}, got {cfg.direction!r}",
                            field="direction")
    strengths, edit = sweep_plan(cfg.strengths, edit, cfg.edit, log)
    direction = job.direction(edit)
    if direction not in DIRECTIONS:
        raise EditSpecError(f"--direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                            field="direction")
    out = Path(cfg.out)
    planned: dict[float, Any] = {}
    for s in strengths:          # every strength's run directory, before the model loads or anything is written
        run_dir = out / strength_dir_name(s)
        run = planned[s] = t.evaluation(job.run_config(run_dir), edit=edit.steer(direction, s), **options)
        check_run_dir(run_dir, run.settings(), kind=run.run_kind)
        if layer == "judged" and not (run_dir / judge_file).is_file():
            raise MemtocError(f"{run_dir / judge_file} is missing: the judged layer needs every strength judged; run "
                              f"the sweep (deterministic layer), then `memtoc judge {run_dir}` for each strength "
                              "with the same judge model, then this command again")
    steered = {s: edit.steer(direction, s) for s in strengths}
    run_dirs = {s: out / strength_dir_name(s) for s in strengths}
    specs = {s: e.spec for s, e in steered.items()}
    # every strength finished (e.g. by executor tasks): the table is assembled without loading the model
    finished = (job.finished_records(planned, run_dirs, cfg.model)
                if backend is None and hasattr(job, "finished_records") else None)
    if backend is None and finished is None:
        check_edit_for_model(edit, cfg.model)
        backend = load_backend(job.run_config(out / strength_dir_name(0)), hooks=True)
    if finished is None:
        _require_edits(backend)
    out.mkdir(parents=True, exist_ok=True)
    records: dict[float, list[dict[str, Any]]] = {}
    passes = None
    if finished is not None:
        records = finished
        log(f"sweep: every strength of {out} is complete; assembling the table")
    elif ROW_EDITS in backend.capabilities and len(strengths) > 1:   # vllm: strengths share engine passes
        from memtoc.jobs.sweep_pass import evaluate_in_one_pass

        for s, e in steered.items():
            log(f"sweep: strength {s:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dirs[s]}")
        records, passes = evaluate_in_one_pass(backend, {s: job.run_config(run_dirs[s]) for s in strengths},
                                               steered, task=t.name, log=log, **options)
    elif hasattr(job, "evaluate_strengths"):   # one closed-book pass, strengths as rows (memtoc_task.MemtocSweep)
        records = job.evaluate_strengths(steered, run_dirs, run_dirs[0.0], backend, log, **options)
    else:
        for s, e in steered.items():
            log(f"sweep: strength {s:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dirs[s]}")
            run, _ = evaluate_task(job.run_config(run_dirs[s]), task=t.name, backend=backend, edit=e, log=log,
                                   **options)
            records[s] = run.records()
    judge = None
    if layer == "judged":
        records = _judged_records(records, run_dirs, judge_file)
        from memtoc.scoring.judge.store import judge_identity_of, read_judge_records

        path = run_dirs[0.0] / judge_file
        judge = judge_identity_of(read_judge_records(path), path)
    rows = [job.strength_row(s, specs[s]["strength"], records[s], records[0.0]) for s in strengths]
    stem, suffix = _layer_names(layer)
    title = job.title(edit, direction) + suffix
    md = job.markdown(rows, title)
    files = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv", "markdown": out / f"{stem}.md"}
    doc = job.document()
    write_json_atomic(files["json"], json_ready({
        "schema_version": job.schema, "config": doc["config"], "layer": layer, "judge": judge, "edit": edit.spec,
        "edit_sha256": {f"{s:g}": sha256_json(specs[s]) for s in strengths},
        "direction": direction, "strengths": strengths,
        "run_dirs": {f"{s:g}": str(p) for s, p in run_dirs.items()},
        **{k: v for k, v in doc.items() if k != "config"},
        "rows": rows}))
    write_records_csv_atomic(files["csv"], job.csv_rows(rows))
    write_text_atomic(files["markdown"], md)
    if cfg.plot:
        files["plot"] = out / f"{stem}.png"
        write_bytes_atomic(files["plot"], job.plot(rows, title))
    return SweepResult(out=out, rows=rows, run_dirs=run_dirs, files=files, markdown=md, passes=passes)


def _strength_job(cfg: Any, task: str | None, strength: float = 0.0) -> tuple[Any, Any, Any, str, Any]:
    """(task, its sweep job, the edit, the direction, the backend) of one executor task of a sweep."""
    t = task_of(cfg, task)
    job = t.sweep(cfg)
    _, edit = sweep_plan(cfg.strengths, None, cfg.edit, lambda s: None)
    direction = job.direction(edit)
    if direction not in DIRECTIONS:
        raise EditSpecError(f"--direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                            field="direction")
    check_edit_for_model(edit, cfg.model)
    backend = load_backend(job.run_config(Path(cfg.out) / strength_dir_name(strength)), hooks=True)
    _require_edits(backend)
    return t, job, edit, direction, backend


def sweep_closed_book(cfg: Any, task: str | None = None) -> int:
    """Wave 1 of a sweep on an executor: strength 0's closed-book pass (untreated), which every strength reuses.
    Returns an exit status (2 and one line on stderr on a user error)."""
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)  # noqa: E731
    try:
        t, job, edit, direction, backend = _strength_job(cfg, task)
        run_dir = Path(cfg.out) / strength_dir_name(0.0)
        e = edit.steer(direction, 0.0)
        log(f"sweep: closed book (strength 0, untreated unless the edit applies to it) -> {run_dir}")
        ev, _, _, _ = open_evaluation(job.run_config(run_dir), task=t.name, backend=backend, edit=e, log=log)
        ev.solve_closed_book(backend, e)
        ev.store.close()
    except MemtocError as exc:
        print(f"memtoc sweep: error: closed book: {exc}", file=sys.stderr)
        return 2
    return 0


def sweep_strength_group(cfg: Any, strengths: Sequence[float], task: str | None = None) -> int:
    """Wave 2 of a sweep on an executor: a group of strengths as rows of one batch, reusing strength 0's closed
    book (the same evaluations :func:`sweep` runs). Returns an exit status."""
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)  # noqa: E731
    try:
        _, job, edit, direction, backend = _strength_job(cfg, task)
        out = Path(cfg.out)
        steered = {float(s): edit.steer(direction, s) for s in strengths}
        job.evaluate_strengths(steered, {s: out / strength_dir_name(s) for s in steered},
                               out / strength_dir_name(0.0), backend, log)
    except MemtocError as exc:
        print(f"memtoc sweep: error: strengths {', '.join(f'{s:g}' for s in strengths)}: {exc}", file=sys.stderr)
        return 2
    return 0


def sweep_strengths(cfg: Any, task: str | None = None) -> list[float]:
    """The strengths :func:`sweep` would run (0 first), for an executor to cut the sweep into tasks."""
    return sweep_plan(cfg.strengths, None, cfg.edit, lambda s: None)[0]


def sweep_strength(cfg: Any, strength: float, task: str | None = None) -> int:
    """One strength of a sweep into ``OUT/strength_<s>``: the task an executor runs per strength.

    The same evaluation :func:`sweep` runs for that strength (same edit steering, same run directory, so
    a later :func:`sweep` over the finished strengths only assembles the table); resumable like every
    evaluation. Returns an exit status; a user error is one line on stderr (status 2), as on the command line.
    """
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)  # noqa: E731
    try:
        t, job, edit, direction, backend = _strength_job(cfg, task, strength)
        run_dir = Path(cfg.out) / strength_dir_name(strength)
        e = edit.steer(direction, strength)
        log(f"sweep: strength {strength:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dir}")
        evaluate_task(job.run_config(run_dir), task=t.name, backend=backend, edit=e, log=log)
    except MemtocError as exc:
        print(f"memtoc sweep: error: strength {strength:g}: {exc}", file=sys.stderr)
        return 2
    return 0


def _require_edits(backend: Any) -> None:
    if not isinstance(backend, HookedBackend) or EDITS not in backend.capabilities:
        raise MemtocError(f"edits need a backend with hooks (hf, or vllm on an engine whose workers run them: "
                          f"docs/backends.md); {getattr(backend, 'name', type(backend).__name__)!r} has none")
