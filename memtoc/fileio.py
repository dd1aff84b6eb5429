"""Small file helpers shared by the run store, the HDF5 store and the CLI: hashing and atomic writes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_json(obj: object) -> str:
    """Hash of a JSON-able object in canonical form (sorted keys), for config identity checks."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_json_atomic(path: str | Path, obj: object) -> None:
    """Write JSON through a temporary file, fsync and rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def write_records_csv_atomic(path: str | Path, records: "list[dict]") -> None:
    """Write flat dict records as CSV (columns in first-seen order, None as an empty cell) through a temporary
    file and a rename, so a reader never sees half a table."""
    import csv
    import io

    fields: list[str] = []
    for rec in records:
        fields += [k for k in rec if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for rec in records:
        w.writerow({k: ("" if v is None else v) for k, v in rec.items()})
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(path)
