"""Small file helpers shared by the run store, the HDF5 store, merges and the CLI: hashing, atomic writes,
temporary siblings owned by a process, and an atomic directory replace.

- a file is written to a temporary sibling, fsynced, renamed over the target, and the directory fsynced, so a
  reader sees the old file or the new one, never half of one;
- temporary siblings are named ``.<name>.<tag>-<pid>``, so the next run removes only those of dead processes
  (:func:`clean_stale_siblings`);
- a directory is replaced by swapping in a new sibling with ``renameat2(RENAME_EXCHANGE)``, else by two renames
  whose gap the next run repairs (:func:`recover_dir_swap`).

Write failures become a :class:`~memtoc.core.errors.MemtocError` subclass naming the file (``error=``,
:class:`~memtoc.core.errors.FileWriteError` by default).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any, Callable, Iterator

from memtoc.core.errors import FileWriteError, MemtocError, OutputPathError


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: object) -> str:
    """Hash of a JSON-able object in canonical form (sorted keys), for config identity checks."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def describe_os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the reason of an OSError, without Python's ``[Errno N]`` noise."""
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return f"{reason} ({name})" if name else reason


def json_error_text(exc: json.JSONDecodeError, *, line: bool = True) -> str:
    """``Unterminated string starting at line 1 column 5``: json's message with its position, said once
    (json's own messages may end in "at", which a naive ``f"{msg} at column"`` doubled into "at at")."""
    msg = exc.msg.rstrip()
    sep = " " if msg.endswith(" at") else " at "
    return f"{msg}{sep}" + (f"line {exc.lineno} column {exc.colno}" if line else f"column {exc.colno}")


# -- the one rule for output paths ----------------------------------------------------------------------------

def real_path(path: str | Path) -> Path:
    """``path`` with ``~`` expanded and every link resolved."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)     # hard links and bind mounts too
    except OSError:
        return False


def check_output_path(output: str | Path, inputs: "Iterator[str | Path] | list[str | Path] | tuple" = (), *,
                      flag: str = "--out", within: str | Path | None = None, own: tuple[str, ...] = (),
                      output_is_dir: bool = False) -> Path:
    """Refuse an output path before anything is written (every writer calls this with its inputs).

    The rule: an output is never one of the command's inputs (same path, symlink or hard link), never inside an
    input directory (a run directory, a release checkout) unless its name is in ``own`` (the command's one
    documented file there, e.g. ``judge.jsonl``), never outside ``within`` when the command was given a
    directory to write in, and, for a directory output, never a directory that holds an input. The error is
    one line naming both paths.
    """
    out = Path(output)
    real = real_path(out)
    if within is not None:
        base = real_path(within)
        if not _under(real, base) or real == base:
            raise OutputPathError(f"{flag} {output} is outside {within}, the directory it writes in; give a file "
                                  f"name inside {within}")
    for inp in inputs:
        if inp is None:
            continue
        ireal = real_path(inp)
        if real == ireal or _same_file(out, inp):
            raise OutputPathError(f"{flag} {output} is the input {inp}; writing it would destroy the input, "
                                  "choose another path")
        if Path(inp).is_dir() and _under(real, ireal) and not (real.parent == ireal and out.name in own):
            raise OutputPathError(f"{flag} {output} is inside the input directory {inp}; write outputs outside "
                                  "their inputs")
        if output_is_dir and _under(ireal, real):
            raise OutputPathError(f"{flag} {output} holds the input {inp}; choose an output directory that "
                                  "contains no input")
    return out


def check_distinct_outputs(outputs: "dict[str, str | Path | None]") -> None:
    """Two outputs of one command (``--sheet`` and ``--key``) that are the same file: refused, both named."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        real = real_path(path)
        if real in seen:
            raise OutputPathError(f"{flag} {path} is also {seen[real]}; each output needs its own file")
        seen[real] = f"{flag} {path}"


