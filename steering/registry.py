"""The edit-kind registry: ``kind`` in an edit spec -> the :class:`~steering.edits.Edit` subclass that owns it.

A kind is one class (a subclass of ``steering.edits.Edit``) that carries everything kind-specific: the checks
of its own spec fields (``validate_fields``), the checks of the files they name (``check_files``), the
construction of the edit (its constructor) and what sweeps and reports read from an edit (``toward``). It
registers itself with the class decorator :func:`register_edit_kind`; the built-in kinds are the modules of
``steering.kinds`` (imported by the ``steering`` package). ``docs/extending.md`` walks through adding one.

This module imports nothing from ``steering`` so that ``steering.spec`` can look kinds up without an import
cycle (the kinds themselves import ``steering.spec`` and ``steering.edits``).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from memtoc.core.registry import Registry

_KINDS: Registry[type] = Registry("edit kind")

T = TypeVar("T", bound=type)

#: The class attributes and methods every registered kind has (``steering.edits.Edit`` provides defaults for
#: all but ``validate_fields`` and ``appliers``).
REQUIRED = ("validate_fields", "check_files", "appliers", "steer", "toward", "own_fields")


def register_edit_kind(name: str, *, replace: bool = False) -> Callable[[T], T]:
    """Class decorator: register an ``Edit`` subclass as the kind ``name`` (sets ``cls.kind = name``).

    Registering a name twice is refused unless ``replace=True`` (a test or a notebook re-running a cell).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"an edit kind name must be an identifier, got {name!r}")

    def deco(cls: T) -> T:
        missing = [a for a in REQUIRED if not hasattr(cls, a)]
        if missing:
            raise TypeError(f"edit kind {name!r}: {cls.__name__} lacks {', '.join(missing)} "
                            "(subclass steering.edits.Edit)")
        _KINDS.add(name, cls, replace=replace)
        cls.kind = name
        return cls
    return deco


def unregister_edit_kind(name: str) -> None:
    """Remove a kind (tests that register a toy kind clean up with this)."""
    _KINDS.remove(name)


def edit_kind(name: Any) -> type | None:
    """The class registered as ``name``, or None."""
    return _KINDS.get(name) if isinstance(name, str) else None


def edit_kinds() -> tuple[str, ...]:
    """The registered kind names, in registration order (built-ins first)."""
    return _KINDS.names()
