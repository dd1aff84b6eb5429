"""How a failing job ends a command: one line on stderr and an exit status, never a traceback.

Errors of outside libraries that mean "these bytes are not what the option takes" (a binary file read as text,
JSON that does not parse, a truncated binary header, a safetensors or zip file that is not one) are turned into one
:class:`InputDecodeError` at the job boundary by :func:`input_errors`, naming the file being read when the failing
frame holds one. Only these decoding errors are converted: any other exception (a genuine bug) keeps its traceback.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from memtoc.core.errors import MemtocError
from memtoc.core.fileio import describe_os_error

__all__ = ["reported", "input_errors", "InputDecodeError", "DECODE_ERRORS", "one_line"]

#: the exception types that mean an input's bytes could not be decoded (by type; the libraries' own by name below)
DECODE_ERRORS: tuple[type[BaseException], ...] = (UnicodeDecodeError, json.JSONDecodeError, struct.error)
#: the same from libraries this core layer does not import: (module prefix, class name)
_DECODE_NAMES = {("safetensors", "SafetensorError"), ("zipfile", "BadZipFile"), ("_csv", "Error"),
                 ("csv", "Error"), ("_pickle", "UnpicklingError"), ("pickle", "UnpicklingError")}


class InputDecodeError(MemtocError):
    """An input file whose bytes are not what the option takes (the message names the file where known)."""


def _is_decode_error(exc: BaseException) -> bool:
    return isinstance(exc, DECODE_ERRORS) or any((cls.__module__.split(".")[0], cls.__name__) in _DECODE_NAMES
                                                 for cls in type(exc).__mro__)


def _file_of(value: Any) -> str | None:
    name = getattr(value, "name", None) if not isinstance(value, (str, os.PathLike)) else value
    if isinstance(name, (str, os.PathLike)):
        try:
            text = os.fspath(name)
            return text if text and os.path.isfile(text) else None
        except (TypeError, ValueError, OSError):
            return None
    return None


def failing_file(exc: BaseException) -> str | None:
    """The file the innermost frames of ``exc``'s traceback were reading: an open file's name or a path held in
    a local variable (innermost frame first), or None."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in list(frame.f_locals.values()):
            found = _file_of(value)
            if found is not None:
                return found
    return None


@contextmanager
def input_errors() -> Iterator[None]:
    """Turn an outside library's decoding error raised inside the block into one :class:`InputDecodeError`."""
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, MemtocError) or not _is_decode_error(exc):
            raise
        where = failing_file(exc)
        what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"
        if where is not None:
            raise InputDecodeError(f"{where} cannot be read as this option's input ({what}); check that it is the "
                                   "file the option takes") from exc
        raise InputDecodeError(f"an input could not be read ({what}); check that each path given is the file its "
                               "option takes") from exc


def one_line(text: str) -> str:
    """``text`` with its control characters escaped (a newline as ``\\n``): a path or value holding one must not
    break an error into two lines, nor move the terminal's cursor."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def reported(command: str, run: Callable[[], Any]) -> int:
    """``run()`` with a user error, a disk error, an input that does not decode or an interrupt turned into one
    line on stderr and the command's exit status (2, 2, 2, 130): what the command line and every recipe step do
    with a failing job."""
    try:
        with input_errors():
            return int(run() or 0)
    except MemtocError as exc:
        print(one_line(f"memtoc {command}: error: {exc}"), file=sys.stderr)
        return 2
    except OSError as exc:  # a disk or permission failure no code path turned into a MemtocError
        where = f"{exc.filename}: " if exc.filename else ""
        print(one_line(f"memtoc {command}: error: {where}{describe_os_error(exc)}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memtoc {command}: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
