"""Name -> class tables for the toolkit's extension points (edit kinds, lenses): one way to register, refuse a
silent redefinition, remove a toy entry again and list the names in registration order."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Registered entries in registration order (built-ins first). ``what`` names an entry in messages."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Register ``entry`` as ``name``; a second, different entry is refused unless ``replace``."""
        old = self._entries.get(name)
        if old is not None and old is not entry and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered ({old.__module__}.{old.__qualname__})")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)
