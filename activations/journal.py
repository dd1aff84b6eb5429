"""The write-ahead journal of an activation store: immutable batch chunks plus an append-only journal.

HDF5 updated in place is not crash-safe, so while a job runs each committed batch is one immutable *chunk* file
in a sidecar directory next to the store (``acts.h5.journal/``), named by one line of ``journal.jsonl``:

1. the chunk is written to ``.cNNNNNN.tmp``, fsync'ed, renamed to ``cNNNNNN.chunk`` and the directory fsync'ed;
2. a JSON line ``{"chunk", "bytes", "sha256", "n_rows", "episode_ids"}`` is appended and fsync'ed: the commit.

The journal file and the writer's ``lock`` are :mod:`memtoc.core.durable`'s log and lock; what is specific
stays here: the entry format, and that an entry whose chunk is missing or has another size ends the valid
prefix. A kill before step 2 completes leaves at most an unreferenced chunk or a torn line, which readers
ignore and the next writer removes.

Chunk file format (``MTCHUNK1``): 8 magic bytes, an 8-byte little-endian header length, the UTF-8 JSON header
(episodes, index columns, and per site the offset/dtype/shape of its raw rows), zero padding to 64 bytes, then
the raw little-endian arrays. Nothing here imports ``h5py`` or ``torch``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from memtoc.core.durable import WriterLock, append_bytes, read_valid_prefix
from memtoc.core.fileio import fsync_dir, iter_siblings, pid_alive, write_bytes_atomic

from activations import ActivationStoreError

JOURNAL_FORMAT = "memtoc-activation-journal-v1"
CHUNK_MAGIC = b"MTCHUNK1"
_ALIGN = 64
HEADER = "header.json"
JOURNAL = "journal.jsonl"
LOCK = "lock"


# -- small durable-file helpers ----------------------------------------------------------------------------

def remove_tree(path: Path) -> None:
    """Remove a journal directory; the store's directory entry change is made durable."""
    shutil.rmtree(path, ignore_errors=True)
    fsync_dir(path.parent, strict=True)


# -- chunks ------------------------------------------------------------------------------------------------

