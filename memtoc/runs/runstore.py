"""The run directory: ``run.json`` (provenance), ``closed_book.jsonl``, ``episodes.jsonl``, ``summary.json``,
and ``.writer.lock`` (who writes it).

Writing (``memtoc evaluate``, :meth:`RunStore.open`): records are appended one batch per write, flushed and
fsynced, so a killed process loses at most the batch in flight. The writer holds an exclusive ``flock`` on
``.writer.lock`` (with its pid, host and start time written inside) for as long as it lives, so a second
writer on the same directory is refused instead of interleaving. On reopening, the writer cuts a torn last
line off and skips finished records by key; a directory made with different settings is refused rather
than mixed. A write that fails (disk full, read-only) is undone and raises :class:`RunStoreError` naming the
file; every record committed before it is intact.

Reading (every other command, :meth:`RunStore.read`, :func:`read_jsonl`): never writes. A torn last line is
ignored with a warning that the run was interrupted, and :class:`RunState` tells a run whose writer is alive
(``running``: the lock is held) from one whose writer died (``interrupted``: ``run.json`` still says
``running`` but nobody holds the lock).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import (HOST, describe_os_error, fsync_dir, iter_siblings, json_error_text, sha256_json,
                           write_json_atomic)

RUN_SCHEMA = "memtoc-run-v1"
LOCK_NAME = ".writer.lock"
Warn = Callable[[str], None]


def print_warning(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


# -- reading JSONL ------------------------------------------------------------------------------------------

@dataclass
class JsonlRead:
    """The records of a JSONL file with their line numbers; ``torn``: an unfinished last line was ignored."""

    path: Path
    records: list[tuple[int, dict[str, Any]]]
    torn: bool = False
    complete_bytes: int = 0     # length of the file up to its last newline
    unterminated: bool = False  # the last record kept has no newline (a whole record, written by hand)


def read_jsonl(path: str | Path, *, missing_ok: bool = False) -> JsonlRead:
    """Read a JSONL file without ever writing to it.

    A last line without its newline that is not valid JSON is what a killed writer leaves: it is ignored and
    reported as ``torn``. (A last line without a newline that parses is a whole record and is kept.) Any
    other bad line is an error naming the file and the line.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return JsonlRead(path, [])
        raise RunStoreError(f"{path}: file not found") from None
    except OSError as exc:
        raise RunStoreError(f"{path}: cannot read ({describe_os_error(exc)})") from None
    cut = raw.rfind(b"\n") + 1
    body, tail = raw[:cut], raw[cut:]
    out: list[tuple[int, dict[str, Any]]] = []
    lines = body.split(b"\n")[:-1] if body else []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            out.append((lineno, _parse_line(path, lineno, line)))
    torn = False
    if tail.strip():
        try:
            rec = json.loads(tail.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            torn = True
        else:
            if not isinstance(rec, dict):
                raise RunStoreError(f"{path}, line {len(lines) + 1}: expected a JSON object")
            out.append((len(lines) + 1, rec))
            return JsonlRead(path, out, complete_bytes=cut, unterminated=True)
    return JsonlRead(path, out, torn=torn, complete_bytes=cut)


def _parse_line(path: Path, lineno: int, line: bytes) -> dict[str, Any]:
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RunStoreError(f"{path}, line {lineno}: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise RunStoreError(f"{path}, line {lineno}: invalid JSON ({json_error_text(exc, line=False)})") from None
    if not isinstance(rec, dict):
        raise RunStoreError(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
    return rec


def iter_jsonl(path: str | Path, *, warn: Warn | None = print_warning) -> Iterator[dict[str, Any]]:
    """The records of a JSONL file (read only; a torn last line is skipped with a warning)."""
    res = read_jsonl(path)
    if res.torn and warn:
        warn(f"{res.path}: the last line is torn (the process writing it was interrupted); it was ignored")
    for _, rec in res.records:
        yield rec


class JsonlLog:
    """An append-only JSONL file of records with a unique key field.

    ``JsonlLog(path, key)`` opens it for appending: a torn last line left by a kill is cut off (the writer
    repairs its own file). ``JsonlLog.read(path, key)`` only reads: the torn line is ignored (``torn``) and
    nothing is written.
    """

    def __init__(self, path: Path, key: str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.key = key
        self.readonly = readonly
        self.torn = False
        self._records: dict[str, dict[str, Any]] = {}
        self._load()

    @classmethod
    def read(cls, path: Path, key: str) -> "JsonlLog":
        return cls(path, key, readonly=True)

    def _load(self) -> None:
        res = read_jsonl(self.path, missing_ok=True)
        self.torn = res.torn
        if not self.readonly and (res.torn or res.unterminated):
            # A write torn by a kill: drop the partial last line, keep everything before it (the writer
            # writes every record with its newline, so a line without one was cut short, even if it parses).
            if res.unterminated:
                res.records.pop()
            try:
                os.truncate(self.path, res.complete_bytes)
            except OSError as exc:
                raise RunStoreError(f"{self.path}: cannot cut off its torn last line ({describe_os_error(exc)})"
                                    ) from None
        for lineno, rec in res.records:
            k = rec.get(self.key)
            if k is None:
                raise RunStoreError(f"{self.path}, line {lineno}: record without '{self.key}'")
            self._records.setdefault(str(k), rec)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._records.get(key)

    def records(self) -> list[dict[str, Any]]:
        return list(self._records.values())

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Append new records (keys already present are skipped) in one write; returns how many were written.

        A failed write is undone (the file is cut back to its previous length) and raises RunStoreError; the
        records committed before stay intact, and the failed ones are not counted as done.
        """
        if self.readonly:
            raise RunStoreError(f"{self.path}: opened for reading only")
        fresh: dict[str, dict[str, Any]] = {}
        for rec in records:
            k = str(rec[self.key])
            if k in self._records or k in fresh:
                continue
            fresh[k] = rec
        if not fresh:
            return 0
        data = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in fresh.values())
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = None
        try:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if size is None:
                fsync_dir(self.path.parent)
        except OSError as exc:
            try:
                if size is None:
                    self.path.unlink()
                else:
                    os.truncate(self.path, size)
            except OSError:
                pass   # a torn tail, if any, is cut off by the next writer that opens the file
            raise RunStoreError(
                f"{self.path}: cannot append {len(fresh)} records ({describe_os_error(exc)}); the "
                f"{len(self._records)} records written before are intact; fix the disk and re-run the same "
                "command to resume") from None
        self._records.update(fresh)
        return len(fresh)


# -- the writer lock ----------------------------------------------------------------------------------------

@dataclass
class _Lease:
    """This process's hold on one lock file: the descriptor carrying the flock and how many stores use it."""

    fd: int
    ino: tuple[int, int]
    refs: int = 1


_HELD: dict[str, _Lease] = {}    # lock path -> this process's lease on it


class WriterLock:
    """The exclusive ``flock`` on ``<run>/.writer.lock`` a writer holds for its lifetime.

    The lock file keeps the pid, host and start time of the last writer. The kernel drops the lock when the
    process dies however it dies, so a reader that can take a shared lock knows no writer is alive. Within one
    process the lock is re-entrant (an evaluation resumed in the same process reuses it); it is released when
    every holder is closed or garbage-collected.
    """

    def __init__(self, key: str, lease: _Lease) -> None:
        self.key = key
        self._lease: _Lease | None = lease

    @classmethod
    def acquire(cls, root: Path, *, retry_s: float = 1.0) -> "WriterLock | None":
        path = root / LOCK_NAME
        key = os.path.realpath(path)
        lease = _HELD.get(key)
        if lease is not None:
            try:
                same = (os.stat(path).st_dev, os.stat(path).st_ino) == lease.ino
            except OSError:
                same = False
            if same:
                lease.refs += 1
                return cls(key, lease)
            del _HELD[key]          # the directory was deleted and made anew: that lease locks nothing here
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunStoreError(f"{path}: cannot create the writer lock ({describe_os_error(exc)})") from None
        deadline = time.monotonic() + retry_s   # readers take the lock shared for an instant: wait them out
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                holder = _holder_text(read_lock_info(root))
                os.close(fd)
                raise RunStoreError(f"{root} is being written by another memtoc process ({holder}); wait for it "
                                    "to finish or stop it, or use another --out") from None
            except OSError as exc:      # a file system without flock (some network mounts): no liveness
                os.close(fd)
                print_warning(f"{path}: cannot lock ({describe_os_error(exc)}); concurrent writers to {root} "
                              "will not be detected")
                return None
        info = {"pid": os.getpid(), "host": HOST,
                "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            os.fsync(fd)
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise RunStoreError(f"{path}: cannot write the writer lock ({describe_os_error(exc)})") from None
        lease = _HELD[key] = _Lease(fd=fd, ino=(st.st_dev, st.st_ino))
        return cls(key, lease)

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        lease.refs -= 1
        if lease.refs <= 0:
            if _HELD.get(self.key) is lease:
                del _HELD[self.key]
            try:
                os.close(lease.fd)           # closing the descriptor drops the flock
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def read_lock_info(root: Path) -> dict[str, Any]:
    try:
        return json.loads((root / LOCK_NAME).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def writer_alive(root: Path) -> bool | None:
    """Whether a writer holds ``root``'s lock now (None: no lock file, or locks unsupported here).

    Takes the lock shared for an instant and drops it: a read-only probe that works on a read-only mount.
    """
    path = root / LOCK_NAME
    key = os.path.realpath(path)
    if key in _HELD:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)            # also drops the shared lock if it was taken
    return False


def refuse_if_written(root: str | Path) -> None:
    """Refuse early (before a model loads) when another live process holds ``root``'s writer lock. The lock
    itself is taken by :meth:`RunStore.open`; this is the cheap check that spares a doomed model load."""
    root = Path(root)
    if os.path.realpath(root / LOCK_NAME) not in _HELD and writer_alive(root):
        raise RunStoreError(f"{root} is being written by another memtoc process "
                            f"({_holder_text(read_lock_info(root))}); wait for it to finish or stop it, or use "
                            "another --out")


def _holder_text(info: dict[str, Any]) -> str:
    if not info:
        return "writer unknown"
    return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started_utc')}"


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
            return f"interrupted (no live writer; last writer {_holder_text(self.writer)})"
        if self.state == "running":
            return f"running ({_holder_text(self.writer)})"
        return self.state

    def warnings(self) -> list[str]:
        """At most one line: what a reader should know before trusting the run's numbers."""
        torn = f"; the torn last line of {' and '.join(self.torn)} was ignored" if self.torn else ""
        if self.state == "interrupted":
            return [f"{self.root}: the run was interrupted (run.json says 'running' but no process holds it; "
                    f"last writer {_holder_text(self.writer)}){torn}; its results are partial; re-run the same "
                    "memtoc evaluate command to resume"]
        if self.state == "running":
            return [f"{self.root}: the run is still being written ({_holder_text(self.writer)}){torn}; its "
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
