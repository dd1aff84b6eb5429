"""Errors a user can act on: each names the file, the row and the field that is wrong."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


class MemtocError(Exception):
    """Base class for every error the toolkit raises on purpose (the CLI prints these without a traceback)."""


class BenchmarkDataError(MemtocError):
    """Malformed benchmark input. The message names the file, the row (1-based line or list index) and the field."""

    def __init__(self, message: str, *, path: str | Path | None = None, row: int | str | None = None,
                 field: str | None = None) -> None:
        parts = []
        if path is not None:
            parts.append(str(path))
        if row is not None:
            parts.append(f"row {row}")
        if field is not None:
            parts.append(f"field '{field}'")
        where = ", ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = None if path is None else str(path)
        self.row = row
        self.field = field


class RunStoreError(MemtocError):
    """A run directory that cannot be used as asked (different settings, corrupt records)."""


class ModelNotAvailableError(MemtocError):
    """The requested model cannot be loaded here; the message says what to run to get it."""


class FileWriteError(MemtocError):
    """A file that could not be written (disk full, read-only, no permission); the message names the file."""


@contextmanager
def naming(path: str):
    """Prefix a data error raised while processing records from ``path`` with the file (once)."""
    try:
        yield
    except BenchmarkDataError as exc:
        if exc.path is None:
            where = ", ".join(([f"row {exc.row}"] if exc.row is not None else [])
                              + ([f"field '{exc.field}'"] if exc.field is not None else []))
            msg = str(exc).removeprefix(f"{where}: ") if where else str(exc)
            raise BenchmarkDataError(msg, path=path, row=exc.row, field=exc.field) from None
        raise
    except MemtocError as exc:
        if not str(exc).startswith(str(path)):
            raise type(exc)(f"{path}: {exc}") from None
        raise


class OutputPathError(MemtocError):
    """An output path that would overwrite an input, land inside an input directory or outside its directory."""

