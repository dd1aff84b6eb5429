"""Durable append-only JSON-lines logs and the exclusive writer lock: the one implementation under the run store
(:mod:`memtoc.runs.runstore`) and the activation store's journal (:mod:`activations.journal`). Callers choose
the error class, the lock file's name and the wording of a refusal.

- **Appending** (:func:`append_bytes`) writes whole lines at the end of the valid part of the file, cuts a torn
  tail and fsyncs the file (a new file's directory first); that fsync is the commit. A write that fails before
  it is undone and the ``OSError`` raised for the caller to word.
- **Reading** never writes. :func:`read_jsonl` is strict except for an unfinished last line (a killed writer's,
  reported as ``torn``); :func:`read_valid_prefix` reads a write-ahead log up to the first line that does not
  parse or that the caller rejects.
- **Repair** is the writer's job: :class:`JsonlLog` cuts a torn tail (:func:`cut_tail`); a write-ahead writer
  overwrites it with its next line.

The lock (:class:`WriterLock`): an exclusive ``flock`` held for the writer's lifetime; the file keeps the last
holder's pid, host and start time, and the kernel drops the lock when the process dies, so a reader that can
take it shared knows no writer is alive (:func:`lock_held`). ``reentrant=True`` lets one process take it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.fileio import HOST, describe_os_error, fsync_dir, json_error_text

Warn = Callable[[str], None]
Record = dict[str, Any]


def print_warning(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


# -- writing bytes -------------------------------------------------------------------------------------------

def write_all(fd: int, buffers: Sequence[Any]) -> int:
    """Write every buffer to ``fd`` (one ``writev`` per round; partial writes continue). Returns bytes written."""
    views = [memoryview(b).cast("B") for b in buffers if len(memoryview(b).cast("B"))]
    total = 0
    while views:
        n = os.writev(fd, views[:1024])
        total += n
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0
    return total


def append_bytes(path: str | Path, data: bytes, *, at: int | None = None) -> int:
    """Commit ``data`` (whole lines) to the log at ``path``: written at byte ``at`` (the end of the file when
    None), whatever followed cut off and the file fsynced. When this call creates the file, its directory is
    fsynced first, so the file's fsync is always the last step and the commit point.

    A failure is undone (the file is cut back to ``at``, or removed when this call created it; a torn tail left
    by a failed undo is cut by the next writer) and the ``OSError`` is raised. Returns the file's new length.
    """
    path = Path(path)
    created = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY)
    try:
        start = os.fstat(fd).st_size if at is None else at
        try:
            if created:      # the new directory entry first, so that the file's own fsync is the last step
                fsync_dir(path.parent, strict=True)
            os.lseek(fd, start, os.SEEK_SET)
            write_all(fd, [data])
            os.ftruncate(fd, start + len(data))
            os.fsync(fd)     # the commit: once it returns, nothing here undoes the write
        except OSError:
            try:
                if created:
                    os.unlink(path)
                else:
                    os.ftruncate(fd, start)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    return start + len(data)


def cut_tail(path: str | Path, length: int, *, error: type[MemtocError] = MemtocError) -> None:
    """The writer's repair: cut the file back to its valid ``length`` (a torn tail left by a kill)."""
    try:
        os.truncate(path, length)
    except OSError as exc:
        raise error(f"{path}: cannot cut off its torn last line ({describe_os_error(exc)})") from None


def encode_lines(records: Iterable[Record]) -> bytes:
    """Records as JSON lines (UTF-8, each with its newline), as :class:`JsonlLog` writes them."""
    return "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records).encode("utf-8")


# -- reading -------------------------------------------------------------------------------------------------

@dataclass
class JsonlRead:
    """The records of a JSONL file with their line numbers; ``torn``: an unfinished last line was ignored."""

    path: Path
    records: list[tuple[int, Any]]
    torn: bool = False
    complete_bytes: int = 0     # length of the valid part: up to the last newline (strict) or the valid prefix
    unterminated: bool = False  # the last record kept has no newline (a whole record, written by hand)


def _read_bytes(path: Path, *, missing_ok: bool, error: type[MemtocError]) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise error(f"{path}: file not found") from None
    except OSError as exc:
        raise error(f"{path}: cannot read ({describe_os_error(exc)})") from None


