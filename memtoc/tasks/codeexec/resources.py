"""Read the family's JSON data files (question templates, prompts, policies) shipped in ``codeexec/data``.

Texts a model sees are data, not code literals, so a wording change is a reviewed data change with a schema
version, and code never drifts from what the JSON says. Each file is checked for its ``schema_version`` and
required keys when read; a bad file raises :class:`~memtoc.core.errors.BenchmarkDataError` naming file and field.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable

from memtoc.core.errors import BenchmarkDataError

__all__ = ["load_data"]


@lru_cache(maxsize=None)
def _load(name: str) -> str:
    return resources.files("memtoc.tasks.codeexec").joinpath("data").joinpath(name).read_text(encoding="utf-8")


def load_data(name: str, *, schema_version: str, required: Iterable[str] = ()) -> dict[str, Any]:
    """Parse ``codeexec/data/<name>`` (a fresh copy each call) and check its schema version and keys."""
    where = f"memtoc/tasks/codeexec/data/{name}"
    try:
        obj = json.loads(_load(name))
    except FileNotFoundError as exc:
        raise BenchmarkDataError("file is missing from the package", path=where) from exc
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"not valid JSON ({exc})", path=where) from exc
    if not isinstance(obj, dict):
        raise BenchmarkDataError("top level must be a JSON object", path=where)
    if obj.get("schema_version") != schema_version:
        raise BenchmarkDataError(f"expected {schema_version!r}, found {obj.get('schema_version')!r}",
                                 path=where, field="schema_version")
    for key in required:
        if key not in obj:
            raise BenchmarkDataError("required key is missing", path=where, field=key)
    return obj
