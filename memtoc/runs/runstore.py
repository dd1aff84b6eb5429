"""The run directory: ``run.json`` (provenance), ``closed_book.jsonl``, ``episodes.jsonl``, ``summary.json``,
and ``.writer.lock`` (who writes it).

Writing (:meth:`RunStore.open`): records are appended one fsynced batch per write, so a killed process loses at
most the batch in flight; the writer holds an exclusive ``flock`` on ``.writer.lock`` for its lifetime, so a second
writer is refused instead of interleaving. Reopening cuts a torn last line, skips finished records by key and
refuses a directory made with different settings. A failed write is undone and raises :class:`RunStoreError`.

Reading (:meth:`RunStore.read`, :func:`read_jsonl`) never writes: a torn last line is ignored with a warning, and
:class:`RunState` tells a live writer (``running``) from a dead one (``interrupted``). The logs and the lock are
:mod:`memtoc.core.durable`'s; this module names the files and words the refusals.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from memtoc.core import durable
from memtoc.core.durable import JsonlRead, Warn, holder_text, print_warning
from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import describe_os_error, iter_siblings, json_error_text, sha256_json, write_json_atomic

__all__ = ["JsonlLog", "JsonlRead", "LOCK_NAME", "RUN_SCHEMA", "RunState", "RunStore", "WriterLock", "iter_jsonl",
           "open_run_dir", "print_warning", "read_jsonl", "read_lock_info", "read_run_info", "refuse_if_written",
           "run_state", "writer_alive"]

RUN_SCHEMA = "memtoc-run-v1"
LOCK_NAME = ".writer.lock"


# -- the run's logs and writer lock: memtoc.core.durable with RunStoreError ----------------------------------

class JsonlLog(durable.JsonlLog):
    """An append-only JSONL file of records with a unique key field (:class:`memtoc.core.durable.JsonlLog`):
    ``JsonlLog(path, key)`` opens it for appending and cuts a torn last line off; ``JsonlLog.read(path, key)``
    only reads. Errors are :class:`RunStoreError`."""

    error = RunStoreError


def read_jsonl(path: str | Path, *, missing_ok: bool = False) -> JsonlRead:
    """Read a JSONL file without ever writing to it (:func:`memtoc.core.durable.read_jsonl`): a torn last line
    is ignored and reported as ``torn``; any other bad line is a :class:`RunStoreError` naming the line."""
    return durable.read_jsonl(path, missing_ok=missing_ok, error=RunStoreError)


def iter_jsonl(path: str | Path, *, warn: Warn | None = print_warning) -> Iterator[dict[str, Any]]:
    """The records of a JSONL file (read only; a torn last line is skipped with a warning)."""
    res = read_jsonl(path)
    if res.torn and warn:
        warn(f"{res.path}: the last line is torn (the process writing it was interrupted); it was ignored")
    for _, rec in res.records:
        yield rec


def _busy(root: Path) -> Callable[[dict[str, Any]], str]:
    return lambda info: (f"{root} is being written by another memtoc process ({holder_text(info)}); wait for it "
                         "to finish or stop it, or use another --out")


class WriterLock(durable.WriterLock):
    """The exclusive ``flock`` on ``<run>/.writer.lock`` a writer holds for its lifetime
    (:class:`memtoc.core.durable.WriterLock`): it records the writer's pid, host and start time, and is
    re-entrant within one process (an evaluation resumed in the same process reuses it)."""

    @classmethod
    def acquire(cls, root: Path, *, retry_s: float = 1.0) -> "WriterLock | None":    # type: ignore[override]
        # readers take the lock shared for an instant: wait them out; no flock here: warn, write unlocked
        return super().acquire(root, LOCK_NAME, busy=_busy(root), error=RunStoreError, retry_s=retry_s,
                               reentrant=True, require_flock=False, warn=print_warning)


def read_lock_info(root: Path) -> dict[str, Any]:
    return durable.read_lock_info(root, LOCK_NAME)


def writer_alive(root: Path) -> bool | None:
    """Whether a writer holds ``root``'s lock now (None: no lock file, or locks unsupported here); a read-only
    probe (:func:`memtoc.core.durable.lock_held`)."""
    return durable.lock_held(root, LOCK_NAME)


def refuse_if_written(root: str | Path) -> None:
    """Refuse early (before a model loads) when another live process holds ``root``'s writer lock. The lock
    itself is taken by :meth:`RunStore.open`; this is the cheap check that spares a doomed model load."""
    root = Path(root)
    if not durable.held_here(root, LOCK_NAME) and writer_alive(root):
        raise RunStoreError(_busy(root)(read_lock_info(root)))


@dataclass
class RunState:
    """What a reader can tell about a run directory's writer.

    ``status`` is what ``run.json`` records; ``state`` adds liveness: ``running`` (status running and the
    writer's lock is held), ``interrupted`` (status running, nobody holds the lock: the writer died), or the
    recorded final status (``complete``, ``partial``).
    """

    root: Path
    status: str | None
    live: bool | None
    writer: dict[str, Any] = field(default_factory=dict)
    torn: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.status == "running":
            return "running" if self.live else "interrupted"
        return str(self.status or "unknown")

    @property
    def finished(self) -> bool:
        return self.state in ("complete", "partial") and not self.torn

    def describe(self) -> str:
        """The state in a few words, for tables (``interrupted (last writer pid 12 on host h)``)."""
        if self.state == "interrupted":
            return f"interrupted (no live writer; last writer {holder_text(self.writer)})"
        if self.state == "running":
            return f"running ({holder_text(self.writer)})"
        return self.state

    def warnings(self) -> list[str]:
        """At most one line: what a reader should know before trusting the run's numbers."""
        torn = f"; the torn last line of {' and '.join(self.torn)} was ignored" if self.torn else ""
        if self.state == "interrupted":
            return [f"{self.root}: the run was interrupted (run.json says 'running' but no process holds it; "
                    f"last writer {holder_text(self.writer)}){torn}; its results are partial; re-run the same "
                    "memtoc evaluate command to resume"]
        if self.state == "running":
            return [f"{self.root}: the run is still being written ({holder_text(self.writer)}){torn}; its "
                    "results are partial"]
        if self.torn:
            return [f"{self.root}: a write was interrupted{torn}"]
        return []


def run_state(root: str | Path, info: dict[str, Any] | None = None, torn: Iterable[str] = ()) -> RunState:
    """The :class:`RunState` of a run directory (reads ``run.json`` unless ``info`` is given)."""
    root = Path(root)
    if info is None:
        info = read_run_info(root)
    return RunState(root=root, status=info.get("status"), live=writer_alive(root), writer=read_lock_info(root),
                    torn=list(torn))


def read_run_info(root: Path) -> dict[str, Any]:
    path = Path(root) / "run.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        parked = [p for p, _ in iter_siblings(Path(root), "merge-old")] if not Path(root).exists() else []
        if parked:
            raise RunStoreError(f"{root} is missing: a 'memtoc merge --overwrite' into it was interrupted and its "
                                f"previous content is in {parked[0]}; re-run the merge (it moves that back first)"
                                ) from None
        raise RunStoreError(f"{root} is not a run directory (no run.json)") from None
    except OSError as exc:
        raise RunStoreError(f"{path}: cannot read ({describe_os_error(exc)})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        why = json_error_text(exc) if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise RunStoreError(f"{path}: corrupt ({why})") from None
    if not isinstance(info, dict):
        raise RunStoreError(f"{path}: corrupt (expected a JSON object)")
    return info


# -- opening run directories --------------------------------------------------------------------------------

def open_run_dir(root: str | Path, *, identity: dict[str, Any], run_info: dict[str, Any],
                 keep_existing: bool, kind: str = "") -> Path:
    """Create or reopen a run directory whose ``run.json`` records ``identity`` (and its hash).

    A directory holding a run of another identity is refused, naming the fields that differ. With
    ``keep_existing`` an existing ``run.json`` is left as it was written; otherwise it is rewritten.
    """
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunStoreError(f"cannot create run directory {root}: {describe_os_error(exc)}") from None
    run_json = root / "run.json"
    identity_hash = sha256_json(identity)
    if run_json.exists():
        existing = read_run_info(root)
        if existing.get("identity_sha256") != identity_hash:
            old = existing.get("identity", {})
            diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            what = f"a {kind} run" if kind else "a run"
            raise RunStoreError(
                f"{root} holds {what} made with different settings ({', '.join(diff) or 'unknown fields'}); "
                "use another --out directory, or delete this one to start over")
        if keep_existing:
            return root
    write_json_atomic(run_json, {**run_info, "identity": identity, "identity_sha256": identity_hash},
                      error=RunStoreError)
    return root


@dataclass
class RunStore:
    """One run directory. ``identity`` is the part of the config that decides what the records mean."""

    root: Path
    closed_book: JsonlLog
    episodes: JsonlLog
    state: RunState | None = None        # set by read(): what a reader knows about the writer
    lock: WriterLock | None = field(default=None, repr=False)

    @classmethod
    def open(cls, root: str | Path, *, identity: dict[str, Any], run_info: dict[str, Any]) -> "RunStore":
        """Open for writing: take the writer lock (refused while another process holds it), check or write
        ``run.json`` and repair a torn last line. A resumed run's recorded status becomes ``run_info``'s."""
        root = Path(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunStoreError(f"cannot create run directory {root}: {describe_os_error(exc)}") from None
        lock = WriterLock.acquire(root)
        try:
            open_run_dir(root, identity=identity, run_info={"schema_version": RUN_SCHEMA, **run_info},
                         keep_existing=True)
            store = cls(root=root, closed_book=JsonlLog(root / "closed_book.jsonl", "key"),
                        episodes=JsonlLog(root / "episodes.jsonl", "episode_id"), lock=lock)
            status = run_info.get("status")
            if status is not None and store.run_info().get("status") != status:
                store.update_run_info(status=status)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        return store

    @classmethod
    def read(cls, root: str | Path, *, warn: Warn | None = print_warning) -> "RunStore":
        """Open an existing run for reading (reports, comparisons, merges). Never writes: a torn last line is
        ignored, and ``warn`` gets one line when the run was interrupted or is still being written."""
        root = Path(root)
        info = read_run_info(root)
        store = cls(root=root, closed_book=JsonlLog.read(root / "closed_book.jsonl", "key"),
                    episodes=JsonlLog.read(root / "episodes.jsonl", "episode_id"))
        store.state = run_state(root, info, [log.path.name for log in (store.closed_book, store.episodes)
                                             if log.torn])
        if warn:
            for w in store.state.warnings():
                warn(w)
        return store

    def close(self) -> None:
        """Release the writer lock (a no-op for a store opened to read)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def run_info(self) -> dict[str, Any]:
        return read_run_info(self.root)

    def update_run_info(self, **fields: Any) -> None:
        info = self.run_info()
        info.update(fields)
        write_json_atomic(self.root / "run.json", info, error=RunStoreError)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.root / "summary.json", summary, error=RunStoreError)