def read_jsonl(path: str | Path, *, missing_ok: bool = False, error: type[MemtocError] = MemtocError) -> JsonlRead:
    """Read a JSONL file strictly, without ever writing to it.

    A last line without its newline that is not valid JSON is what a killed writer leaves: it is ignored and
    reported as ``torn``. (A last line without a newline that parses is a whole record and is kept.) Any
    other bad line is an ``error`` naming the file and the line.
    """
    path = Path(path)
    raw = _read_bytes(path, missing_ok=missing_ok, error=error)
    if raw is None:
        return JsonlRead(path, [])
    cut = raw.rfind(b"\n") + 1
    body, tail = raw[:cut], raw[cut:]
    out: list[tuple[int, Any]] = []
    lines = body.split(b"\n")[:-1] if body else []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            out.append((lineno, _parse_line(path, lineno, line, error)))
    torn = False
    if tail.strip():
        try:
            rec = json.loads(tail.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            torn = True
        else:
            if not isinstance(rec, dict):
                raise error(f"{path}, line {len(lines) + 1}: expected a JSON object")
            out.append((len(lines) + 1, rec))
            return JsonlRead(path, out, complete_bytes=cut, unterminated=True)
    return JsonlRead(path, out, torn=torn, complete_bytes=cut)


def _parse_line(path: Path, lineno: int, line: bytes, error: type[MemtocError]) -> Record:
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{path}, line {lineno}: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}, line {lineno}: invalid JSON ({json_error_text(exc, line=False)})") from None
    if not isinstance(rec, dict):
        raise error(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
    return rec


def read_valid_prefix(path: str | Path, accept: Callable[[Any], Any], *,
                      error: type[MemtocError] = MemtocError) -> JsonlRead:
    """Read a write-ahead log without writing to it: the longest prefix of newline-terminated lines that parse
    as JSON and that ``accept`` takes (it returns the record to keep, or raises ``ValueError``, ``KeyError``
    or ``TypeError`` to end the prefix there). ``complete_bytes`` is the prefix's length (where the next line
    goes), and ``torn`` says that something follows it. A missing file is an empty log.
    """
    path = Path(path)
    data = _read_bytes(path, missing_ok=True, error=error)
    if data is None:
        return JsonlRead(path, [])
    out: list[tuple[int, Any]] = []
    pos = 0
    while True:
        end = data.find(b"\n", pos)
        if end < 0:
            break
        try:
            rec = accept(json.loads(data[pos:end].decode("utf-8")))
        except (ValueError, KeyError, TypeError):     # json and UTF-8 decoding errors are ValueErrors
            break
        out.append((len(out) + 1, rec))
        pos = end + 1
    return JsonlRead(path, out, torn=pos < len(data), complete_bytes=pos)


# -- the keyed log -------------------------------------------------------------------------------------------

class JsonlLog:
    """An append-only JSONL file of records with a unique key field.

    ``JsonlLog(path, key)`` opens it for appending: a torn last line left by a kill is cut off (the writer
    repairs its own file). ``JsonlLog.read(path, key)`` only reads: the torn line is ignored (``torn``) and
    nothing is written. Errors are raised as ``error`` (a subclass sets its own).
    """

    error: type[MemtocError] = MemtocError

    def __init__(self, path: Path, key: str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.key = key
        self.readonly = readonly
        self.torn = False
        self._records: dict[str, Record] = {}
        self._load()

    @classmethod
    def read(cls, path: Path, key: str) -> "JsonlLog":
        return cls(path, key, readonly=True)

    def _load(self) -> None:
        res = read_jsonl(self.path, missing_ok=True, error=self.error)
        self.torn = res.torn
        if not self.readonly and (res.torn or res.unterminated):
            # A write torn by a kill: drop the partial last line, keep everything before it (the writer
            # writes every record with its newline, so a line without one was cut short, even if it parses).
            if res.unterminated:
                res.records.pop()
            cut_tail(self.path, res.complete_bytes, error=self.error)
        for lineno, rec in res.records:
            k = rec.get(self.key)
            if k is None:
                raise self.error(f"{self.path}, line {lineno}: record without '{self.key}'")
            self._records.setdefault(str(k), rec)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> Record | None:
        return self._records.get(key)

    def records(self) -> list[Record]:
        return list(self._records.values())

    def append(self, records: Iterable[Record]) -> int:
        """Append new records (keys already present are skipped) in one write; returns how many were written.

        A failed write is undone (the file is cut back to its previous length) and raises ``error``; the
        records committed before stay intact, and the failed ones are not counted as done.
        """
        if self.readonly:
            raise self.error(f"{self.path}: opened for reading only")
        fresh: dict[str, Record] = {}
        for rec in records:
            k = str(rec[self.key])
            if k in self._records or k in fresh:
                continue
            fresh[k] = rec
        if not fresh:
            return 0
        data = encode_lines(fresh.values())
        try:
            append_bytes(self.path, data)
        except OSError as exc:
            raise self.error(
                f"{self.path}: cannot append {len(fresh)} records ({describe_os_error(exc)}); the "
                f"{len(self._records)} records written before are intact; fix the disk and re-run the same "
                "command to resume") from None
        self._records.update(fresh)
        return len(fresh)


# -- the writer lock -----------------------------------------------------------------------------------------

@dataclass
class _Lease:
    """This process's hold on one lock file: the descriptor carrying the flock and how many holders use it."""

    fd: int
    ino: tuple[int, int]
    refs: int = 1


_HELD: dict[str, _Lease] = {}    # lock path -> this process's lease on it


def _held_lease(path: Path) -> tuple[str, _Lease | None]:
    """This process's live lease on ``path`` (a lease on a file since deleted and made anew is dropped)."""
    key = os.path.realpath(path)
    lease = _HELD.get(key)
    if lease is not None:
        try:
            st = os.stat(path)
            same = (st.st_dev, st.st_ino) == lease.ino
        except OSError:
            same = False
        if not same:
            del _HELD[key]          # the directory was deleted and made anew: that lease locks nothing here
            lease = None
    return key, lease


class WriterLock:
    """The exclusive ``flock`` on ``<directory>/<name>`` a writer holds for its lifetime.

    Released by :meth:`release` (every holder of a re-entrant lock), by garbage collection, or by the kernel
    when the process dies.
    """

    def __init__(self, key: str, lease: _Lease) -> None:
        self.key = key
        self._lease: _Lease | None = lease

    @classmethod
    def acquire(cls, directory: Path, name: str, *, busy: Callable[[dict[str, Any]], str],
                error: type[MemtocError] = MemtocError, retry_s: float = 0.0, reentrant: bool = False,
                require_flock: bool = True, warn: Warn = print_warning) -> "WriterLock | None":
        """Take the lock, or raise ``error(busy(holder_info))`` while another holder has it.

        ``retry_s``: how long to wait out holders that take it for an instant (readers probing liveness).
        ``reentrant``: a second acquire in this process shares the first's lock instead of being refused.
        ``require_flock``: on a file system without ``flock`` (some network mounts) refuse with ``busy``; when
        False, warn and return None (the caller writes without liveness).
        """
        directory = Path(directory)
        path = directory / name
        key, lease = _held_lease(path)
        if lease is not None:
            if not reentrant:
                raise error(busy(read_lock_info(directory, name)))
            lease.refs += 1
            return cls(key, lease)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise error(f"{path}: cannot create the writer lock ({describe_os_error(exc)})") from None
        deadline = time.monotonic() + retry_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                raise error(busy(read_lock_info(directory, name))) from None
            except OSError as exc:
                os.close(fd)
                if require_flock:
                    raise error(busy(read_lock_info(directory, name))) from None
                warn(f"{path}: cannot lock ({describe_os_error(exc)}); concurrent writers to {directory} "
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
            raise error(f"{path}: cannot write the writer lock ({describe_os_error(exc)})") from None
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


def held_here(directory: Path, name: str) -> bool:
    """Whether this process holds the lock ``<directory>/<name>``."""
    return os.path.realpath(Path(directory) / name) in _HELD


def read_lock_info(directory: Path, name: str) -> dict[str, Any]:
    """The pid, host and start time the last holder wrote in the lock file ({} when unknown)."""
    try:
        return json.loads((Path(directory) / name).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


def lock_held(directory: Path, name: str) -> bool | None:
    """Whether a writer holds ``<directory>/<name>`` now (None: no lock file, or locks unsupported here).

    Takes the lock shared for an instant and drops it: a read-only probe that works on a read-only mount.
    """
    path = Path(directory) / name
    if held_here(directory, name):
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


def holder_text(info: dict[str, Any]) -> str:
    """``pid 12 on host h, started 2024-...``: a lock holder in words."""
    if not info:
        return "writer unknown"
    return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started_utc')}"