def encode_chunk(episodes: Mapping[str, list], index: Mapping[str, list], acts: Mapping[int, np.ndarray]
                 ) -> tuple[list[Any], dict[str, Any]]:
    """The buffers of one chunk file (header first) and its header."""
    arrays = []
    offset = 0
    for site, arr in acts.items():
        arr = np.ascontiguousarray(arr)
        arrays.append({"site": int(site), "offset": offset, "dtype": arr.dtype.newbyteorder("<").str,
                       "shape": list(arr.shape)})
        offset += arr.nbytes
        offset += (-offset) % _ALIGN
    header = {"format": "MTCHUNK1", "episodes": episodes, "index": index, "arrays": arrays}
    raw = json.dumps(header, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    head_len = len(CHUNK_MAGIC) + 8 + len(raw)
    pad = (-head_len) % _ALIGN
    bufs: list[Any] = [CHUNK_MAGIC + struct.pack("<Q", len(raw) + pad) + raw + b" " * pad]
    pos = 0
    for spec, arr in zip(arrays, acts.values()):
        arr = np.ascontiguousarray(arr, dtype=np.dtype(spec["dtype"]))
        bufs.append(arr.reshape(-1).view(np.uint8))
        pos += arr.nbytes
        gap = (-pos) % _ALIGN
        if gap:
            bufs.append(b"\0" * gap)
            pos += gap
    return bufs, header


class Chunk:
    """Read view of one committed chunk file (arrays are memory-mapped, nothing is read until asked)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with path.open("rb") as fh:
                magic = fh.read(8)
                if magic != CHUNK_MAGIC:
                    raise ActivationStoreError(f"{path}: not an activation chunk file (bad magic)")
                (n,) = struct.unpack("<Q", fh.read(8))
                self.header = json.loads(fh.read(n).decode("ascii"))
        except (OSError, ValueError, struct.error) as exc:
            raise ActivationStoreError(f"cannot read activation chunk {path}: {exc}") from None
        self._data_offset = 16 + n
        self.arrays = {int(a["site"]): a for a in self.header["arrays"]}
        self.n_rows = len(self.header["index"].get("episode_id", []))
        self.n_episodes = len(self.header["episodes"]["episode_id"])

    def raw(self, site: int) -> np.ndarray:
        a = self.arrays[site]
        shape = tuple(a["shape"])
        if not shape[0]:
            return np.zeros(shape, dtype=np.dtype(a["dtype"]))
        return np.memmap(self.path, dtype=np.dtype(a["dtype"]), mode="r", offset=self._data_offset + a["offset"],
                         shape=shape)


# -- the journal directory ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """One committed batch: its chunk file, size, checksum, rows and episode ids."""

    chunk: str
    bytes: int
    sha256: str
    n_rows: int
    episode_ids: tuple[str, ...]


def journal_dir_for(store: Path) -> Path:
    return store.with_name(store.name + ".journal")


def write_header(jdir: Path, header: Mapping[str, Any]) -> None:
    """Write the journal's header atomically (temp -> fsync -> rename -> fsync of the directory); a failure is
    the ``OSError`` itself (the store words it)."""
    write_bytes_atomic(jdir / HEADER, json.dumps(header, ensure_ascii=False).encode("utf-8"), error=None,
                       strict=True)


def read_header(jdir: Path) -> dict[str, Any] | None:
    """The journal's header, or None when there is none (a directory made by a job killed before writing it)."""
    try:
        return json.loads((jdir / HEADER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ActivationStoreError(f"cannot read activation journal {jdir / HEADER}: {exc}") from None


def read_entries(jdir: Path, *, check_files: bool = True) -> tuple[list[Entry], int]:
    """Committed entries (a torn or unparsable tail is ignored) and the byte length of that valid prefix
    (:func:`memtoc.core.durable.read_valid_prefix`).

    With ``check_files`` an entry whose chunk file is missing or has another size ends the valid prefix
    (only a damaged disk or a hand edit can cause that: chunks are fsync'ed before their line is written).
    """
    def accept(rec: Any) -> Entry:
        entry = Entry(chunk=str(rec["chunk"]), bytes=int(rec["bytes"]), sha256=str(rec["sha256"]),
                      n_rows=int(rec["n_rows"]), episode_ids=tuple(str(e) for e in rec["episode_ids"]))
        if check_files:
            try:
                size = (jdir / entry.chunk).stat().st_size
            except OSError:
                size = None
            if size != entry.bytes:
                raise ValueError(f"{entry.chunk}: missing or not {entry.bytes} bytes")
        return entry

    res = read_valid_prefix(jdir / JOURNAL, accept, error=ActivationStoreError)
    return [entry for _, entry in res.records], res.complete_bytes


def entry_line(entry: Entry) -> bytes:
    return (json.dumps({"chunk": entry.chunk, "bytes": entry.bytes, "sha256": entry.sha256, "n_rows": entry.n_rows,
                        "episode_ids": list(entry.episode_ids)}, ensure_ascii=True, separators=(",", ":"))
            + "\n").encode("ascii")


def chunk_name(seq: int) -> str:
    return f"c{seq:06d}.chunk"


def iter_unreferenced(jdir: Path, entries: Sequence[Entry]) -> Iterator[Path]:
    """Files of the journal directory that no committed entry needs (temp files, chunks never journaled)."""
    keep = {e.chunk for e in entries} | {HEADER, JOURNAL, LOCK}
    for p in jdir.iterdir():
        if p.name not in keep:
            yield p


def lock_journal(jdir: Path, store: Path) -> WriterLock:
    """The exclusive lock (:class:`memtoc.core.durable.WriterLock` on ``<journal>/lock``) held while a writer has
    the store open; released when it is closed or dies. Not re-entrant: a second writer is refused, in this
    process too."""
    lock = WriterLock.acquire(
        jdir, LOCK, error=ActivationStoreError,
        busy=lambda info: (f"{store} is being written by another process (its journal {jdir} is locked); wait "
                           "for that job, or stop it"))
    assert lock is not None          # require_flock: a file system without flock refuses instead
    return lock


def unlock_journal(lock: WriterLock | None) -> None:
    if lock is not None:
        lock.release()


def append_entry(jdir: Path, entry: Entry, valid_len: int) -> int:
    """Commit one entry: write its line at the end of the valid prefix (overwriting any torn tail), cut what
    follows, fsync (:func:`memtoc.core.durable.append_bytes`; a failed write is undone and raised). Returns
    the new valid length."""
    return append_bytes(jdir / JOURNAL, entry_line(entry), at=valid_len)


def best_effort(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - cleanup after a failure must not hide the failure
        pass


def remove_stale_temps(out: Path) -> list[Path]:
    """Remove ``.<out>.merge-tmp-PID`` files/directories left by merges whose process is gone.

    A temp of a live process (another merge running now) is kept; one of this very process is a leftover of an
    earlier call that failed and is removed too.
    """
    removed = [p for p, pid in iter_siblings(out, "merge-tmp") if pid == os.getpid() or not pid_alive(pid)]
    for p in removed:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            best_effort(p.unlink)
    if removed:
        fsync_dir(out.parent, strict=True)
    return removed