def check_outputs(outputs: "dict[str, str | Path | None]", inputs: "list[str | Path | None] | tuple" = (), *,
                  output_is_dir: bool = False) -> None:
    """:func:`check_output_path` for each output option of a command (flag -> path, None: not given) against
    its inputs, and the outputs against each other. An input file inside a run directory (beside its
    ``run.json``) makes that directory an input too."""
    ins = [Path(p) for p in inputs if p is not None]
    ins += [p.parent for p in ins if p.is_file() and (p.parent / "run.json").is_file()]
    for flag, out in outputs.items():
        if out is not None:
            check_output_path(out, ins, flag=flag, output_is_dir=output_is_dir)
    check_distinct_outputs(outputs)


# -- process-owned temporary siblings -------------------------------------------------------------------------

HOST = socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (``EPERM``: it exists but belongs to someone else)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_sibling(target: str | Path, tag: str = "tmp", pid: int | None = None) -> Path:
    """``.<name>.<tag>-<pid>`` beside ``target``: hidden, and owned by this process (its pid)."""
    target = Path(target)
    return target.with_name(f".{target.name}.{tag}-{os.getpid() if pid is None else pid}")


def iter_siblings(target: str | Path, tag: str) -> Iterator[tuple[Path, int]]:
    """Every ``.<name>.<tag>-<pid>`` beside ``target``, with its pid."""
    target = Path(target)
    pat = re.compile(rf"\.{re.escape(target.name)}\.{re.escape(tag)}-(\d+)$")
    try:
        names = os.listdir(target.parent if str(target.parent) else ".")
    except OSError:
        return
    for name in sorted(names):
        m = pat.match(name)
        if m:
            yield target.with_name(name), int(m.group(1))


def remove_path(path: Path) -> None:
    """Remove a file or a directory tree (gone already is fine)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def clean_stale_siblings(target: str | Path, tags: tuple[str, ...] = ("tmp",),
                         log: Callable[[str], None] | None = None) -> list[Path]:
    """Remove the temporary siblings of ``target`` left by processes that are no longer alive.

    Siblings of live processes (this one included) are left alone. The pid is checked on this host only: on a
    file system shared between hosts, run merges of one output from one host.
    """
    removed = []
    for tag in tags:
        for path, pid in iter_siblings(target, tag):
            if pid == os.getpid() or pid_alive(pid):
                continue
            remove_path(path)
            removed.append(path)
            if log:
                log(f"removed {path}, left by an interrupted process (pid {pid})")
    return removed


# -- fsync and atomic file writes -----------------------------------------------------------------------------

def fsync_dir(path: str | Path, *, strict: bool = False) -> None:
    """fsync a directory so the renames and creations inside it survive a power cut (no-op where unsupported).

    ``strict``: a real I/O failure (not "directories cannot be fsync'ed here") is raised, so a store that must
    report every failed write does not miss one.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if strict and exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def fsync_file(path: str | Path) -> None:
    """fsync a file written through another descriptor (a library's, h5py's) before it is renamed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under ``root`` (deepest first), then ``root`` itself."""
    root = Path(root)
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            fsync_file(p)
        fsync_dir(dirpath)


def write_bytes_atomic(path: str | Path, data: bytes, *, error: type[MemtocError] | None = FileWriteError,
                       strict: bool = False) -> None:
    """Write ``data`` through a temporary sibling, fsync, rename and fsync the directory: a reader (or a
    resumed process) sees the old file or the new one, never half of one. A failure leaves the old file in
    place and raises ``error`` naming the file and the reason (``error=None``: the ``OSError`` itself, for a
    caller that words it). ``strict``: a failed fsync of the directory is raised too (see :func:`fsync_dir`)."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if error is None:
            raise
        raise error(f"{path}: cannot write ({describe_os_error(exc)}); the previous file, if any, is "
                    "unchanged") from None
    fsync_dir(path.parent, strict=strict)


def write_text_atomic(path: str | Path, text: str, *, error: type[MemtocError] = FileWriteError) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), error=error)


def json_ready(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN: a figure with nothing behind it) as None and numpy scalars as
    Python numbers, recursively: JSON has no NaN, and the writers here refuse it (``allow_nan=False``)."""
    if hasattr(obj, "item") and type(obj).__module__ == "numpy" and getattr(obj, "ndim", 1) == 0:
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def write_json_atomic(path: str | Path, obj: object, *, error: type[MemtocError] = FileWriteError) -> None:
    """Write JSON through a temporary file, fsync and rename, so a reader never sees half a file."""
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False) + "\n", error=error)


