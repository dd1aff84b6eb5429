"""Executors: run the independent tasks of a study (arms, shards of arms) one after another or as Ray tasks.

A multi-arm command (``run-experiment``, ``sweep``) cuts its work into :class:`WorkUnit` s, each calling the same
Python job function the command line calls and writing its own run directory or store; an executor runs them and
returns one :class:`TaskResult` per task; the caller merges shards and builds the report.

- ``local`` (the default): in this process, one task after another.
- ``ray``: a pool of Ray actors, one per worker slot, each a long-lived process that loads a model once
  (``memtoc.backends.factory.keep_models``) and takes task after task; a task that raises or whose actor dies is
  retried (``max_retries``), and since every job resumes, it continues from what the dead one wrote. Ray is an
  optional extra (docs/scale-out.md).

Why Ray and not a scheduler of our own: it already places GPU tasks, retries failed ones and runs the same code
on a laptop and on a cluster. New executors register in :data:`EXECUTORS`, never as branches of the callers.
This module imports no job, so the jobs' command modules can use it without an import cycle.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.registry import Registry
from memtoc.jobs import stderr_line

RAY_INSTALL = "pip install 'memtoc-toolkit[ray]'"
_LOG = Callable[[str], None]


class ExecutorError(MemtocError):
    """An executor that cannot run here (unknown name, Ray not installed, no cluster at the address)."""


@dataclass(frozen=True)
class Resources:
    """What one task needs and how often it may be retried. Ray reserves the CPUs and GPUs (a task with
    ``gpus=1`` waits for a free GPU); the local executor runs tasks one at a time and ignores them."""

    cpus: float = 1.0
    gpus: float = 0.0
    max_retries: int = 3

    def check(self) -> None:
        if self.cpus < 0 or self.gpus < 0:
            raise ExecutorError(f"--cpus-per-arm and --gpus-per-arm must not be negative, got {self.cpus} and "
                                f"{self.gpus}")
        if self.max_retries < 0:
            raise ExecutorError(f"--max-retries must not be negative, got {self.max_retries}")


@dataclass(frozen=True)
class WorkUnit:
    """One unit of work: ``fn(*args)`` returns an exit status (0 = done). ``fn`` must be a module-level function
    (Ray ships it to the worker by reference). ``arm`` groups the shards of one arm for progress lines."""

    name: str
    arm: str
    fn: Callable[..., int]
    args: tuple[Any, ...] = ()


@dataclass
class TaskResult:
    name: str
    arm: str
    rc: int
    seconds: float
    error: str | None = None     # the last error line when rc != 0

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class Execution:
    """The results of one batch of tasks, in task order."""

    results: list[TaskResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def failed_arms(self) -> dict[str, list[TaskResult]]:
        out: dict[str, list[TaskResult]] = {}
        for r in self.results:
            if not r.ok:
                out.setdefault(r.arm, []).append(r)
        return out

    def summary(self) -> str:
        """One line per failed arm with its failed tasks' last errors ('' when nothing failed)."""
        lines = []
        for arm, bad in self.failed_arms().items():
            errs = "; ".join(f"{r.name}: exit {r.rc}: {r.error or 'no error message'}" for r in bad)
            lines.append(f"  FAILED {arm}: {errs}")
        if not lines:
            return ""
        return f"{len(lines)} arm(s) failed:\n" + "\n".join(lines)


class _Tee(io.TextIOBase):
    """stderr that is also kept, so a failed task's last error line can be reported by the driver."""

    def __init__(self, other: Any) -> None:
        self.other, self.buf = other, io.StringIO()

    def write(self, s: str) -> int:
        self.other.write(s)
        self.buf.write(s)
        return len(s)

    def flush(self) -> None:
        self.other.flush()


def _last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def call_task(fn: Callable[..., int], args: tuple[Any, ...], cwd: str | None = None) -> tuple[int, str | None]:
    """Run one task in this process: (exit status, its last stderr line when it failed).

    An exception propagates (so Ray retries the task); ``SystemExit`` (argparse) becomes its status.
    """
    if cwd is not None:
        os.chdir(cwd)           # a Ray worker starts elsewhere; relative paths are the driver's
    tee = _Tee(sys.stderr)
    old, sys.stderr = sys.stderr, tee
    try:
        try:
            rc = int(fn(*args) or 0)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stderr = old
    return rc, (None if rc == 0 else _last_line(tee.buf.getvalue()))


