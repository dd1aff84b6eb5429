"""Benchmark families as tasks of one pipeline: the registry the generic jobs look a task up in.

A *task* says what a benchmark family's work is; the three jobs say how any work is run:

- ``memtoc evaluate`` (:func:`memtoc.jobs.evaluate.evaluate`, over :func:`memtoc.tasks.evaluation.evaluate_task`)
  opens and checks the run directory, loads the backend, asks the task's :class:`TaskEvaluation` to solve the
  unfinished work items and to summarise the records, and writes the summary atomically;
- ``memtoc extract`` (:func:`memtoc.jobs.extract.extract`) checks an existing store, loads the backend, and runs
  the capture loop (resumption, batches, commits) over the task's :class:`TaskExtraction` items;
- ``memtoc sweep`` (:func:`memtoc.jobs.sweep.sweep`) checks every strength's run directory, runs one
  evaluation per strength through the same evaluate code, and writes the sweep table, CSV and plot from the
  task's :class:`TaskSweep` rows.

MemToC (``memtoc.tasks.memtoc.task``: episodes, the closed-book pass then the single-turn tool pass) and the code
executor (``memtoc.tasks.codeexec.task``: problems x conditions trials, the agent loop) are the two registered tasks.
Task modules are applications (they use the scorer, the agent loop, the capture and the sweep statistics), so
this core registry names them by module path and imports one the first time it is asked for: the jobs
(``memtoc.jobs``) run any task without naming a task module. See
``docs/tasks.md``.

The protocols return a :class:`memtoc.runs.result.RunResult` where they say so, typed ``Any`` here: the run
store sits a layer above core (``tests/test_layering.py``), and a protocol only names the duck type.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from memtoc.core.errors import MemtocError

__all__ = ["Task", "TaskEvaluation", "TaskExtraction", "TaskSweep", "UnknownTaskError",
           "register_task", "get_task", "task_names", "task_of"]


class UnknownTaskError(MemtocError):
    """A task name nobody registered."""


class TaskEvaluation(Protocol):
    """One evaluation of one task, bound to its config and edit (made by :meth:`Task.evaluation`)."""

    #: ``kind`` of :func:`memtoc.tasks.validate.check_run_dir` ("" for MemToC runs, "codeexec" for the code
    #: executor)
    run_kind: str
    #: what a record is, for the "nothing left to run" line ("episodes already scored")
    done_text: str

    def settings(self) -> dict[str, Any]:
        """The identity fields known before the model loads (checked against an existing run directory)."""

    def open(self, backend: Any, settings: Mapping[str, Any]) -> Path:
        """Open (or resume) the run directory with the full identity; returns its root."""

    def solve(self, backend: Any, edit: Any) -> int:
        """Run every unfinished work item of the plan and append its records; returns how many are new."""

    def records(self) -> list[dict[str, Any]]:
        """The records of the current plan, in plan order."""

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``summary.json`` document of the plan's records (the job writes it atomically)."""

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> Any:
        """The run's :class:`memtoc.runs.result.RunResult` (closes the run: status, tables); the one result
        type of every family."""


class TaskExtraction(Protocol):
    """One capture of one task (made by :meth:`Task.extraction`); the generic loop stores what it returns."""

    desc: str                #: progress-bar label
    done_text: str           #: "episodes already stored"
    batch_size: int
    writer_options: dict[str, Any]    #: extra keywords of ``ActivationWriter.open`` (compression)

    def settings(self, existing: Mapping[str, Any] | None) -> dict[str, Any]:
        """Identity fields known before the model loads (checked against an existing store)."""

    def bind(self, backend: Any, provenance: Mapping[str, Any]) -> None:
        """Model-dependent preparation (a conversation formatter, labels of a run) once the backend is loaded."""

    def identity(self, provenance: Mapping[str, Any], settings: Mapping[str, Any], sites: Sequence[int],
                 storage: str) -> dict[str, Any]:
        """The store identity (an existing store is extended only under an equal one)."""

    def store_provenance(self, provenance: Mapping[str, Any], parts: Any) -> dict[str, Any]:
        """The store's provenance attributes."""

    def items(self) -> list[Any]:
        """The work items in capture order."""

    def key(self, item: Any) -> str:
        """An item's ``episode_id`` in the store."""

    def capture(self, backend: Any, batch: Sequence[Any], sites: Sequence[int], selector: Any) -> Any:
        """One batch -> an ``activations.store.RowBlock``."""

    def write_labels(self, writer: Any) -> int | None:
        """Join behaviour labels after the capture (None when there are none)."""


class TaskSweep(Protocol):
    """What one strength of a sweep is and what the sweep reports (made by :meth:`Task.sweep`)."""

    schema: str      #: ``schema_version`` of ``sweep.json``

    def direction(self, edit: Any) -> str:
        """The side a positive strength steers toward."""

    def run_config(self, out: Path) -> Any:
        """The evaluation config of the strength whose run directory is ``out``."""

    def strength_row(self, strength: float, spec_strength: float, records: Sequence[Mapping[str, Any]],
                     base: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Every figure of one strength, paired against strength 0 (``base``)."""

    def title(self, edit: Any, direction: str) -> str: ...

    def markdown(self, rows: Sequence[Mapping[str, Any]], title: str) -> str: ...

    def document(self) -> dict[str, Any]:
        """``sweep.json`` fields of the task: ``config`` (and ``definitions`` when it has them)."""

    def csv_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]: ...

    def plot(self, rows: Sequence[Mapping[str, Any]], title: str) -> bytes: ...


@runtime_checkable
class Task(Protocol):
    """A benchmark family: how each job's work for a config of the family is planned, solved and scored."""

    name: str

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> TaskEvaluation: ...

    def extraction(self, cfg: Any, selector: Any, **options: Any) -> TaskExtraction: ...

    def sweep(self, cfg: Any) -> TaskSweep: ...

    def read_run(self, root: Path) -> Any:
        """A run directory of the family read back (nothing written): the :class:`memtoc.runs.result.RunResult`
        its evaluation returned, with every record of its file, its table recomputed as the job computed it,
        and nothing new."""


#: Built-in tasks by module path: imported (and so registered) the first time they are asked for.
_BUILTIN: dict[str, str] = {"memtoc": "memtoc.tasks.memtoc.task", "codeexec": "memtoc.tasks.codeexec.task",
                            "agent": "memtoc.tasks.agent.task"}
_TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Register ``task`` under ``task.name`` (a task module calls this when imported)."""
    if not isinstance(task, Task):
        raise TypeError(f"{task!r} is not a Task (name, evaluation, extraction, sweep)")
    _TASKS[task.name] = task
    return task


def get_task(name: str) -> Task:
    if name not in _TASKS and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in _TASKS:
        raise UnknownTaskError(f"unknown task {name!r}; choose from {', '.join(task_names())}")
    return _TASKS[name]


def task_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_TASKS))


def task_of(cfg: Any, task: str | None = None) -> Task:
    """The task a job config belongs to: ``task`` when given, else its class's ``TASK_NAME`` (MemToC)."""
    return get_task(task or getattr(type(cfg), "TASK_NAME", "memtoc"))
