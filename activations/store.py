"""The activation store: HDF5 schema, a crash-safe resumable writer, and a lazy read-only reader.

Layout of the store file users open (documented in ``docs/activations.md``)::

    /                         attrs: schema, identity (JSON) + identity_sha256, provenance attrs,
                                     n_rows, n_episodes, complete, sites, d_model, storage_dtype, encoding,
                                     journal_id (the journal it was consolidated from)
    /acts/site_SSS            [n_rows, d_model] one dataset per site, chunked as (rows, d_model) blocks so
                              that reading all rows of one layer is a sequential read
    /index/<column>           [n_rows] one 1-D dataset per numeric / enum column (enum: fixed-width UTF-8);
    /index/<column>/{data,ends}   text columns: UTF-8 bytes and the end offset of each row
    /episodes/<column>        [n_episodes] committed episodes in commit order with their row range

Crash safety: an HDF5 file is never updated in place. Batches are committed to the journal
(``activations.journal``); a finished job consolidates store file and journal into a new HDF5 file (temporary
name, fsync, rename) before the journal is removed. A kill loses at most the batch in flight, and the store file
is always a whole file of some finished job. The reader shows it plus the journal's committed batches.
"""

from __future__ import annotations

import errno
import io
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import h5py
import numpy as np

from activations import ActivationStoreError
from activations import journal as jr
from memtoc.core import durable
from memtoc.core.durable import WriterLock
from memtoc.core.fileio import fsync_dir, sha256_file, sha256_json

SCHEMA_VERSION = "memtoc-activations-v1"

# Index columns: name -> kind. "text" = UTF-8 strings stored as a byte blob plus end offsets (append-only, no
# HDF5 variable-length heap, which a killed writer can corrupt); "enum" = short UTF-8 strings in fixed-width
# byte fields (rewritable in place); numeric kinds are numpy dtypes. ``row`` is implicit (0..n_rows-1).
INDEX_COLUMNS: dict[str, str] = {
    "episode_id": "text", "question_id": "text", "condition": "enum", "arm": "enum", "formulation": "enum",
    "position_kind": "enum", "token_index": "int32", "token_id": "int32", "token_str": "text",
    # behaviour labels joined from an evaluation run (``--run``); -1 / "" when missing
    "followed_tool": "int8", "kept_memory": "int8", "outcome": "enum", "cell": "enum",
}
LABEL_COLUMNS = ("followed_tool", "kept_memory", "outcome", "cell")
EPISODE_COLUMNS: dict[str, str] = {"episode_id": "text", "row_start": "int64", "row_stop": "int64",
                                   "n_prompt_tokens": "int32", "n_generated_tokens": "int32"}
# storage dtype -> (HDF5 dtype, encoding attribute)
STORAGE = {"float32": ("<f4", "float32"), "float16": ("<f2", "float16"), "bfloat16": ("<u2", "bfloat16-as-uint16")}
ENUM_WIDTH = 48
_CHUNK_BYTES = 1 << 18
_INDEX_CHUNK = 4096
_BLOB_CHUNK = 1 << 16


def site_name(site: int) -> str:
    return f"site_{int(site):03d}"


def missing_value(column: str) -> Any:
    return "" if INDEX_COLUMNS.get(column, EPISODE_COLUMNS.get(column)) in ("text", "enum") else -1


# -- columns: numeric / enum datasets, text blobs -------------------------------------------------------------

def _create_column(g: h5py.Group, name: str, kind: str, filt: Mapping[str, Any]) -> None:
    if kind == "text":
        sub = g.create_group(name)
        sub.attrs["kind"] = "utf8-blob"
        sub.create_dataset("ends", shape=(0,), maxshape=(None,), dtype="<i8", chunks=(_INDEX_CHUNK,), **filt)
        sub.create_dataset("data", shape=(0,), maxshape=(None,), dtype="u1", chunks=(_BLOB_CHUNK,), **filt)
        return
    dtype = f"S{ENUM_WIDTH}" if kind == "enum" else kind
    ds = g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(_INDEX_CHUNK,), **filt)
    if kind == "enum":
        ds.attrs["kind"] = "utf8-fixed"


@dataclass(frozen=True)
class _Text:
    """A text column's two datasets (looked up once: h5py group access is slow)."""

    ends: h5py.Dataset
    data: h5py.Dataset


def _col(obj: Any) -> Any:
    return _Text(obj["ends"], obj["data"]) if isinstance(obj, h5py.Group) else obj


def _column_len(obj: Any) -> int:
    """Rows a column fully holds (a text column whose bytes were torn holds fewer than its offsets say)."""
    obj = _col(obj)
    if isinstance(obj, h5py.Dataset):
        return int(obj.shape[0])
    ends, n_bytes = obj.ends, int(obj.data.shape[0])
    n = int(ends.shape[0])
    if n and int(ends[n - 1]) > n_bytes:
        n = int(np.searchsorted(ends[:n], n_bytes, side="right"))
    return n


def _encode_enum(values: Sequence[Any], column: str) -> np.ndarray:
    raw = [_safe_text(v).encode("utf-8") for v in values]
    for r in raw:
        if len(r) > ENUM_WIDTH:
            raise ActivationStoreError(f"value {r[:60]!r}... of column {column!r} is longer than {ENUM_WIDTH} bytes")
    return np.asarray(raw, dtype=f"S{ENUM_WIDTH}")


def _write_column(obj: Any, kind: str, column: str, values: Sequence[Any], n0: int) -> None:
    """Write rows ``n0 .. n0 + len(values)`` of a column (the column holds exactly ``n0`` rows before)."""
    n1 = n0 + len(values)
    obj = _col(obj)
    if kind == "text":
        enc = [_safe_text(v).encode("utf-8") for v in values]
        base = int(obj.ends[n0 - 1]) if n0 else 0
        ends = base + np.cumsum([len(e) for e in enc], dtype=np.int64)
        blob = np.frombuffer(b"".join(enc), dtype=np.uint8)
        obj.data.resize(base + blob.size, axis=0)
        _put(obj.data, base, blob)
        obj.ends.resize(n1, axis=0)
        _put(obj.ends, n0, ends)
        return
    data = _encode_enum(values, column) if kind == "enum" else np.asarray(values, dtype=kind)
    obj.resize(n1, axis=0)
    _put(obj, n0, data)


