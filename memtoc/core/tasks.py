"""Benchmark families as tasks of the evaluate job: the registry it looks a family's evaluation up in.

A *task* says how a family's evaluation is planned, solved and scored: ``memtoc evaluate`` opens the run
directory, loads the backend, asks the task's :class:`TaskEvaluation` to solve the unfinished work items and to
summarise the records; ``Task.read_run`` reads a run back (``mt.Run``). Task modules are applications, so this
core registry names them by module path and imports one when first asked (``docs/tasks.md``). Protocols return
``memtoc.runs.result.RunResult`` where they say so, typed ``Any`` here: the run store is a layer above core.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from memtoc.core.errors import MemtocError

__all__ = ["Task", "TaskEvaluation", "UnknownTaskError",
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

    def header_lines(self) -> list[str]:
        """The run header said before anything is generated (MemToC: the protocol, the settings that differ from
        the paper, a frame fallback); empty when the family has none."""

    def resume_line(self) -> str | None:
        """How much of its plan a resumed run already holds (None for a fresh or a finished run)."""

    def records(self) -> list[dict[str, Any]]:
        """The records of the current plan, in plan order."""

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``summary.json`` document of the plan's records (the job writes it atomically)."""

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> Any:
        """The run's :class:`memtoc.runs.result.RunResult` (closes the run: status, tables); the one result
        type of every family."""


@runtime_checkable
class Task(Protocol):
    """A benchmark family: how its evaluation of a config is planned, solved and scored, and its runs read back."""

    name: str

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> TaskEvaluation: ...

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
        raise TypeError(f"{task!r} is not a Task (name, evaluation, read_run)")
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