def write_jsonl_atomic(path: str | Path, records: "list[dict]", *,
                       error: type[MemtocError] = FileWriteError) -> None:
    """Write records as JSON lines atomically (see :func:`write_bytes_atomic`)."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records),
                      error=error)


#: a cell starting with one of these is a formula to a spreadsheet (``=HYPERLINK(...)``, ``@SUM``, ``+1``, a
#: tab or CR that some apps strip first): the OWASP "CSV injection" list
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: object) -> object:
    """A text cell a spreadsheet would run as a formula gets a leading apostrophe (shown as text, as
    spreadsheet-safe CSV writers do); numbers and other text are unchanged."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def write_records_csv_atomic(path: str | Path, records: "list[dict]") -> None:
    """Write flat dict records as CSV (columns in first-seen order, None as an empty cell) through a temporary
    file and a rename, so a reader never sees half a table. Text cells that a spreadsheet would read as a
    formula are neutralised (:func:`spreadsheet_safe`): model text lands in these sheets verbatim."""
    import csv
    import io

    fields: list[str] = []
    for rec in records:
        fields += [k for k in rec if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for rec in records:
        w.writerow({k: ("" if v is None else spreadsheet_safe(v)) for k, v in rec.items()})
    write_text_atomic(path, buf.getvalue())


# -- atomic directory replace ---------------------------------------------------------------------------------

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc: ctypes.CDLL | None | bool = None


def _renameat2_fn() -> Callable[..., int] | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    fn = getattr(_libc, "renameat2", None) if _libc else None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return fn


def exchange_paths(a: str | Path, b: str | Path) -> bool:
    """Atomically swap two existing paths with ``renameat2(RENAME_EXCHANGE)``.

    Returns False where the C library, kernel or file system does not offer it (the caller falls back);
    raises OSError for any other failure.
    """
    fn = _renameat2_fn()
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Put the complete directory ``new`` (a sibling of ``target``, already fsynced) at ``target``: swapped in one
    step with ``RENAME_EXCHANGE``, else by moving ``target`` to ``.<name>.merge-old-<pid>`` first (a kill in
    between leaves a complete old copy, which :func:`recover_dir_swap` moves back).
    """
    new, target = Path(new), Path(target)
    if not target.exists() and not target.is_symlink():
        os.rename(new, target)
        fsync_dir(target.parent)
        return
    if exchange_paths(new, target):
        fsync_dir(target.parent)
        remove_path(new)                      # now the old directory
        return
    old = temp_sibling(target, "merge-old")
    os.rename(target, old)
    fsync_dir(target.parent)
    os.rename(new, target)
    fsync_dir(target.parent)
    remove_path(old)


def recover_dir_swap(target: str | Path, *, tags: tuple[str, ...] = ("merge-tmp",),
                     log: Callable[[str], None] | None = None) -> None:
    """Repair what killed :func:`replace_dir` calls left beside ``target``, before a new one starts.

    A ``.<name>.merge-old-<pid>`` of a dead process is the previous complete ``target``: moved back when
    ``target`` is missing (the kill fell between the two renames), removed otherwise. Dead processes'
    temporary siblings (``tags``) are removed.
    """
    target = Path(target)
    for old, pid in iter_siblings(target, "merge-old"):
        if pid == os.getpid() or pid_alive(pid):
            continue
        if not target.exists():
            os.rename(old, target)
            fsync_dir(target.parent)
            if log:
                log(f"restored {target} from {old.name}: an earlier overwrite was interrupted before the new "
                    "output was in place")
        else:
            remove_path(old)
    clean_stale_siblings(target, tags, log=log)