class _Progress:
    """One line per finished arm: ``[2/4 arms] warn: ok (2 tasks, 12.3 s)`` or ``... FAILED (...)``."""

    def __init__(self, tasks: Sequence[WorkUnit], log: _LOG, label: str) -> None:
        self.left = Counter(t.arm for t in tasks)
        self.n_arms, self.done, self.log, self.label = len(self.left), 0, log, label
        self.by_arm: dict[str, list[TaskResult]] = {}

    def add(self, r: TaskResult) -> None:
        self.by_arm.setdefault(r.arm, []).append(r)
        self.left[r.arm] -= 1
        if self.left[r.arm]:
            return
        self.done += 1
        rs = self.by_arm[r.arm]
        bad = [x for x in rs if not x.ok]
        secs = sum(x.seconds for x in rs)
        state = "ok" if not bad else f"FAILED ({len(bad)}/{len(rs)} tasks; last error: {bad[-1].error})"
        self.log(f"{self.label}: [{self.done}/{self.n_arms} arms] {r.arm}: {state} ({len(rs)} task"
                 f"{'s' if len(rs) != 1 else ''}, {secs:.1f} s)")


class Executor:
    """Runs a batch of independent tasks; subclasses register in :data:`EXECUTORS`."""

    name = "?"

    def run(self, tasks: Sequence[WorkUnit], *, log: _LOG = stderr_line, label: str = "executor") -> Execution:
        raise NotImplementedError

    #: how many tasks the executor runs at once (a job may cut its work into this many parts)
    slots = 1

    def close(self) -> None:
        """Release what the executor started (a local Ray instance)."""


class LocalExecutor(Executor):
    """In this process, in order: today's behaviour, and what tests compare the other executors with."""

    name = "local"

    def __init__(self, resources: Resources | None = None, **_: Any) -> None:
        self.resources = resources or Resources()

    def run(self, tasks: Sequence[WorkUnit], *, log: _LOG = stderr_line, label: str = "executor") -> Execution:
        progress, ex = _Progress(tasks, log, label), Execution()
        for t in tasks:
            t0 = time.time()
            try:
                rc, err = call_task(t.fn, t.args)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - recorded; the other arms still run
                rc, err = 1, f"{type(exc).__name__}: {exc}"
            r = TaskResult(t.name, t.arm, rc, round(time.time() - t0, 2), err)
            ex.results.append(r)
            progress.add(r)
        return ex


def import_ray() -> Any:
    """The ``ray`` module, or an error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed here; install it with: "
                            f"{RAY_INSTALL}") from None
    return ray


#: Ray runs its workers at nice 15 by default (its ``worker_niceness``), so the driver stays responsive. Here the
#: driver only waits and the workers do the job: at nice 15 anything else on the machine starves them (the Ray tests
#: beside two busy loops: over 580 s at nice 15, 233 s at the caller's priority). A local instance started by memtoc
#: keeps them at the caller's.
LOCAL_RAY_SYSTEM_CONFIG = {"worker_niceness": 0}


def init_ray(ray: Any, address: str | None = None, **init: Any) -> None:
    """``ray.init`` for memtoc: a new local instance gets :data:`LOCAL_RAY_SYSTEM_CONFIG`; an existing cluster
    (``address`` or ``$RAY_ADDRESS``) keeps its own settings (Ray refuses a system config when connecting)."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        init["_system_config"] = LOCAL_RAY_SYSTEM_CONFIG
    ray.init(address=address, include_dashboard=False, **init)


class _Worker:
    """The body of one Ray actor: a process that keeps the models it loads and runs one task at a time."""

    def __init__(self) -> None:
        from memtoc.backends.factory import keep_models

        keep_models(True)

    def run(self, fn: Callable[..., int], args: tuple[Any, ...], cwd: str | None) -> tuple[int, str | None, float]:
        t0 = time.time()
        rc, err = call_task(fn, args, cwd)
        return rc, err, round(time.time() - t0, 2)


