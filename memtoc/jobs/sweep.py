"""The sweep job: what ``memtoc sweep``, ``mt.sweep(...)`` and a recipe's ``sweep`` step all call.

:func:`run_sweep` is the adapters' entry: the executor's waves first when the strengths run as executor tasks,
then the family's job body, chosen by the config's class (:func:`sweep`, MemToC; :func:`sweep_codeexec`). Each
body reads plan (strengths, 0 first as the baseline: the hooks are installed but add nothing, so it reproduces the
untreated evaluation), load, run (each strength an evaluation into ``OUT/strength_<s>``), score and write
(``sweep.{json,csv,md,png}``, atomically), with the shared library here (:func:`sweep_plan`,
:func:`require_edits`, :func:`write_sweep`).

MemToC runs its strengths with one untreated closed book and the tool passes as rows of one batch; a backend with
``row_edits`` (vllm) runs them in shared engine passes (``memtoc.jobs.sweep_pass``); a sweep whose strengths are
all finished (executor tasks ran them) is assembled without loading a model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from memtoc.backends.base import HookedBackend
from memtoc.core.backend_kinds import EDITS, ROW_EDITS
from memtoc.core.config import flat_record
from memtoc.core.errors import MemtocError
from memtoc.core.fileio import (json_ready, sha256_json, write_bytes_atomic, write_json_atomic,
                                write_records_csv_atomic, write_text_atomic)
from memtoc.core.values import ConfigError
from memtoc.jobs import stderr_line
from memtoc.jobs.executor import WorkUnit, executor_of, run_waves
from memtoc.scoring.judge.layer import check_layer
from memtoc.scoring.judge.store import JUDGE_FILE
from memtoc.tasks.evaluation import evaluate_task, load_backend, open_evaluation
from memtoc.tasks.memtoc.sweep import SweepConfig
from memtoc.tasks.sweep_format import parse_strengths, strength_dir_name
from memtoc.tasks.validate import check_edit_for_model, check_run_dir
from steering.spec import DIRECTIONS, EditSpecError

__all__ = ["SweepConfig", "SweepResult", "run_sweep", "sweep", "sweep_codeexec", "sweep_waves", "sweep_plan",
           "write_sweep"]


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
    the sweep table, CSV and plot into ``cfg.out``; ``layer``/``judge_file``: the judged layer (MemToC only).

    Another executor than ``local`` first runs the strengths as its tasks (:func:`sweep_waves`; each loads the
    model and the edit spec itself); this call then only assembles the table from their run directories.
    """
    memtoc = isinstance(cfg, SweepConfig)
    if not memtoc and layer not in (None, "deterministic"):
        raise MemtocError(f"--score-layer {layer} applies to MemToC sweeps only (the judge reads MemToC episodes)")
    executor_of(cfg.execution)               # a bad executor name, resource or address: refused before any work
    if cfg.execution.executor != "local":
        if backend is not None or edit is not None:
            raise ConfigError(f"executor {cfg.execution.executor}: each task loads the model and the edit spec "
                              "itself; pass the edit as a spec path and no loaded backend (or use executor local)")
        run_waves(cfg.execution, lambda slots: sweep_waves(cfg, slots), label="sweep", kept="finished strengths")
    if not memtoc:
        return sweep_codeexec(cfg, backend=backend, edit=edit, log=log or stderr_line)
    return sweep(cfg, backend=backend, edit=edit, log=log or stderr_line, layer=layer or cfg.scoring.score_layer,
                 judge_file=judge_file or cfg.scoring.judge_file)


def strength_config(cfg: Any, out: Path) -> Any:
    """The evaluation config of the strength whose run directory is ``out``, of either family's sweep config."""
    if isinstance(cfg, SweepConfig):
        from memtoc.tasks.memtoc.task import strength_config as memtoc_config

        return memtoc_config(cfg, out)
    from memtoc.tasks.codeexec.sweep import strength_run_config

    return strength_run_config(cfg, out)


def sweep_waves(cfg: Any, slots: int) -> list[list[Any]]:
    """The executor tasks of a sweep, in waves that run one after another (``memtoc sweep --executor ray``).

    MemToC (one untreated closed book, strengths as rows) runs strength 0's closed-book pass first (wave 1),
    then the strengths in ``slots`` groups of about equal size, each group as rows of one batch on one worker,
    all reusing that closed book (wave 2). The code executor: one task per strength, in one wave. A later
    :func:`run_sweep` only assembles the table.
    """
    strengths = sweep_plan(cfg.sweep.strengths, None, cfg.intervention.edit, lambda s: None)[0]   # 0 first
    if not isinstance(cfg, SweepConfig):
        return [[WorkUnit(name=strength_dir_name(s), arm=strength_dir_name(s), fn=sweep_strength, args=(cfg, s))
                 for s in strengths]]
    n = max(1, min(int(slots), len(strengths)))
    groups = [tuple(strengths[i::n]) for i in range(n)]
    name = lambda g: "strengths_" + "+".join(f"{s:g}" for s in g)  # noqa: E731
    return [[WorkUnit(name="closed_book", arm="closed_book", fn=sweep_closed_book, args=(cfg,))],
            [WorkUnit(name=name(g), arm=name(g), fn=sweep_strength_group, args=(cfg, g)) for g in groups]]


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


