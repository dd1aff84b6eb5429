"""Errors a user can act on: each names the file, the row and the field that is wrong."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


class MemtocError(Exception):
    """Base class for every error the toolkit raises on purpose (the CLI prints these without a traceback)."""


def located(message: str, *, path: str | Path | None = None, row: int | str | None = None,
            field: str | None = None) -> str:
    """``message`` after the known parts of ``file, row N, field 'f'``."""
    parts = [str(path)] if path is not None else []
    if row is not None:
        parts.append(f"row {row}")
    if field is not None:
        parts.append(f"field '{field}'")
    return f"{', '.join(parts)}: {message}" if parts else message


class ConfigError(MemtocError, ValueError):
    """An option value (or a combination) a job cannot run with; the message names the option (also a
    ``ValueError``, as the code-executor configs raised before they became ``MemtocError``s)."""


class UnknownOptionError(ConfigError, TypeError):
    """A keyword no option field of the config takes (the message names it and lists the ones it takes)."""


class BenchmarkDataError(MemtocError):
    """Malformed benchmark input. The message names the file, the row (1-based line or list index) and the field."""

    def __init__(self, message: str, *, path: str | Path | None = None, row: int | str | None = None,
                 field: str | None = None) -> None:
        super().__init__(located(message, path=path, row=row, field=field))
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
            msg = str(exc).removeprefix(located("", row=exc.row, field=exc.field))
            raise BenchmarkDataError(msg, path=path, row=exc.row, field=exc.field) from None
        raise
    except MemtocError as exc:
        if not str(exc).startswith(str(path)):
            raise type(exc)(f"{path}: {exc}") from None
        raise


class OutputPathError(MemtocError):
    """An output path that would overwrite an input, land inside an input directory or outside its directory."""