class RayExecutor(Executor):
    """A pool of Ray actors (:class:`_Worker`), one per worker slot; connects to ``address`` (or
    ``$RAY_ADDRESS``, or the instance this process already started), else starts a local instance; the actors
    and that instance are stopped on :meth:`close`."""

    name = "ray"

    def __init__(self, resources: Resources | None = None, address: str | None = None, **_: Any) -> None:
        self.resources = resources or Resources()
        self.resources.check()
        self.ray = import_ray()
        self.started = False
        if not self.ray.is_initialized():
            try:
                init_ray(self.ray, address, log_to_driver=True)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ExecutorError(f"cannot start or reach Ray{f' at {address}' if address else ''}: {exc}") from None
            self.started = True
        r = self.resources
        self._actor_class = self.ray.remote(_Worker).options(
            num_cpus=r.cpus, num_gpus=r.gpus, max_restarts=r.max_retries, max_task_retries=r.max_retries)
        self.actors: list[Any] = []

    @property
    def slots(self) -> int:
        """How many tasks run at once: the cluster's CPUs (and GPUs) over what one task declares."""
        total = self.ray.cluster_resources()
        r, n = self.resources, None
        for have, need in ((total.get("CPU", 0.0), r.cpus), (total.get("GPU", 0.0), r.gpus)):
            if need > 0:
                k = int(have // need + 1e-9)
                n = k if n is None else min(n, k)
        return max(1, n if n is not None else int(total.get("CPU", 1.0)))

    def run(self, tasks: Sequence[WorkUnit], *, log: _LOG = stderr_line, label: str = "executor") -> Execution:
        ray, r = self.ray, self.resources
        progress = _Progress(tasks, log, label)
        cwd = os.getcwd()
        want = min(self.slots, max(len(tasks), 1))
        while len(self.actors) < want:     # the pool grows to the batch; its actors stay for later waves
            self.actors.append(self._actor_class.remote())
        idle = self.actors[:want]
        queue = list(range(len(tasks)))
        running: dict[Any, tuple[int, Any]] = {}
        results: list[TaskResult | None] = [None] * len(tasks)
        while queue or running:
            while queue and idle:        # the next task to a free actor (a long task never holds others back)
                i, actor = queue.pop(0), idle.pop(0)
                ref = actor.run.options(name=tasks[i].name, retry_exceptions=r.max_retries > 0).remote(
                    tasks[i].fn, tasks[i].args, cwd)
                running[ref] = (i, actor)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                i, actor = running.pop(ref)
                t = tasks[i]
                try:
                    rc, err, secs = ray.get(ref)
                except ray.exceptions.RayError as exc:   # retries used up: the task raised, or its actor died
                    rc, err, secs = 1, _ray_error(exc), 0.0
                idle.append(actor)
                res = TaskResult(t.name, t.arm, rc, secs, err)
                results[i] = res
                progress.add(res)
        return Execution([x for x in results if x is not None])

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.actors = []
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
            self.started = False


def _ray_error(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if cause is not None and not isinstance(cause, type(exc)):
        return f"{type(cause).__name__}: {cause}"
    return _last_line(str(exc)) or type(exc).__name__


#: name -> factory(resources=..., address=...)
EXECUTORS: Registry[Callable[..., Executor]] = Registry("executor")
EXECUTORS.add("local", LocalExecutor)
EXECUTORS.add("ray", RayExecutor)


def _check_choice(name: str, address: str | None) -> None:
    if name not in EXECUTORS.names():
        raise ExecutorError(f"--executor must be one of {', '.join(EXECUTORS.names())}, not {name!r}")
    if address is not None and name == "local":
        raise ExecutorError("--address is the Ray cluster to run on; it needs --executor ray")


def make_executor(name: str, *, resources: Resources | None = None, address: str | None = None) -> Executor:
    _check_choice(name, address)
    return EXECUTORS.get(name)(resources=resources, address=address)


def executor_of(settings: Any) -> tuple[str, Resources, str | None]:
    """(executor name, resources, address) of a job's executor settings (:class:`memtoc.core.config.
    ExecutorSettings`, or anything with its fields), checked before any work: the name, the resources, and an
    address only with Ray."""
    _check_choice(settings.executor, None)
    res = Resources(cpus=settings.cpus_per_arm, gpus=settings.gpus_per_arm, max_retries=settings.max_retries)
    res.check()
    _check_choice(settings.executor, settings.address)
    return settings.executor, res, settings.address


def run_waves(settings: Any, make_waves: Callable[[int], Sequence[Sequence[WorkUnit]]], *, label: str,
              kept: str) -> None:
    """Run a job's tasks on the executor of ``settings``, wave after wave (``make_waves(slots)``: the tasks of
    each wave, cut for the executor's parallel slots; built once the executor started, so a missing Ray is said
    first). A failed task stops the job with the executor's summary; ``kept``: what a re-run resumes from."""
    name, resources, address = executor_of(settings)
    ex = make_executor(name, resources=resources, address=address)
    try:
        for wave in make_waves(ex.slots):
            execution = run_tasks(wave, ex, label=label)
            if not execution.ok:
                raise ExecutorError(f"{execution.summary()}\n{kept} are kept; re-run the same command to resume")
    finally:
        ex.close()


def run_tasks(tasks: Sequence[WorkUnit], executor: str | Executor = "local", *, resources: Resources | None = None,
              address: str | None = None, log: _LOG = stderr_line, label: str = "executor") -> Execution:
    """Run ``tasks`` on a named executor (started and closed here) or on an open one."""
    if isinstance(executor, Executor):
        return executor.run(tasks, log=log, label=label)
    ex = make_executor(executor, resources=resources, address=address)
    try:
        return ex.run(tasks, log=log, label=label)
    finally:
        ex.close()