def _put(ds: h5py.Dataset, start: int, data: np.ndarray) -> None:
    """``ds[start:start + len(data)] = data`` without h5py's broadcasting machinery (dtype already matches)."""
    if data.shape[0]:
        data = np.ascontiguousarray(data, dtype=ds.dtype)
        fspace = ds.id.get_space()
        fspace.select_hyperslab((start,) + (0,) * (data.ndim - 1), data.shape)
        ds.id.write(h5py.h5s.create_simple(data.shape), fspace, data)


def _read_column(obj: Any, n: int) -> np.ndarray:
    """The first ``n`` rows of a column; strings as an object array of ``str``."""
    obj = _col(obj)
    if isinstance(obj, h5py.Dataset):
        if obj.dtype.kind == "S":
            raw = obj[:n] if n else np.zeros(0, dtype=obj.dtype)
            return np.asarray([b.decode("utf-8") for b in raw.tolist()], dtype=object)
        return obj[:n] if n else np.zeros(0, dtype=obj.dtype)
    if not n:
        return np.zeros(0, dtype=object)
    ends = obj.ends[:n]
    data = obj.data[: int(ends[-1])].tobytes()
    starts = np.concatenate([[0], ends[:-1]])
    return np.asarray([data[a:b].decode("utf-8") for a, b in zip(starts.tolist(), ends.tolist())], dtype=object)


# -- encoding ---------------------------------------------------------------------------------------------

def encode_activations(values: Any, storage_dtype: str) -> np.ndarray:
    """A ``[n, d]`` torch tensor or array -> the stored representation (bfloat16 as its raw uint16 bits)."""
    import torch

    if storage_dtype not in STORAGE:
        raise ActivationStoreError(f"unknown storage dtype {storage_dtype!r}; choose from {', '.join(STORAGE)}")
    t = values if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
    t = t.detach().to("cpu")
    if storage_dtype == "bfloat16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    if storage_dtype == "float16":
        return t.to(torch.float16).contiguous().numpy()
    return t.to(torch.float32).contiguous().numpy()


def decode_activations(raw: np.ndarray, encoding: str) -> np.ndarray:
    """Stored rows -> float32 (exact for every storage dtype)."""
    if encoding == "bfloat16-as-uint16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


# -- shared helpers ---------------------------------------------------------------------------------------

# Errors h5py raises for a failed write: OSError from the library, RuntimeError from a failed flush/close
# (``Unable to synchronously flush file ... errno = 28``), ValueError for some broken-file states.
_WRITE_ERRORS = (OSError, RuntimeError, ValueError)


def _open_h5(path: Path, mode: str, **kwargs: Any) -> h5py.File:
    try:
        return h5py.File(path, mode, **kwargs)
    except FileNotFoundError:
        raise ActivationStoreError(f"{path}: no such activation store") from None
    except OSError as exc:
        msg = str(exc)
        low = msg.lower()
        hint = ""
        if "truncated file" in low or "addr overflow" in low or "bad object header" in low or "eof" in low:
            hint = (" (the file is truncated or corrupt: it was not written completely, e.g. copied while being "
                    "written or cut by a full disk; re-create it with the job that made it)")
        elif "unable to lock file" in low or "errno = 11" in low:
            hint = " (another process has it open for writing?)"
        elif "signature" in low or "not an hdf5" in low:
            hint = " (not an HDF5 file)"
        raise ActivationStoreError(f"cannot open activation store {path} ({'read' if mode == 'r' else 'write'}): "
                                   f"{msg}{hint}") from None


def _attr_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _check_schema(f: h5py.File, path: Path) -> None:
    schema = f.attrs.get("schema")
    if schema is None or _attr_text(schema) != SCHEMA_VERSION:
        raise ActivationStoreError(f"{path} is not a memtoc activation store (schema {schema!r}, expected "
                                   f"{SCHEMA_VERSION!r})")


def _committed_extent(f: h5py.File) -> tuple[int, int]:
    """``(n_rows, n_episodes)`` of the last commit that every dataset fully holds (a store written in place
    may hold a batch torn beyond its commit marker: trailing episodes are dropped until every dataset holds
    their rows)."""
    n_rows = int(f.attrs.get("n_rows", 0))
    n_eps = int(f.attrs.get("n_episodes", 0))
    eps = f["episodes"]
    n_eps = min([n_eps] + [_column_len(eps[c]) for c in EPISODE_COLUMNS])
    row_lens = [f["acts"][k].shape[0] for k in f["acts"]] + [_column_len(f["index"][k]) for k in f["index"]]
    limit = min([n_rows] + row_lens)
    if n_eps:
        stops = eps["row_stop"][:n_eps]
        while n_eps and int(stops[n_eps - 1]) > limit:
            n_eps -= 1
    n_rows = int(eps["row_stop"][n_eps - 1]) if n_eps else 0
    return n_rows, n_eps


