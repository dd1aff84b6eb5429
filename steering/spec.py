"""Edit specs (JSON, ``schema_version: "memtoc-edit-v1"``): validation, normalisation, atomic writing.

A spec is checked completely before any model loads; every error names the file and the field. The format is
documented in ``docs/steering.md``. Common fields (checked here)::

    schema_version        "memtoc-edit-v1"
    name                  non-empty string (recorded in every edited episode record)
    kind                  a registered edit kind (``steering.registry``)
    layers                [site, ...]  an edit at site s changes the output of block s-1 (0 = embedding output)
    positions             "last_input" | "tool_span" | "from_tool_return"
    strength              number
    apply_to_closed_book  bool (default false)

The kind's class checks its own fields; a field another kind owns is refused with that kind's name. Any other
top-level key (``description``, ``source``, ...) is kept as free-form provenance.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from memtoc.core.errors import MemtocError
from steering.registry import edit_kind, edit_kinds

SCHEMA_VERSION = "memtoc-edit-v1"
POSITIONS = ("last_input", "tool_span", "from_tool_return")
DIRECTIONS = ("memory", "tool")


class EditSpecError(MemtocError):
    """An edit spec that cannot be used. The message names the file (when there is one) and the field."""

    def __init__(self, message: str, *, path: str | Path | None = None, field: str | None = None) -> None:
        parts = []
        if path is not None:
            parts.append(str(path))
        if field is not None:
            parts.append(f"field '{field}'")
        where = ", ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = None if path is None else str(path)
        self.field = field


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class SpecChecker:
    """Raises :class:`EditSpecError` naming the spec file and the field; handed to ``validate_fields``."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = path

    def fail(self, field: str, message: str) -> None:
        raise EditSpecError(message, path=self.path, field=field)

    def site_map(self, spec: Mapping[str, Any], field: str, layers: list[int]) -> dict[str, Any]:
        """A {site: value} object whose keys are exactly the edit's layers; keys normalised to strings."""
        raw = spec.get(field)
        if not isinstance(raw, Mapping):
            self.fail(field, f"must be an object keyed by site ({', '.join(map(str, layers))})")
        out: dict[str, Any] = {}
        for key, value in raw.items():
            try:
                site = int(str(key))
            except ValueError:
                self.fail(f"{field}.{key}", "keys must be site indices (integers)")
            if str(site) in out:
                self.fail(f"{field}.{key}", "site given twice")
            out[str(site)] = value
        missing = [s for s in layers if str(s) not in out]
        extra = sorted(int(k) for k in out if int(k) not in layers)
        if missing:
            self.fail(field, f"no entry for site(s) {missing} listed in 'layers'")
        if extra:
            self.fail(field, f"entries for site(s) {extra} that are not in 'layers' {layers}")
        return {str(s): out[str(s)] for s in layers}


def validate_spec(raw: Any, *, path: str | Path | None = None) -> dict[str, Any]:
    """Check a spec and return its normalised form (defaults filled, site keys as strings, layers sorted).

    Only the spec itself is checked here; files it names are checked by :func:`check_files`.
    """
    c = SpecChecker(path)
    if not isinstance(raw, Mapping):
        c.fail("(top level)", "an edit spec must be a JSON object")
    spec = copy.deepcopy(dict(raw))
    if spec.get("schema_version") != SCHEMA_VERSION:
        c.fail("schema_version", f"must be {SCHEMA_VERSION!r}, got {spec.get('schema_version')!r}")
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        c.fail("name", "must be a non-empty string")
    kind = spec.get("kind")
    kind_cls = edit_kind(kind)
    if kind_cls is None:
        c.fail("kind", f"must be one of the registered edit kinds {', '.join(edit_kinds())}, got {kind!r}")
    layers = spec.get("layers")
    if not isinstance(layers, list) or not layers:
        c.fail("layers", "must be a non-empty list of site indices")
    for s in layers:
        if not is_int(s) or s < 0:
            c.fail("layers", f"site indices must be integers >= 0, got {s!r}")
    if len(set(layers)) != len(layers):
        c.fail("layers", f"duplicate site in {layers}")
    layers = sorted(layers)
    spec["layers"] = layers
    if spec.get("positions") not in POSITIONS:
        c.fail("positions", f"must be one of {', '.join(POSITIONS)}, got {spec.get('positions')!r}")
    if not is_number(spec.get("strength")):
        c.fail("strength", f"must be a finite number, got {spec.get('strength')!r}")
    spec["strength"] = float(spec["strength"])
    acb = spec.setdefault("apply_to_closed_book", False)
    if not isinstance(acb, bool):
        c.fail("apply_to_closed_book", f"must be true or false, got {acb!r}")
    for other in edit_kinds():
        if other != kind:
            for key in edit_kind(other).own_fields:
                if key in spec:
                    c.fail(key, f"belongs to kind {other!r}, not {kind!r}")
    kind_cls.validate_fields(c, spec, layers)
    return spec


def resolve(base_dir: Path | None, rel: str) -> Path:
    p = Path(rel).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def check_files(spec: Mapping[str, Any], *, path: str | Path | None, base_dir: Path | None) -> None:
    """Check the files a (validated) spec names exist and fit, without loading a model (the kind's job)."""
    edit_kind(spec["kind"]).check_files(spec, path=path, base_dir=base_dir)


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read, validate and normalise a spec file (its named files checked too)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EditSpecError("no such edit spec file", path=p) from None
    except OSError as exc:
        raise EditSpecError(f"cannot read the edit spec: {exc}", path=p) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EditSpecError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", path=p) from None
    spec = validate_spec(raw, path=p)
    check_files(spec, path=p, base_dir=p.parent)
    return spec


def save_spec(path: str | Path, spec: Mapping[str, Any]) -> Path:
    """Validate and write a spec atomically (temporary file, fsync, rename). Returns the path."""
    p = Path(path)
    norm = validate_spec(spec, path=p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(norm, ensure_ascii=False, indent=1, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(p)
    return p
