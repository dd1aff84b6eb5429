"""``--executor`` options of the multi-arm commands not yet generated from their configs (finetune crossfit,
run-experiment) and running their tasks (:mod:`memtoc.jobs.executor`). The sweeps take the same options from their
configs' executor piece (:class:`memtoc.core.config.ExecutorSettings`) and run their waves in the job
(:func:`memtoc.jobs.sweep.run_sweep`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from memtoc.jobs.executor import ExecutorError, Resources, WorkUnit, executor_of, make_executor, run_tasks

def run_tasks_from_args(args: Any, make_tasks: Callable[[], Sequence[WorkUnit]], *, label: str, kept: str) -> None:
    """A command's ``--executor`` run: the executor is started before the tasks are built (no Ray: the install
    command comes first), closed after; a failed task raises with the summary (``kept``: what a re-run resumes)."""
    name, resources, address = executor_from_args(args)
    ex = make_executor(name, resources=resources, address=address)
    try:
        execution = run_tasks(make_tasks(), ex, label=label)
    finally:
        ex.close()
    if not execution.ok:
        raise ExecutorError(f"{execution.summary()}\n{kept} are kept; re-run the same command to resume")


def add_executor_options(p: Any) -> None:
    """``--executor``, ``--address``, ``--cpus-per-arm``, ``--gpus-per-arm``, ``--max-retries`` (one group)."""
    from memtoc.core.options import add_option

    g = p.add_argument_group("executor (docs/scale-out.md)")
    add_option(g, "executor", default="local")
    add_option(g, "address", default=None)
    add_option(g, "cpus_per_arm", default=1.0)
    add_option(g, "gpus_per_arm", default=0.0)
    add_option(g, "max_retries", default=3)


def executor_from_args(args: Any) -> tuple[str, Resources, str | None]:
    """(executor name, resources, address) from parsed options; the name is checked here, before any work."""
    return executor_of(args)