def _decode_attrs(items: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Root attributes as Python values (JSON-valued ones, listed in ``json_attrs``, decoded)."""
    items = list(items)
    raw_keys = dict(items).get("json_attrs", "[]")
    json_keys = set(json.loads(_attr_text(raw_keys)))
    out: dict[str, Any] = {}
    for key, value in items:
        if key == "json_attrs":
            continue
        if isinstance(value, (bytes, str)):
            value = _attr_text(value)
            if key in json_keys:
                value = json.loads(value)
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out


def _root_attrs(identity: Mapping[str, Any], provenance: Mapping[str, Any], *, sites: Sequence[int], d_model: int,
                storage_dtype: str, compression: str | None) -> dict[str, Any]:
    """The root attributes of a new store, as JSON-able values (``sites`` becomes an int32 array on disk)."""
    json_keys = []
    attrs: dict[str, Any] = {}
    for key, value in provenance.items():
        if isinstance(value, (str, int, float, bool)) and not isinstance(value, np.generic):
            attrs[key] = value
        else:
            attrs[key] = json.dumps(value, ensure_ascii=False, sort_keys=True)
            json_keys.append(key)
    attrs.update({
        "schema": SCHEMA_VERSION, "identity": json.dumps(identity, ensure_ascii=False, sort_keys=True),
        "identity_sha256": sha256_json(identity), "sites": [int(s) for s in sites],
        "d_model": int(d_model), "storage_dtype": storage_dtype, "encoding": STORAGE[storage_dtype][1],
        "compression": compression or "none", "n_rows": 0, "n_episodes": 0, "complete": False,
        "json_attrs": json.dumps(json_keys + ["identity"]),
    })
    return attrs


def _identity_refusal(path: Path, old: Mapping[str, Any], new: Mapping[str, Any], where: str) -> ActivationStoreError:
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ActivationStoreError(
        f"{path} holds activations made with different settings ({', '.join(diff) or 'unknown'}: "
        + "; ".join(f"{k} {old.get(k)!r} here vs {new.get(k)!r} now" for k in diff[:3])
        + f"); use another --out file, or delete {where} to start over")


def _write_failure(exc: BaseException) -> str:
    reason = _os_reason(exc)
    return reason if isinstance(exc, OSError) or "no space" in reason or "writable" in reason \
        else f"{type(exc).__name__}: {reason}"


# -- segments: the base HDF5 file and the journal's chunks, read the same way ------------------------------

class _H5Segment:
    """Committed rows of an HDF5 store file."""

    def __init__(self, f: h5py.File) -> None:
        self.f = f
        self.n_rows, self.n_episodes = _committed_extent(f)

    def raw(self, site: int) -> h5py.Dataset:
        return self.f["acts"][site_name(site)]

    def index_column(self, name: str) -> np.ndarray | None:
        g = self.f["index"]
        return _read_column(g[name], self.n_rows) if name in g else None

    def episode_column(self, name: str) -> np.ndarray:
        return _read_column(self.f["episodes"][name], self.n_episodes)


class _ChunkSegment:
    """One committed batch of the journal."""

    def __init__(self, chunk: jr.Chunk) -> None:
        self.chunk = chunk
        self.n_rows, self.n_episodes = chunk.n_rows, chunk.n_episodes

    def raw(self, site: int) -> np.ndarray:
        return self.chunk.raw(site)

    def index_column(self, name: str) -> np.ndarray | None:
        values = self.chunk.header["index"].get(name)
        return None if values is None else _column_array(INDEX_COLUMNS.get(name, "text"), values)

    def episode_column(self, name: str) -> np.ndarray:
        return _column_array(EPISODE_COLUMNS[name], self.chunk.header["episodes"][name])


def _column_array(kind: str, values: Sequence[Any]) -> np.ndarray:
    if kind in ("text", "enum"):
        return np.asarray(list(values), dtype=object) if values else np.zeros(0, dtype=object)
    return np.asarray(values, dtype=kind)


def _index_values(segments: Sequence[Any], name: str) -> np.ndarray:
    """Index column ``name`` over every segment (its missing value where a segment lacks the column)."""
    cols = [seg.index_column(name) for seg in segments]
    return _concat([_column_array(INDEX_COLUMNS.get(name, "text"), [missing_value(name)] * seg.n_rows)
                    if col is None else col for seg, col in zip(segments, cols)])


def _concat(parts: Sequence[np.ndarray], dtype: Any = None) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype or object)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts)


def _read_rows(src: Any, uniq: np.ndarray, n: int, d: int) -> np.ndarray:
    """Sorted unique rows of one segment's site (HDF5: chunk-sized contiguous blocks; chunks: memory map)."""
    if not isinstance(src, h5py.Dataset):
        return np.asarray(src[uniq])
    out = np.empty((uniq.size, d), dtype=src.dtype)
    block = max(int(src.chunks[0]) if src.chunks else 1024, 1)
    starts = (uniq // block) * block
    pos = 0
    for b in np.unique(starts):
        sel = uniq[starts == b]
        data = src[int(b):int(min(b + block, n))]
        out[pos:pos + sel.size] = data[sel - b]
        pos += sel.size
    return out


# -- consolidation: base file + journal -> one new HDF5 file ------------------------------------------------

class _GuardedFile(io.RawIOBase):
    """The file HDF5 writes the store into, through h5py's file-object driver. A failed write is recorded in
    ``error``, never reported to HDF5 (h5py would turn it into an ignored message and silently missing data);
    the writer checks ``error`` after closing and discards the file.
    """

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pos = 0
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self.pos = offset
        elif whence == 1:
            self.pos += offset
        else:
            self.pos = os.fstat(self.fd).st_size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf: Any) -> int:
        data = os.pread(self.fd, len(buf), self.pos)
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def write(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        n = len(view)
        if self.error is None:
            try:
                done = 0
                while done < n:
                    done += os.pwrite(self.fd, view[done:], self.pos + done)
            except OSError as exc:
                self.error = exc
        self.pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self.error = exc
        return size

    def flush(self) -> None:
        pass

    def sync_and_close(self) -> None:
        """fsync (raising the first recorded write error, if any) and close the descriptor."""
        try:
            if self.error is not None:
                raise self.error
            os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        super().close()


def _write_store_file(tmp: Path, *, sites: Sequence[int], segments: Sequence[Any], **body: Any) -> None:
    """Write a whole store file in one pass through :class:`_GuardedFile` (``body``: the settings of
    :func:`_write_store_body`), fsync it, and check it by reading it back (the caller renames it)."""
    guard = _GuardedFile(tmp)
    try:
        with h5py.File(guard, "w") as f:
            expected = _write_store_body(f, sites=sites, segments=segments, **body)
        guard.sync_and_close()
    finally:
        guard.close()
    n_rows = sum(seg.n_rows for seg in segments)
    with h5py.File(tmp, "r") as f:
        for s in sites:
            ds = f["acts"][site_name(s)]
            if ds.shape[0] != n_rows:
                raise OSError(f"{tmp}: site {s} holds {ds.shape[0]} rows after writing {n_rows}")
            pos = 0
            for seg in segments:
                src = seg.raw(s)
                for a in range(0, seg.n_rows, 1 << 14):
                    b = min(a + (1 << 14), seg.n_rows)
                    if not np.array_equal(ds[pos + a:pos + b], np.asarray(src[a:b])):
                        raise OSError(f"{tmp}: site {s} rows {pos + a}..{pos + b} read back differently than "
                                      "written (a write failed silently)")
                pos += seg.n_rows
        for group, cols in expected.items():
            for name, values in cols.items():
                got = _read_column(f[group][name], len(values))
                if _column_len(f[group][name]) != len(values) or not np.array_equal(got, values):
                    raise OSError(f"{tmp}: column {group}/{name} read back differently than written (a write "
                                  "failed silently)")


def _write_store_body(f: h5py.File, *, attrs: Mapping[str, Any], sites: Sequence[int], d_model: int,
                      storage_dtype: str, compression: str | None, compression_opts: int | None,
                      segments: Sequence[Any], labels: Mapping[str, Mapping[str, Any]] | None,
                      chunk_rows: int | None = None) -> dict[str, dict[str, np.ndarray]]:
    h5_dtype, encoding = STORAGE[storage_dtype]
    itemsize = np.dtype(h5_dtype).itemsize
    default_rows = int(max(1, min(1 << 16, _CHUNK_BYTES // (int(d_model) * itemsize))))
    chunk_rows = int(chunk_rows or default_rows)
    filt: dict[str, Any] = {}
    if compression:
        filt = {"compression": compression, "shuffle": True}
        if compression == "gzip":
            filt["compression_opts"] = 4 if compression_opts is None else int(compression_opts)
    n_rows = sum(s.n_rows for s in segments)
    expected: dict[str, dict[str, np.ndarray]] = {"index": {}, "episodes": {}}
    for key, value in attrs.items():
        f.attrs[key] = np.asarray(value, dtype=np.int32) if key == "sites" else value
    acts = f.create_group("acts")
    step = chunk_rows * max(1, default_rows * 16 // chunk_rows)      # copy about 16 default chunks at a time
    for s in sites:
        ds = acts.create_dataset(site_name(s), shape=(n_rows, int(d_model)), maxshape=(None, int(d_model)),
                                 dtype=h5_dtype, chunks=(chunk_rows, int(d_model)), **filt)
        ds.attrs["site"] = int(s)
        ds.attrs["source"] = ("embedding output (residual stream entering block 0)" if s == 0
                              else f"output of block {int(s) - 1} (residual stream, pre final norm)")
        ds.attrs["encoding"] = encoding
        pos = 0
        for seg in segments:
            src = seg.raw(s)
            for a in range(0, seg.n_rows, step):
                b = min(a + step, seg.n_rows)
                _put(ds, pos + a, np.asarray(src[a:b]))
            pos += seg.n_rows
    col_filt = {"compression": "gzip"} if compression else {}
    g = f.create_group("index")
    episode_ids = None
    for name, kind in INDEX_COLUMNS.items():
        values = _index_values(segments, name)
        if name == "episode_id":
            episode_ids = values
        if labels is not None and name in LABEL_COLUMNS:
            values = [label_cell(name, labels.get(str(e), {}).get(name)) for e in episode_ids]
        _create_column(g, name, kind, col_filt)
        _write_column(g[name], kind, name, values, 0)
        expected["index"][name] = _expected(kind, values)
    g = f.create_group("episodes")
    for name, kind in EPISODE_COLUMNS.items():
        values = _concat([seg.episode_column(name) for seg in segments])
        _create_column(g, name, kind, col_filt)
        _write_column(g[name], kind, name, values, 0)
        expected["episodes"][name] = _expected(kind, values)
    return expected


def _expected(kind: str, values: Sequence[Any]) -> np.ndarray:
    """What a column reads back as after ``_write_column``."""
    if kind in ("text", "enum"):
        return np.asarray([_safe_text(v) for v in values], dtype=object) if len(values) else np.zeros(0, object)
    return np.asarray(values, dtype=kind)


# -- writer -----------------------------------------------------------------------------------------------

@dataclass
class RowBlock:
    """One batch of rows to append: contiguous rows per episode, in episode order."""

    episodes: list[dict[str, Any]]              # per episode: episode_id, n_rows, n_prompt_tokens, n_generated_tokens
    index: dict[str, Sequence[Any]]             # index column -> per-row values (label columns optional)
    acts: dict[int, Any]                        # site -> [n_rows, d] tensor/array in any float dtype
    n_rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.n_rows = int(sum(int(e["n_rows"]) for e in self.episodes))
        for name, values in self.index.items():
            if len(values) != self.n_rows:
                raise ActivationStoreError(f"index column {name!r} has {len(values)} values for {self.n_rows} rows")
        for site, values in self.acts.items():
            if int(values.shape[0]) != self.n_rows:
                raise ActivationStoreError(f"site {site} has {values.shape[0]} rows, expected {self.n_rows}")


def _writable(path: Path) -> bool:
    """Whether an existing store file may be replaced (a read-only file is a user's 'do not touch')."""
    return os.access(path, os.W_OK)


def _base_ref(attrs: Mapping[str, Any] | None, extent: tuple[int, int]) -> dict[str, Any] | None:
    """What a journal records about the store file it extends (so a journal never lands on another file)."""
    if attrs is None:
        return None
    jid = attrs.get("journal_id")
    return {"journal_id": None if jid is None else _attr_text(jid), "n_rows": int(extent[0]),
            "n_episodes": int(extent[1]), "identity_sha256": _attr_text(attrs.get("identity_sha256", ""))}


class ActivationWriter:
    """Appends batches to a store's journal, one durable commit per batch; ``finish`` consolidates them into the
    store file, ``close`` without it keeps the journal for the next writer to resume."""

    def __init__(self, path: Path, *, jdir: Path, header: Mapping[str, Any], base_path: Path | None,
                 base_extent: tuple[int, int], base_ids: Sequence[str], entries: list[jr.Entry], valid_len: int,
                 lock: WriterLock | None) -> None:
        self.path = path
        self.journal_dir = jdir
        self._header = dict(header)
        self._base_path = base_path
        self._entries = entries
        self._valid_len = valid_len
        self._lock = lock
        self._labels: tuple[dict[str, Any], dict[str, Any] | None] | None = None
        self._finished = False
        self.sites = [int(s) for s in header["sites"]]
        self.storage_dtype = str(header["storage_dtype"])
        self.d_model = int(header["d_model"])
        self.n_rows = base_extent[0] + sum(e.n_rows for e in entries)
        self.n_episodes = base_extent[1] + sum(len(e.episode_ids) for e in entries)
        self.done: set[str] = set(base_ids) | {i for e in entries for i in e.episode_ids}

    # .. opening ..
    @classmethod
    def open(cls, path: str | Path, *, identity: Mapping[str, Any], provenance: Mapping[str, Any],
             sites: Sequence[int], d_model: int, storage_dtype: str, compression: str | None = None,
             compression_opts: int | None = None, replace: bool = False,
             journal_dir: str | Path | None = None, chunk_rows: int | None = None) -> "ActivationWriter":
        """Create the store, or resume/extend one made with the same ``identity`` (anything else is refused).

        ``replace``: ignore an existing store file; it stays in place until ``finish`` renames the new one over
        it (atomic overwrite). ``journal_dir``: where the batches go (default ``<store>.journal``). ``chunk_rows``:
        rows per HDF5 chunk of each site's dataset (default about 256 KiB per chunk; an extended store keeps its own).
        """
        path = Path(path)
        if storage_dtype not in STORAGE:
            raise ActivationStoreError(f"unknown storage dtype {storage_dtype!r}; choose from {', '.join(STORAGE)}")
        if compression not in (None, "gzip", "lzf"):
            raise ActivationStoreError(f"unknown compression {compression!r}; choose gzip, lzf or none")
        if chunk_rows is not None and (type(chunk_rows) is not int or chunk_rows < 1):
            raise ActivationStoreError(f"chunk_rows must be a whole number of at least 1, got {chunk_rows!r}")
        identity = json.loads(json.dumps(dict(identity), ensure_ascii=False, sort_keys=True))
        id_sha = sha256_json(identity)
        jdir = Path(journal_dir) if journal_dir is not None else jr.journal_dir_for(path)
        base_attrs: dict[str, Any] | None = None
        base_extent, base_ids = (0, 0), []
        if not replace and path.exists():
            with _open_h5(path, "r") as f:
                _check_schema(f, path)
                base_attrs = dict(f.attrs.items())
                if _attr_text(base_attrs.get("identity_sha256", "")) != id_sha:
                    raise _identity_refusal(path, json.loads(_attr_text(base_attrs["identity"])), identity,
                                            "this one")
                seg = _H5Segment(f)
                base_extent = (seg.n_rows, seg.n_episodes)
                base_ids = [str(e) for e in seg.episode_column("episode_id").tolist()]
                first = next(iter(f["acts"].values()), None)
                if first is not None and first.compression == "gzip":
                    compression_opts = first.compression_opts       # the new file keeps the store's filters
                if first is not None and first.chunks and chunk_rows is None:
                    chunk_rows = int(first.chunks[0])                # ... and its chunking unless told otherwise
            if not _writable(path):
                raise ActivationStoreError(f"cannot open activation store {path} (write): not writable "
                                           "(read-only file); copy it, or make it writable")
        base = _base_ref(base_attrs, base_extent)
        lock = None
        try:
            header = None
            if jdir.is_dir():
                lock = jr.lock_journal(jdir, path)
                header = None if replace else jr.read_header(jdir)
                if header is not None and base is not None and header.get("journal_id") == base["journal_id"]:
                    header = None                   # consolidated already; the job died before removing it
                elif header is not None and header.get("base") != base:
                    raise ActivationStoreError(
                        f"{jdir} holds batches of a job that extended another version of {path} (the store file "
                        f"was replaced or deleted since); delete {jdir} (its batches are lost) and re-run")
                elif header is not None and header.get("identity_sha256") != id_sha:
                    raise _identity_refusal(path, header.get("identity") or {}, identity,
                                            f"{jdir}" + (" and this one" if base is not None else ""))
                if header is None:
                    jr.unlock_journal(lock)
                    lock = None
                    jr.remove_tree(jdir)
            if header is None:
                attrs = (_decode_attrs(base_attrs.items()) if base_attrs is not None else
                         _root_attrs(identity, provenance, sites=sites, d_model=d_model, storage_dtype=storage_dtype,
                                     compression=compression))
                header = {"format": jr.JOURNAL_FORMAT, "journal_id": uuid.uuid4().hex, "store": path.name,
                          "replace": bool(replace), "base": base, "identity": identity, "identity_sha256": id_sha,
                          "sites": [int(s) for s in (attrs["sites"])], "d_model": int(attrs["d_model"]),
                          "storage_dtype": str(attrs["storage_dtype"]),
                          "compression": None if attrs.get("compression") in (None, "none") else attrs["compression"],
                          "compression_opts": compression_opts, "chunk_rows": chunk_rows,
                          "root_attrs": None if base_attrs is not None else attrs}
                _mkdir(jdir)
                lock = jr.lock_journal(jdir, path)
                jr.write_header(jdir, header)
                fsync_dir(jdir.parent, strict=True)
                entries, valid_len = [], 0
            else:
                entries, valid_len = jr.read_entries(jdir)
                for p in jr.iter_unreferenced(jdir, entries):    # temp files and chunks of an uncommitted batch
                    p.unlink()
        except ActivationStoreError:
            jr.unlock_journal(lock)
            raise
        except OSError as exc:
            jr.unlock_journal(lock)
            what = "create" if base is None else "open"
            raise ActivationStoreError(f"cannot {what} activation store {path} (write; journal {jdir}): "
                                       f"{_os_reason(exc)}") from None
        return cls(path, jdir=jdir, header=header, base_path=None if base is None else path, base_extent=base_extent,
                   base_ids=base_ids, entries=entries, valid_len=valid_len, lock=lock)

    # .. writing ..
    def append(self, block: RowBlock) -> None:
        """Write one batch as a chunk file and commit it with one journal line (see ``activations.journal``)."""
        if self._finished:
            raise ActivationStoreError(f"{self.path}: the writer was finished; open a new one to extend the store")
        new_ids = [str(e["episode_id"]) for e in block.episodes]
        dup = [e for e in new_ids if e in self.done]
        if dup or len(set(new_ids)) != len(new_ids):
            raise ActivationStoreError(f"{self.path}: episode {(dup or new_ids)[0]!r} is already stored")
        if set(block.acts) != set(self.sites):
            raise ActivationStoreError(f"batch has sites {sorted(block.acts)}, the store holds {self.sites}")
        n0 = self.n_rows
        acts = {}
        for site in self.sites:
            data = encode_activations(block.acts[site], self.storage_dtype)
            if data.ndim != 2 or data.shape[1] != self.d_model:
                raise ActivationStoreError(f"site {site}: rows of width {data.shape[-1]}, store has "
                                           f"d_model={self.d_model}")
            acts[site] = data
        index: dict[str, list] = {}
        for name, kind in INDEX_COLUMNS.items():
            values = block.index.get(name)
            if values is None:
                values = [missing_value(name)] * block.n_rows
            if kind == "enum":
                _encode_enum(values, name)                          # refuse over-long values now, not at the end
            index[name] = ([_safe_text(v) for v in values] if kind in ("text", "enum")
                           else np.asarray(values, dtype=kind).tolist())
        sizes = [int(e["n_rows"]) for e in block.episodes]
        starts = (np.cumsum([0] + sizes)[:-1] + n0).tolist()
        episodes = {"episode_id": [_safe_text(e) for e in new_ids], "row_start": starts,
                    "row_stop": [a + k for a, k in zip(starts, sizes)],
                    "n_prompt_tokens": [int(e.get("n_prompt_tokens", -1)) for e in block.episodes],
                    "n_generated_tokens": [int(e.get("n_generated_tokens", 0)) for e in block.episodes]}
        bufs, _ = jr.encode_chunk(episodes, index, acts)
        name = jr.chunk_name(len(self._entries) + 1)
        final = self.journal_dir / name
        tmp = self.journal_dir / f".{name}.tmp"
        try:
            entry = _write_chunk(tmp, final, bufs, n_rows=block.n_rows, episode_ids=new_ids)
            self._valid_len = jr.append_entry(self.journal_dir, entry, self._valid_len)
        except BaseException as exc:
            jr.best_effort(lambda: tmp.unlink(missing_ok=True))
            jr.best_effort(lambda: final.unlink(missing_ok=True))
            jr.best_effort(lambda: os.truncate(self.journal_dir / jr.JOURNAL, self._valid_len))
            if isinstance(exc, _WRITE_ERRORS):
                raise ActivationStoreError(f"cannot write to {self.path} (batch file {final}): "
                                           f"{_write_failure(exc)}; the store keeps its {self.n_episodes} "
                                           f"committed episodes ({self.n_rows} rows) and the next run resumes "
                                           "there") from None
            raise
        self._entries.append(entry)
        self.n_rows += block.n_rows
        self.n_episodes += len(new_ids)
        self.done.update(new_ids)

    def write_labels(self, labels: Mapping[str, Mapping[str, Any]], *, source: Mapping[str, Any] | None = None) -> int:
        """(Re)write the behaviour-label columns of every committed row from ``episode_id -> labels``.

        Applied when ``finish`` writes the store file. Returns how many committed episodes found labels.
        """
        self._labels = ({str(k): dict(v) for k, v in labels.items()}, None if source is None else dict(source))
        return sum(1 for e in self.done if e in labels)

    def finish(self, *, planned: Iterable[str], extra_attrs: Mapping[str, Any] | None = None) -> bool:
        """Mark the store complete iff every planned episode is committed; returns that flag.

        Writes the store file (base + journal) to a temporary file, fsyncs it, renames it over the store and
        removes the journal. A failure leaves the old store file and the journal as they were.
        """
        planned = sorted(set(planned))
        complete = all(e in self.done for e in planned)
        update = {"complete": bool(complete), "n_planned": len(planned), "planned_sha256": sha256_json(planned)}
        update.update(extra_attrs or {})
        tmp = self.journal_dir / "consolidated.h5.tmp"
        base_f = None
        try:
            segments: list[Any] = []
            if self._base_path is not None:
                base_f = _open_h5(self._base_path, "r")
                raw_attrs = dict(base_f.attrs.items())
                segments.append(_H5Segment(base_f))
            else:
                raw_attrs = dict(self._header["root_attrs"])
            for e in self._entries:
                p = self.journal_dir / e.chunk
                if sha256_file(p) != e.sha256:
                    raise ActivationStoreError(f"{p}: checksum differs from its journal entry (the disk changed "
                                               f"a committed batch); delete {self.journal_dir} and re-run")
                segments.append(_ChunkSegment(jr.Chunk(p)))
            attrs = dict(raw_attrs)
            attrs.update(update)
            attrs.update({"n_rows": self.n_rows, "n_episodes": self.n_episodes,
                          "journal_id": self._header["journal_id"]})
            labels = None
            if self._labels is not None:
                labels, source = self._labels
                if source is not None:
                    attrs["labels_source"] = json.dumps(source, ensure_ascii=False, sort_keys=True)
                    keys = set(json.loads(_attr_text(attrs.get("json_attrs", "[]")))) | {"labels_source"}
                    attrs["json_attrs"] = json.dumps(sorted(keys))
            _write_store_file(tmp, attrs=attrs, sites=self.sites, d_model=self.d_model,
                              storage_dtype=self.storage_dtype, compression=self._header.get("compression"),
                              compression_opts=self._header.get("compression_opts"), segments=segments,
                              labels=labels, chunk_rows=self._header.get("chunk_rows"))
            if base_f is not None:
                base_f.close()
                base_f = None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent, strict=True)
        except BaseException as exc:
            if base_f is not None:
                jr.best_effort(base_f.close)
            jr.best_effort(lambda: tmp.unlink(missing_ok=True))
            if isinstance(exc, _WRITE_ERRORS):
                kept = (f"{self.path} is unchanged; re-run to retry" if self._header.get("replace") else
                        f"its {self.n_episodes} committed episodes are kept in {self.journal_dir} and re-running "
                        "the same command finishes the store")
                raise ActivationStoreError(f"cannot write activation store {self.path}: "
                                           f"{_write_failure(exc)}; {kept}") from None
            raise
        self._finished = True
        self.close()
        jr.best_effort(lambda: jr.remove_tree(self.journal_dir))     # the next writer removes it otherwise
        return bool(update["complete"])

    def discard(self) -> None:
        """Drop the journal of this writer (a merge that failed): nothing of it reaches the store."""
        self.close()
        jr.remove_tree(self.journal_dir)

    def close(self) -> None:
        jr.unlock_journal(self._lock)
        self._lock = None

    def __enter__(self) -> "ActivationWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _mkdir(path: Path) -> None:
    path.mkdir(parents=True)


def _write_chunk(tmp: Path, final: Path, bufs: Sequence[Any], *, n_rows: int, episode_ids: Sequence[str]) -> jr.Entry:
    """temp -> fsync -> rename -> fsync(dir) of one chunk; returns its journal entry."""
    import hashlib

    h = hashlib.sha256()
    for b in bufs:
        h.update(b)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = durable.write_all(fd, bufs)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(final.parent, strict=True)
    return jr.Entry(chunk=final.name, bytes=n, sha256=h.hexdigest(), n_rows=int(n_rows),
                    episode_ids=tuple(episode_ids))


def _safe_text(value: Any) -> str:
    """HDF5 strings cannot hold NUL: it is stored as U+2400 (a byte-level token of byte 0 decodes to NUL)."""
    return str(value).replace("\x00", "\u2400")


def label_cell(column: str, value: Any) -> Any:
    """A label as its index column stores it: text for text and enum columns, else 1 / 0 / -1 (missing)."""
    if INDEX_COLUMNS[column] in ("text", "enum"):
        return "" if value is None else str(value)
    if value is None:
        return -1
    return 1 if bool(value) else 0


def _os_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())            # one line (HDF5 messages hold newlines)
    if len(text) > 240:
        text = text[:240] + "..."
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in text or "errno = 28" in text:
        return f"no space left on device ({text})"
    if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS) or "ermission denied" in text \
            or "Read-only" in text:
        return f"not writable ({text})"
    return text


def storage_report(path: str | Path) -> dict[str, int]:
    """File size vs bytes held by datasets (a store written in one pass has no dead space)."""
    live = 0

    def visit(name: str, obj: Any) -> None:
        nonlocal live
        if isinstance(obj, h5py.Dataset):
            live += int(obj.id.get_storage_size())

    with _open_h5(Path(path), "r") as f:
        f.visititems(visit)
    return {"file_bytes": Path(path).stat().st_size, "dataset_bytes": live}


# -- reader -----------------------------------------------------------------------------------------------

class ActivationStore:
    """Read-only, lazy view of a store plus the committed batches of a running or interrupted job's journal
    (then ``complete`` is False); a torn journal tail or an unreferenced chunk is simply not shown."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f: h5py.File | None = None
        self._index: dict[str, np.ndarray] | None = None
        jdir = jr.journal_dir_for(self.path)
        header = jr.read_header(jdir) if jdir.is_dir() else None
        if not self.path.exists() and (header is None or header.get("base") is not None):
            raise ActivationStoreError(f"{self.path}: no such activation store")
        self._header_opts = (header or {}).get("compression_opts")
        self._header_chunk_rows = (header or {}).get("chunk_rows")
        try:
            segments: list[Any] = []
            base = None
            if self.path.exists():
                self._f = _open_h5(self.path, "r")
                _check_schema(self._f, self.path)
                segments.append(_H5Segment(self._f))
                base = _base_ref(dict(self._f.attrs.items()), (segments[0].n_rows, segments[0].n_episodes))
            self._live = header is not None and header.get("base") == base and (
                base is None or header.get("journal_id") != base["journal_id"])
            if self._live:
                entries, _ = jr.read_entries(jdir)
                segments += [_ChunkSegment(jr.Chunk(jdir / e.chunk)) for e in entries]
            # no store file: a live journal of a new store (its header holds the root attributes)
            self._attrs_raw = dict(self._f.attrs.items()) if self._f is not None else dict(header["root_attrs"])
            self._segments = segments
            self.n_rows = sum(s.n_rows for s in segments)
            self.n_episodes = sum(s.n_episodes for s in segments)
            if self._live:                  # what the job has committed so far (its store file is not written)
                self._attrs_raw.update({"n_rows": self.n_rows, "n_episodes": self.n_episodes, "complete": False})
            self._encoding = _attr_text(self._attrs_raw["encoding"])
        except BaseException:
            self.close()
            raise

    # .. metadata ..
    @property
    def layers(self) -> list[int]:
        """Stored sites (``output_hidden_states`` numbering; the last site is the pre-norm block output)."""
        return [int(s) for s in self._attrs_raw["sites"]]

    @property
    def d_model(self) -> int:
        return int(self._attrs_raw["d_model"])

    @property
    def storage_dtype(self) -> str:
        return _attr_text(self._attrs_raw["storage_dtype"])

    @property
    def attrs(self) -> dict[str, Any]:
        """Provenance and schema attributes (JSON-valued ones decoded)."""
        return _decode_attrs(self._attrs_raw.items())

    @property
    def compression_opts(self) -> int | None:
        """The gzip level of the activation datasets (None: not gzip), which a merge must keep: the root
        attributes name the filter only."""
        first = next(iter(self._f["acts"].values()), None) if self._f is not None else None
        if first is not None:
            return first.compression_opts if first.compression == "gzip" else None
        return self._header_opts

    @property
    def chunk_rows(self) -> int | None:
        """Rows per HDF5 chunk of the activation datasets (None: a new store's journal asked for the default),
        which a merge keeps when its sources agree."""
        first = next(iter(self._f["acts"].values()), None) if self._f is not None else None
        if first is not None:
            return int(first.chunks[0]) if first.chunks else None
        return self._header_chunk_rows

    @property
    def complete(self) -> bool:
        """True only if the last writer committed every episode it planned and closed the job."""
        if self._live:
            return False
        a = self._attrs_raw
        return bool(a.get("complete", False)) and (
            (self.n_rows, self.n_episodes) == (int(a["n_rows"]), int(a["n_episodes"])))

    def __len__(self) -> int:
        return self.n_rows

    # .. index ..
    @property
    def index(self) -> dict[str, np.ndarray]:
        """Column -> array (strings as object arrays), ``row`` first; ``pandas.DataFrame(store.index)`` works."""
        if self._index is None:
            out: dict[str, np.ndarray] = {"row": np.arange(self.n_rows, dtype=np.int64)}
            names = list(self._f["index"]) if self._f is not None else list(INDEX_COLUMNS)
            for name in names:
                out[name] = _index_values(self._segments, name)
            order = ["row"] + [c for c in INDEX_COLUMNS if c in out] + [c for c in out if c not in INDEX_COLUMNS
                                                                         and c != "row"]
            self._index = {c: out[c] for c in order}
        return self._index

    def index_frame(self) -> Any:
        """The index as a pandas DataFrame (pandas imported on demand)."""
        import pandas as pd

        return pd.DataFrame(self.index)

    @property
    def episodes(self) -> dict[str, np.ndarray]:
        """Committed episodes: ``episode_id``, ``row_start``, ``row_stop``, token counts."""
        return {name: _concat([seg.episode_column(name) for seg in self._segments]) for name in EPISODE_COLUMNS}

    def select(self, **equals: Any) -> np.ndarray:
        """Row numbers whose index columns equal the given values (a list/tuple/set value means 'any of')."""
        idx = self.index
        mask = np.ones(self.n_rows, dtype=bool)
        for col, want in equals.items():
            if col not in idx:
                raise ActivationStoreError(f"no index column {col!r}; columns are {', '.join(idx)}")
            if isinstance(want, (list, tuple, set, frozenset)):
                mask &= np.isin(idx[col], list(want))
            else:
                mask &= idx[col] == want
        return np.flatnonzero(mask)

    # .. activations ..
    def _sources(self, layer: int) -> list[Any]:
        if layer not in self.layers:
            raise ActivationStoreError(f"layer {layer} is not stored in {self.path}; stored: {self.layers}")
        return [seg.raw(layer) for seg in self._segments]

    def _raw_dtype(self) -> np.dtype:
        return np.dtype(STORAGE[self.storage_dtype][0])

    def read_raw(self, layer: int, rows: Any = None) -> np.ndarray:
        """Rows of one layer in the stored representation (bfloat16 as uint16 bits)."""
        srcs = self._sources(layer)
        n, d = self.n_rows, self.d_model
        empty = np.zeros((0, d), dtype=self._raw_dtype())
        if rows is None:
            rows = slice(None)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step == 1:
                if stop <= start:
                    return empty
                parts, off = [], 0
                for seg, src in zip(self._segments, srcs):
                    a, b = max(start - off, 0), min(stop - off, seg.n_rows)
                    if b > a:
                        part = src[a:b]
                        parts.append(np.array(part) if isinstance(part, np.memmap) else part)
                    off += seg.n_rows
                return parts[0] if len(parts) == 1 else np.concatenate(parts)
            rows = np.arange(start, stop, step)
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (n,):
                raise ActivationStoreError(f"boolean row mask of shape {rows.shape}, store has {n} rows")
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64).reshape(-1)
        if rows.size == 0:
            return empty
        rows = np.where(rows < 0, rows + n, rows)
        if rows.min() < 0 or rows.max() >= n:
            raise ActivationStoreError(f"row index out of range (store has {n} rows)")
        uniq, inverse = np.unique(rows, return_inverse=True)
        out = np.empty((uniq.size, d), dtype=self._raw_dtype())
        off = pos = 0
        for seg, src in zip(self._segments, srcs):
            sel = uniq[(uniq >= off) & (uniq < off + seg.n_rows)]
            if sel.size:
                out[pos:pos + sel.size] = _read_rows(src, sel - off, seg.n_rows, d)
                pos += sel.size
            off += seg.n_rows
        return out[inverse]

    def read(self, layer: int, rows: Any = None) -> np.ndarray:
        """``[n_rows, d_model]`` float32 activations of one layer (all rows, or ``rows``: slice/ints/bool mask)."""
        return decode_activations(self.read_raw(layer, rows), self._encoding)

    # .. lifetime ..
    def close(self) -> None:
        if self._f is not None:
            self._f.close()

    def __enter__(self) -> "ActivationStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ActivationStore({str(self.path)!r}, rows={self.n_rows}, episodes={self.n_episodes}, "
                f"layers={len(self.layers)}, d_model={self.d_model}, dtype={self.storage_dtype}, "
                f"complete={self.complete})")


def open_store(path: str | Path) -> ActivationStore:
    """Open an activation store read-only and lazily (use as a context manager, or call ``close``)."""
    return ActivationStore(path)