def sweep_direction(cfg: Any, edit: Any) -> str:
    """The side a positive strength steers toward: ``--direction``, else (code executor) the edit's own side."""
    direction = cfg.sweep.direction if isinstance(cfg, SweepConfig) else (cfg.sweep.direction or edit.toward or "tool")
    if direction not in DIRECTIONS:
        raise EditSpecError(f"--direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                            field="direction")
    return direction


def write_sweep(out: Path, stem: str, *, document: dict[str, Any], csv_rows: list[dict[str, Any]], markdown: str,
                plot: Callable[[], bytes] | None) -> dict[str, Path]:
    """``OUT/<stem>.{json,csv,md}`` (and ``.png`` when ``plot`` draws it), each written atomically."""
    files = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv", "markdown": out / f"{stem}.md"}
    write_json_atomic(files["json"], json_ready(document))
    write_records_csv_atomic(files["csv"], csv_rows)
    write_text_atomic(files["markdown"], markdown)
    if plot is not None:
        files["plot"] = out / f"{stem}.png"
        write_bytes_atomic(files["plot"], plot())
    return files


def sweep_document(schema: str, config: dict[str, Any], edit: Any, direction: str, steered: Mapping[float, Any],
                   run_dirs: Mapping[float, Path], rows: list[dict[str, Any]], *, layer: str = "deterministic",
                   judge: Any = None, **extra: Any) -> dict[str, Any]:
    """``sweep.json``: the config, the edit and each strength's spec hash and run directory, then the rows."""
    return {"schema_version": schema, "config": config, "layer": layer, "judge": judge, "edit": edit.spec,
            "edit_sha256": {f"{s:g}": sha256_json(e.spec) for s, e in steered.items()},
            "direction": direction, "strengths": list(steered),
            "run_dirs": {f"{s:g}": str(p) for s, p in run_dirs.items()}, **extra, "rows": rows}


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


def sweep(cfg: SweepConfig, *, backend: Any = None, edit: Any = None, log: Callable[[str], None] = stderr_line,
          layer: str = "deterministic", judge_file: str | None = None) -> SweepResult:
    """Evaluate every strength of a MemToC sweep (0 always included, run first) and write the sweep table and plot.

    ``layer="judged"``: the rows read every strength's judged layer (``judge_file`` beside each run directory).
    """
    from memtoc.tasks.memtoc.sweep import DEFINITIONS, csv_rows, format_markdown, strength_row
    from memtoc.tasks.memtoc.task import MemtocEvaluation, evaluate_strengths, finished_records

    # plan: the strengths, the edit, every strength's run directory checked before the model loads
    check_layer(layer)
    judge_file = judge_file or JUDGE_FILE
    strengths, edit = sweep_plan(cfg.sweep.strengths, edit, cfg.intervention.edit, log)
    direction = sweep_direction(cfg, edit)
    out = Path(cfg.job.out)
    run_dirs = {s: out / strength_dir_name(s) for s in strengths}
    steered = {s: edit.steer(direction, s) for s in strengths}
    planned = {s: MemtocEvaluation(strength_config(cfg, run_dirs[s]), steered[s]) for s in strengths}
    for s, run in planned.items():
        check_run_dir(run_dirs[s], run.settings(), kind=run.run_kind)
        if layer == "judged" and not (run_dirs[s] / judge_file).is_file():
            raise MemtocError(f"{run_dirs[s] / judge_file} is missing: the judged layer needs every strength judged; "
                              f"run the sweep (deterministic layer), then `memtoc judge {run_dirs[s]}` for each "
                              "strength with the same judge model, then this command again")
    # load: no model when every strength is finished (executor tasks ran them)
    finished = finished_records(planned, run_dirs, cfg.model_spec.model) if backend is None else None
    if finished is None:
        if backend is None:
            check_edit_for_model(edit, cfg.model_spec.model)
            backend = load_backend(strength_config(cfg, run_dirs[0.0]), hooks=True)
        require_edits(backend)
    out.mkdir(parents=True, exist_ok=True)
    # run
    passes = None
    if finished is not None:
        records = finished
        log(f"sweep: every strength of {out} is complete; assembling the table")
    elif ROW_EDITS in backend.capabilities and len(strengths) > 1:   # vllm: strengths share engine passes
        from memtoc.jobs.sweep_pass import evaluate_in_one_pass

        for s, e in steered.items():
            log(f"sweep: strength {s:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dirs[s]}")
        records, passes = evaluate_in_one_pass(backend, {s: strength_config(cfg, run_dirs[s]) for s in strengths},
                                               steered, task="memtoc", log=log)
    else:       # one untreated closed book, the strengths' tool passes as rows of one batch
        records = evaluate_strengths(cfg, steered, run_dirs, run_dirs[0.0], backend, log)
    # score: each strength against strength 0, in the layer asked for
    judge = None
    if layer == "judged":
        records = _judged_records(records, run_dirs, judge_file)
        from memtoc.scoring.judge.store import judge_identity_of, read_judge_records

        path = run_dirs[0.0] / judge_file
        judge = judge_identity_of(read_judge_records(path), path)
    labels = None
    if cfg.sweep.dev_labels:
        from memtoc.runs.runstore import RunStore

        labels = RunStore.read(cfg.sweep.dev_labels).episodes.records()
    rows = [strength_row(s, e.spec["strength"], records[s], records[0.0], n_boot=cfg.job.n_boot,
                         n_perm=cfg.sweep.n_perm, seed=cfg.job.seed,
                         dev_per_direction=cfg.sweep.dev_per_direction or None, labels=labels)
            for s, e in steered.items()]
    # write
    stem, suffix = ("sweep", "") if layer == "deterministic" else (f"sweep_{layer}", f" [{layer} layer]")
    title = f"{edit.name}: {edit.kind} toward {direction} ({edit.positions}, sites {list(edit.layers)}){suffix}"
    md = format_markdown(rows, title=title)
    files = write_sweep(out, stem, document=sweep_document(
        "memtoc-sweep-v1", flat_record(cfg), edit, direction, steered, run_dirs, rows, layer=layer, judge=judge,
        definitions=DEFINITIONS), csv_rows=csv_rows(rows), markdown=md,
        plot=(lambda: _plot(rows, title)) if cfg.sweep.plot else None)
    return SweepResult(out=out, rows=rows, run_dirs=run_dirs, files=files, markdown=md, passes=passes)


def _plot(rows: Sequence[Mapping[str, Any]], title: str, conditions: Sequence[str] | None = None) -> bytes:
    from memtoc.core import plots       # matplotlib: loaded when a plot is drawn

    return (plots.sweep_curves(rows, title=title) if conditions is None else
            plots.codeexec_sweep_curves(rows, conditions, title=title))


def sweep_codeexec(cfg: Any, *, backend: Any = None, edit: Any = None, executor: Any = None,
                       log: Callable[[str], None] = stderr_line) -> Any:
    """Evaluate every strength of a ``CodeexecSweepConfig`` (0 always included, run first) and write the sweep
    table and plot: plan, load, run, score, write, with the same library as :func:`sweep`; ``executor``: the
    sandbox (default ``run_python``)."""
    from memtoc.tasks.codeexec.sweep import csv_rows, format_markdown, strength_row, strength_run_config
    from memtoc.tasks.codeexec.task import CodeexecEvaluation

    options = {"executor": executor} if executor is not None else {}
    # plan: the strengths, the edit, every strength's run directory checked before the model loads
    strengths, edit = sweep_plan(cfg.sweep.strengths, edit, cfg.intervention.edit, log)
    direction = sweep_direction(cfg, edit)
    out = Path(cfg.job.out)
    run_dirs = {s: out / strength_dir_name(s) for s in strengths}
    steered = {s: edit.steer(direction, s) for s in strengths}
    for s in strengths:
        run = CodeexecEvaluation(strength_run_config(cfg, run_dirs[s]), steered[s], **options)
        check_run_dir(run_dirs[s], run.settings(), kind=run.run_kind)
    # load
    if backend is None:
        check_edit_for_model(edit, cfg.model_spec.model)
        backend = load_backend(strength_run_config(cfg, run_dirs[0.0]), hooks=True)
    require_edits(backend)
    out.mkdir(parents=True, exist_ok=True)
    # run: one evaluation per strength (vllm: the strengths share engine passes)
    passes, records = None, {}
    shared = ROW_EDITS in backend.capabilities and len(strengths) > 1
    for s, e in steered.items():
        log(f"sweep: strength {s:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dirs[s]}")
        if not shared:
            run, _ = evaluate_task(strength_run_config(cfg, run_dirs[s]), task="codeexec", backend=backend, edit=e,
                                   log=log, **options)
            records[s] = run.records()
    if shared:
        from memtoc.jobs.sweep_pass import evaluate_in_one_pass

        records, passes = evaluate_in_one_pass(backend, {s: strength_run_config(cfg, run_dirs[s]) for s in strengths},
                                               steered, task="codeexec", log=log, **options)
    # score: each strength against strength 0
    rows = [strength_row(s, e.spec["strength"], records[s], records[0.0], cfg.task.conditions, n_boot=cfg.job.n_boot,
                         n_perm=cfg.sweep.n_perm, seed=cfg.job.seed) for s, e in steered.items()]
    # write
    title = (f"{edit.name}: {edit.kind} toward {direction} ({edit.positions}, sites {list(edit.layers)}), "
             f"code executor, {cfg.task.split} split")
    md = format_markdown(rows, cfg.task.conditions, title=title)
    files = write_sweep(out, "sweep", document=sweep_document(
        "memtoc-codeexec-sweep-v1", {**flat_record(cfg), "family": "codeexec"}, edit, direction, steered, run_dirs,
        rows),
        csv_rows=csv_rows(rows), markdown=md,
        plot=(lambda: _plot(rows, title, cfg.task.conditions)) if cfg.sweep.plot else None)
    return SweepResult(out=out, rows=rows, run_dirs=run_dirs, files=files, markdown=md, passes=passes)


def _strength_job(cfg: Any, strength: float = 0.0) -> tuple[Any, str, Any]:
    """(the edit, the direction, the backend) of one executor task of a sweep."""
    _, edit = sweep_plan(cfg.sweep.strengths, None, cfg.intervention.edit, lambda s: None)
    direction = sweep_direction(cfg, edit)
    check_edit_for_model(edit, cfg.model_spec.model)
    backend = load_backend(strength_config(cfg, Path(cfg.job.out) / strength_dir_name(strength)), hooks=True)
    require_edits(backend)
    return edit, direction, backend


def sweep_closed_book(cfg: Any) -> int:
    """Wave 1 of a MemToC sweep on an executor: strength 0's closed-book pass (untreated), which every strength
    reuses. Returns an exit status (2 and one line on stderr on a user error)."""
    log = stderr_line
    try:
        edit, direction, backend = _strength_job(cfg)
        run_dir = Path(cfg.job.out) / strength_dir_name(0.0)
        e = edit.steer(direction, 0.0)
        log(f"sweep: closed book (strength 0, untreated unless the edit applies to it) -> {run_dir}")
        ev, _, _, _ = open_evaluation(strength_config(cfg, run_dir), task="memtoc", backend=backend, edit=e, log=log)
        ev.solve_closed_book(backend, e)
        ev.store.close()
    except MemtocError as exc:
        print(f"memtoc sweep: error: closed book: {exc}", file=sys.stderr)
        return 2
    return 0


def sweep_strength_group(cfg: Any, strengths: Sequence[float]) -> int:
    """Wave 2 of a MemToC sweep on an executor: a group of strengths as rows of one batch, reusing strength 0's
    closed book (the same evaluations :func:`sweep` runs). Returns an exit status."""
    from memtoc.tasks.memtoc.task import evaluate_strengths

    log = stderr_line
    try:
        edit, direction, backend = _strength_job(cfg)
        out = Path(cfg.job.out)
        steered = {float(s): edit.steer(direction, s) for s in strengths}
        evaluate_strengths(cfg, steered, {s: out / strength_dir_name(s) for s in steered},
                           out / strength_dir_name(0.0), backend, log)
    except MemtocError as exc:
        print(f"memtoc sweep: error: strengths {', '.join(f'{s:g}' for s in strengths)}: {exc}", file=sys.stderr)
        return 2
    return 0


def sweep_strength(cfg: Any, strength: float) -> int:
    """One strength of a sweep into ``OUT/strength_<s>`` (the task an executor runs per strength): the evaluation
    the sweep runs for it, so a later :func:`run_sweep` only assembles the table. Returns an exit status (a user
    error: one line on stderr, status 2)."""
    log = stderr_line
    try:
        edit, direction, backend = _strength_job(cfg, strength)
        run_dir = Path(cfg.job.out) / strength_dir_name(strength)
        e = edit.steer(direction, strength)
        log(f"sweep: strength {strength:g} (spec strength {e.strength:g}, toward {direction}) -> {run_dir}")
        evaluate_task(strength_config(cfg, run_dir), backend=backend, edit=e, log=log)   # the config's family
    except MemtocError as exc:
        print(f"memtoc sweep: error: strength {strength:g}: {exc}", file=sys.stderr)
        return 2
    return 0


def require_edits(backend: Any) -> None:
    """Refuse (one line) a backend that cannot apply an edit in generation."""
    if not isinstance(backend, HookedBackend) or EDITS not in backend.capabilities:
        raise MemtocError(f"edits need a backend with hooks (hf, or vllm on an engine whose workers run them: "
                          f"docs/backends.md); {getattr(backend, 'name', type(backend).__name__)!r} has none")
