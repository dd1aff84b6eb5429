"""``judge.jsonl``: one record per judge request, beside the run's ``episodes.jsonl``.

Written like the run store: one append per batch, flushed and fsynced; resuming cuts a torn last line and
skips finished requests by ``request_id``. Reading never writes: a torn last line is ignored. Every record
carries the judge's identity; a file never mixes two judges (the field that differs is named).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memtoc.core.errors import RunStoreError

JUDGE_FILE = "judge.jsonl"
#: identity fields whose difference makes two judge passes incomparable
IDENTITY_FIELDS = ("model", "weights_sha256", "backend", "dtype", "chat_template_sha256", "prompt_version",
                   "prompts_sha256", "max_new_tokens")


def read_judge_records(path: str | Path) -> dict[str, dict[str, Any]]:
    """request_id -> record. A torn last line (a kill mid-write) is ignored, not repaired: readers never write."""
    path = Path(path)
    if not path.exists():
        raise RunStoreError(f"{path}: no judge records; run `memtoc judge {path.parent} --judge-model M` first")
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        raw = raw[:raw.rfind(b"\n") + 1]
    out: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunStoreError(f"{path}, line {lineno}: corrupt judge record ({exc.msg})") from None
        if "request_id" not in rec:
            raise RunStoreError(f"{path}, line {lineno}: judge record without 'request_id'")
        out.setdefault(str(rec["request_id"]), rec)
    return out


def judge_identity_of(records: dict[str, dict[str, Any]], path: str | Path) -> dict[str, Any] | None:
    """The one judge identity of a file's records (None when empty); a file mixing judges is refused."""
    ident = None
    for rec in records.values():
        j = rec.get("judge") or {}
        if ident is None:
            ident = j
        elif j != ident:
            raise RunStoreError(f"{path}: judge records of two judges ({', '.join(identity_diff(ident, j))})")
    return ident


def identity_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_same_judge(a: dict[str, Any] | None, b: dict[str, Any] | None, *, what_a: str, what_b: str) -> None:
    """Refuse to compare layers judged by different judges, naming the fields that differ."""
    if a is None or b is None:
        return
    diff = identity_diff(a, b)
    if diff:
        raise RunStoreError(f"{what_a} and {what_b} were judged by different judges (field "
                            f"{', '.join(diff)}: {a.get(diff[0])!r} vs {b.get(diff[0])!r}); judge both with "
                            "the same --judge-model")
