"""The API's one error type."""

from __future__ import annotations

from memtoc.core.errors import MemtocError


class APIError(MemtocError, TypeError):
    """A keyword a function does not take, a value of the wrong type, or a required one missing (the message
    names the keyword)."""
