"""The run directory: ``run.json`` (provenance), ``closed_book.jsonl``, ``episodes.jsonl``, ``summary.json``.

Records are appended one batch per write, flushed and fsynced, so a killed process loses at most the batch
in flight. On reopening, a torn last line is cut off and finished records are skipped by key; a directory
made with different settings is refused rather than mixed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from memtoc.errors import RunStoreError
from memtoc.fileio import sha256_json, write_json_atomic

RUN_SCHEMA = "memtoc-run-v1"


class JsonlLog:
    """An append-only JSONL file of records with a unique key field."""

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        self.key = key
        self._records: dict[str, dict[str, Any]] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            # A write torn by a kill: drop the partial last line, keep everything before it.
            cut = raw.rfind(b"\n") + 1
            with self.path.open("r+b") as fh:
                fh.truncate(cut)
            raw = raw[:cut]
        for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunStoreError(f"{self.path}, line {lineno}: corrupt record ({exc.msg}); the file was not "
                                    "written by memtoc or was edited by hand") from None
            k = rec.get(self.key)
            if k is None:
                raise RunStoreError(f"{self.path}, line {lineno}: record without '{self.key}'")
            self._records.setdefault(str(k), rec)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._records.get(key)

    def records(self) -> list[dict[str, Any]]:
        return list(self._records.values())

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Append new records (keys already present are skipped) in one write; returns how many were written."""
        fresh = []
        for rec in records:
            k = str(rec[self.key])
            if k in self._records:
                continue
            self._records[k] = rec
            fresh.append(rec)
        if not fresh:
            return 0
        data = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in fresh)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return len(fresh)


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Read a JSONL file of records, naming the file and line of any bad record."""
    path = Path(path)
    if not path.exists():
        raise RunStoreError(f"{path}: file not found")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunStoreError(f"{path}, line {lineno}: invalid JSON ({exc.msg})") from None


def open_run_dir(root: str | Path, *, identity: dict[str, Any], run_info: dict[str, Any],
                 keep_existing: bool, kind: str = "") -> Path:
    """Create or reopen a run directory whose ``run.json`` records ``identity`` (and its hash).

    A directory holding a run of another identity is refused, naming the fields that differ. With
    ``keep_existing`` an existing ``run.json`` is left as it was written; otherwise it is rewritten.
    """
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunStoreError(f"cannot create run directory {root}: {exc}") from exc
    run_json = root / "run.json"
    identity_hash = sha256_json(identity)
    if run_json.exists():
        try:
            existing = json.loads(run_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunStoreError(f"{run_json}: corrupt ({exc.msg})") from None
        if existing.get("identity_sha256") != identity_hash:
            old = existing.get("identity", {})
            diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            what = f"a {kind} run" if kind else "a run"
            raise RunStoreError(
                f"{root} holds {what} made with different settings ({', '.join(diff) or 'unknown fields'}); "
                "use another --out directory, or delete this one to start over")
        if keep_existing:
            return root
    write_json_atomic(run_json, {**run_info, "identity": identity, "identity_sha256": identity_hash})
    return root


@dataclass
class RunStore:
    """One run directory. ``identity`` is the part of the config that decides what the records mean."""

    root: Path
    closed_book: JsonlLog
    episodes: JsonlLog

    @classmethod
    def open(cls, root: str | Path, *, identity: dict[str, Any], run_info: dict[str, Any]) -> "RunStore":
        root = open_run_dir(root, identity=identity,
                            run_info={"schema_version": RUN_SCHEMA, **run_info}, keep_existing=True)
        return cls(root=root, closed_book=JsonlLog(root / "closed_book.jsonl", "key"),
                   episodes=JsonlLog(root / "episodes.jsonl", "episode_id"))

    @classmethod
    def read(cls, root: str | Path) -> "RunStore":
        """Open an existing run for reading (reports, comparisons)."""
        root = Path(root)
        if not (root / "run.json").exists():
            raise RunStoreError(f"{root} is not a run directory (no run.json)")
        return cls(root=root, closed_book=JsonlLog(root / "closed_book.jsonl", "key"),
                   episodes=JsonlLog(root / "episodes.jsonl", "episode_id"))

    def run_info(self) -> dict[str, Any]:
        return json.loads((self.root / "run.json").read_text(encoding="utf-8"))

    def update_run_info(self, **fields: Any) -> None:
        info = self.run_info()
        info.update(fields)
        write_json_atomic(self.root / "run.json", info)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.root / "summary.json", summary)
