"""The evaluation of any task (:mod:`memtoc.core.tasks`), shared by every family: open, solve, finish.

Every model evaluation of the toolkit (untreated, prompted, edited; MemToC episodes, code-executor trials, agent
episodes) runs through :func:`evaluate_task`, so run directories are checked, resumed and summarised one way. What
a task's work items are and how they are solved and scored is the task's (MemToC: ``memtoc.tasks.memtoc.task``).
It lives here, beside the family folders, because every family imports it (the MemToC sweep's strengths as rows,
the agent task) and the evaluate and sweep jobs (``memtoc.jobs``) run it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from memtoc.backends.base import ANSWERS_FILE, Backend, RemoteBackend
from memtoc.core.backend_kinds import EDITS, backend_kind
from memtoc.core.config import field_value
from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import write_json_atomic
from memtoc.core.tasks import TaskEvaluation, task_of
from memtoc.tasks.validate import check_edit_for_model, check_run_dir


def _stderr(s: str) -> None:
    print(s, file=sys.stderr)


def load_backend(cfg: Any, *, hooks: bool = True) -> Backend:
    """The backend of ``cfg`` from the one factory (an adapter is applied as a view of the loaded model);
    ``hooks``: whether the job installs edit hooks (an edited evaluation, a sweep), so a generation-only engine
    keeps its compiled graphs."""
    from memtoc.backends.factory import load_backend as load

    return load(cfg.model_spec, hooks=hooks)


def evaluate_task(cfg: Any, *, task: str | None = None, backend: Backend | None = None, edit: Any = None,
                  log: Callable[[str], None] = _stderr, header: bool = False,
                  **options: Any) -> tuple[TaskEvaluation, Any]:
    """Run (or resume) the evaluation of any task (:mod:`memtoc.core.tasks`); returns the task's evaluation and result.

    The run directory's identity is checked before the model loads, so a user error loads and writes nothing.
    ``options`` go to the task (the code executor's ``formatter`` and ``executor``).
    """
    job, backend, edit, root = open_evaluation(cfg, task=task, backend=backend, edit=edit, log=log, header=header,
                                               **options)
    return job, finish_evaluation(job, root, job.solve(backend, edit), log=log)


def open_evaluation(cfg: Any, *, task: str | None = None, backend: Backend | None = None, edit: Any = None,
                    log: Callable[[str], None] = _stderr, header: bool = False,
                    **options: Any) -> tuple[TaskEvaluation, Backend, Any, Any]:
    """The first half of :func:`evaluate_task`: the task's evaluation checked and its run directory opened
    (nothing solved yet); ``(evaluation, backend, edit, run directory)``. A sweep that solves several
    evaluations together (strengths as rows) opens each with this and finishes each with
    :func:`finish_evaluation`."""
    t = task_of(cfg, task)
    if edit is None and field_value(cfg, "edit", None):    # the spec file, validated before any model loads
        from steering import load_edit

        edit = load_edit(field_value(cfg, "edit"))
    job = t.evaluation(cfg, edit=edit, **options)
    settings = job.settings()
    check_run_dir(cfg.job.out, settings, kind=job.run_kind)
    if backend is None:
        kind = backend_kind(cfg.model_spec.backend)
        if not kind.remote:               # an endpoint's server checks an edit against the model it serves
            check_edit_for_model(edit, cfg.model_spec.model)
        # untreated: generation only, compiled graphs; an endpoint applies no hooks here (memtoc serve does)
        backend = load_backend(cfg, hooks=edit is not None and kind.offers(EDITS))
    if isinstance(backend, RemoteBackend) and edit is not None:
        backend.check_edit(edit)                 # the server applies it: refused before any request if it cannot
    root = job.open(backend, settings)
    if isinstance(backend, RemoteBackend):       # each answer durable as it arrives: a rerun never asks again
        backend.keep_answers(root / ANSWERS_FILE)
    if header:  # the run header (protocol, differences from the paper, a frame fallback): once every check has
        for line in job.header_lines():     # passed (a user error stays one line), before anything is generated
            log(line)
        if edit is not None:     # the edit's kind, name, sites, positions, strength (run.json has the spec)
            kind = (getattr(edit, "spec", None) or {}).get("kind") or type(edit).__name__
            sites = ",".join(str(s) for s in getattr(edit, "layers", ()) or ())
            log(f"EDIT applied: {kind} {getattr(edit, 'name', '') or ''} at sites {sites or '?'}, positions "
                f"{getattr(edit, 'positions', '?')}, strength {getattr(edit, 'strength', '?')}"
                + ("; the closed-book pass too" if getattr(edit, "apply_to_closed_book", False) else
                   "; the closed-book pass untreated"))
        resumed = job.resume_line()
        if resumed:
            log(resumed)
    return job, backend, edit, root


def finish_evaluation(job: TaskEvaluation, root: Any, n_new: int, *, log: Callable[[str], None] = _stderr) -> Any:
    """The second half of :func:`evaluate_task`: records, summary (written atomically) and the task's result."""
    records = job.records()
    summary = job.summarize(records)
    write_json_atomic(root / "summary.json", summary, error=RunStoreError)
    if n_new == 0:
        log(f"{root}: nothing left to run ({len(records)} {job.done_text})")
    return job.result(records, summary, n_new)
