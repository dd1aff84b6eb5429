"""The HDF5 activation store: schema, a resumable writer, and a lazy read-only reader.

Layout (documented in ``docs/activations.md``)::

    /                         attrs: schema, identity (JSON) + identity_sha256, provenance attrs,
                                     n_rows, n_episodes (the commit marker), complete, sites, d_model,
                                     storage_dtype, encoding
    /acts/site_SSS            [n_rows, d_model] one dataset per site, chunked as (rows, d_model) blocks so
                              that reading all rows of one layer is a sequential read
    /index/<column>           [n_rows] one 1-D dataset per numeric / enum column (enum: fixed-width UTF-8);
    /index/<column>/{data,ends}   text columns: UTF-8 bytes and the end offset of each row
    /episodes/<column>        [n_episodes] committed episodes in commit order with their row range

No HDF5 variable-length strings are used: their global heap is rewritten in place and a killed writer can
leave it inconsistent; blobs and fixed-width fields only ever grow or are overwritten at fixed places.

Resume unit: an episode. ``append`` writes a batch's rows, its episodes, then the commit marker
(``n_rows``/``n_episodes``) and flushes. Rows beyond the marker (a batch torn by a crash) are cut off when the
store is reopened for writing and are never shown by the reader. ``complete`` is cleared when a writer opens
the store and set only after every planned episode has been committed.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import h5py
import numpy as np

from activations import ActivationStoreError
from memtoc.fileio import sha256_json

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


def _truncate_column(obj: Any, n: int) -> None:
    obj = _col(obj)
    if isinstance(obj, h5py.Dataset):
        if obj.shape[0] != n:
            obj.resize(n, axis=0)
        return
    end = int(obj.ends[n - 1]) if n else 0
    if obj.ends.shape[0] != n:
        obj.ends.resize(n, axis=0)
    if obj.data.shape[0] != end:
        obj.data.resize(end, axis=0)


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

def _open_h5(path: Path, mode: str, **kwargs: Any) -> h5py.File:
    try:
        return h5py.File(path, mode, **kwargs)
    except FileNotFoundError:
        raise ActivationStoreError(f"{path}: no such activation store") from None
    except OSError as exc:
        msg = str(exc)
        hint = ""
        if "lock" in msg.lower():
            hint = " (another process has it open for writing?)"
        elif "signature" in msg.lower() or "not an hdf5" in msg.lower():
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
    """``(n_rows, n_episodes)`` of the last commit that every dataset fully holds.

    Normally the commit marker itself; if a crash left the marker ahead of some dataset (HDF5 does not order
    metadata writes within a flush), trailing episodes are dropped until every dataset holds their rows.
    """
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


def _json_attrs(f: h5py.File) -> dict[str, Any]:
    json_keys = set(json.loads(_attr_text(f.attrs.get("json_attrs", "[]"))))
    out: dict[str, Any] = {}
    for key, value in f.attrs.items():
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


class ActivationWriter:
    """Appends batches to a store, one commit per batch; reopening resumes after the last commit."""

    def __init__(self, path: Path, f: h5py.File) -> None:
        self.path = path
        self._f = f
        self.sites = [int(s) for s in f.attrs["sites"]]
        self.storage_dtype = _attr_text(f.attrs["storage_dtype"])
        self.d_model = int(f.attrs["d_model"])
        self.n_rows, self.n_episodes = _committed_extent(f)
        self._acts = {s: f["acts"][site_name(s)] for s in self.sites}
        self._index = {name: _col(f["index"][name]) for name in INDEX_COLUMNS}
        self._episodes = {name: _col(f["episodes"][name]) for name in EPISODE_COLUMNS}
        self.done: set[str] = set(_read_column(self._episodes["episode_id"], self.n_episodes).tolist())

    # .. opening ..
    @classmethod
    def open(cls, path: str | Path, *, identity: Mapping[str, Any], provenance: Mapping[str, Any],
             sites: Sequence[int], d_model: int, storage_dtype: str, compression: str | None = None,
             compression_opts: int | None = None) -> "ActivationWriter":
        """Create the store, or reopen one made with the same ``identity`` (anything else is refused)."""
        path = Path(path)
        if storage_dtype not in STORAGE:
            raise ActivationStoreError(f"unknown storage dtype {storage_dtype!r}; choose from {', '.join(STORAGE)}")
        if compression not in (None, "gzip", "lzf"):
            raise ActivationStoreError(f"unknown compression {compression!r}; choose gzip, lzf or none")
        identity = json.loads(json.dumps(dict(identity), ensure_ascii=False, sort_keys=True))
        if path.exists():
            f = _open_h5(path, "r+")
            try:
                _check_schema(f, path)
                old = json.loads(_attr_text(f.attrs["identity"]))
                if _attr_text(f.attrs.get("identity_sha256", "")) != sha256_json(identity):
                    diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
                    raise ActivationStoreError(
                        f"{path} holds activations made with different settings ({', '.join(diff) or 'unknown'}: "
                        + "; ".join(f"{k} {old.get(k)!r} here vs {identity.get(k)!r} now" for k in diff[:3])
                        + "); use another --out file, or delete this one to start over")
                writer = cls(path, f)
                writer._truncate_to_commit()
                writer._set_attrs({"complete": False})
                writer._flush()
                return writer
            except BaseException:
                f.close()
                raise
        cls._create(path, identity=identity, provenance=provenance, sites=sites, d_model=d_model,
                    storage_dtype=storage_dtype, compression=compression, compression_opts=compression_opts)
        return cls(path, _open_h5(path, "r+"))

    @staticmethod
    def _create(path: Path, *, identity: Mapping[str, Any], provenance: Mapping[str, Any], sites: Sequence[int],
                d_model: int, storage_dtype: str, compression: str | None, compression_opts: int | None) -> None:
        """Build the empty store under a temporary name and rename it into place (never a half-made store)."""
        tmp = path.with_name(path.name + ".partial")
        h5_dtype, encoding = STORAGE[storage_dtype]
        itemsize = np.dtype(h5_dtype).itemsize
        chunk_rows = int(max(1, min(1 << 16, _CHUNK_BYTES // (int(d_model) * itemsize))))
        filt: dict[str, Any] = {}
        if compression:
            filt = {"compression": compression, "shuffle": True}
            if compression == "gzip":
                filt["compression_opts"] = 4 if compression_opts is None else int(compression_opts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Compressed chunks move when rewritten; never reusing freed space keeps the committed copies intact.
            with h5py.File(tmp, "w", **({"fs_strategy": "none"} if compression else {})) as f:
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
                    "identity_sha256": sha256_json(identity), "sites": np.asarray(sites, dtype=np.int32),
                    "d_model": int(d_model), "storage_dtype": storage_dtype, "encoding": encoding,
                    "compression": compression or "none", "n_rows": 0, "n_episodes": 0, "complete": False,
                    "json_attrs": json.dumps(json_keys + ["identity"]),
                })
                for key, value in attrs.items():
                    f.attrs[key] = value
                acts = f.create_group("acts")
                for s in sites:
                    ds = acts.create_dataset(site_name(s), shape=(0, int(d_model)), maxshape=(None, int(d_model)),
                                             dtype=h5_dtype, chunks=(chunk_rows, int(d_model)), **filt)
                    ds.attrs["site"] = int(s)
                    ds.attrs["source"] = ("embedding output (residual stream entering block 0)" if s == 0
                                          else f"output of block {int(s) - 1} (residual stream, pre final norm)")
                    ds.attrs["encoding"] = encoding
                for group, columns in (("index", INDEX_COLUMNS), ("episodes", EPISODE_COLUMNS)):
                    g = f.create_group(group)
                    for name, kind in columns.items():
                        _create_column(g, name, kind, {"compression": "gzip"} if compression else {})
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise ActivationStoreError(f"cannot create activation store {path}: {_os_reason(exc)}") from None

    # .. state ..
    @property
    def index_columns(self) -> list[str]:
        return list(INDEX_COLUMNS)

    def _truncate_to_commit(self) -> None:
        try:
            for obj in list(self._acts.values()) + list(self._index.values()):
                _truncate_column(obj, self.n_rows)
            for obj in self._episodes.values():
                _truncate_column(obj, self.n_episodes)
            self._set_attrs({"n_rows": self.n_rows, "n_episodes": self.n_episodes})
        except OSError as exc:
            raise ActivationStoreError(f"cannot write to {self.path}: {_os_reason(exc)}") from None

    def _set_attrs(self, attrs: Mapping[str, Any]) -> None:
        try:
            for k, v in attrs.items():
                self._f.attrs[k] = v
        except OSError as exc:
            raise ActivationStoreError(f"cannot write to {self.path}: {_os_reason(exc)}") from None

    def _flush(self) -> None:
        try:
            self._f.flush()
        except OSError as exc:
            raise ActivationStoreError(f"cannot write to {self.path}: {_os_reason(exc)}") from None

    # .. writing ..
    def append(self, block: RowBlock) -> None:
        """Write one batch and commit it (rows, then episodes, then the marker, then flush)."""
        new_ids = [str(e["episode_id"]) for e in block.episodes]
        dup = [e for e in new_ids if e in self.done]
        if dup or len(set(new_ids)) != len(new_ids):
            raise ActivationStoreError(f"{self.path}: episode {(dup or new_ids)[0]!r} is already stored")
        if set(block.acts) != set(self.sites):
            raise ActivationStoreError(f"batch has sites {sorted(block.acts)}, the store holds {self.sites}")
        n0, n1 = self.n_rows, self.n_rows + block.n_rows
        m0, m1 = self.n_episodes, self.n_episodes + len(block.episodes)
        starts = np.cumsum([0] + [int(e["n_rows"]) for e in block.episodes])[:-1] + n0
        ep_cols = {
            "episode_id": np.asarray(new_ids, dtype=object), "row_start": starts.astype(np.int64),
            "row_stop": (starts + np.asarray([int(e["n_rows"]) for e in block.episodes])).astype(np.int64),
            "n_prompt_tokens": np.asarray([int(e.get("n_prompt_tokens", -1)) for e in block.episodes], np.int32),
            "n_generated_tokens": np.asarray([int(e.get("n_generated_tokens", 0)) for e in block.episodes], np.int32),
        }
        try:
            for site in self.sites:
                ds = self._acts[site]
                data = encode_activations(block.acts[site], self.storage_dtype)
                if data.ndim != 2 or data.shape[1] != self.d_model:
                    raise ActivationStoreError(f"site {site}: rows of width {data.shape[-1]}, store has "
                                               f"d_model={self.d_model}")
                ds.resize(n1, axis=0)
                _put(ds, n0, data)
            for name, kind in INDEX_COLUMNS.items():
                values = block.index.get(name)
                if values is None:
                    values = [missing_value(name)] * block.n_rows
                _write_column(self._index[name], kind, name, values, n0)
            for name, kind in EPISODE_COLUMNS.items():
                _write_column(self._episodes[name], kind, name, ep_cols[name], m0)
            self._f.attrs["n_rows"] = n1
            self._f.attrs["n_episodes"] = m1
            self._f.flush()
        except OSError as exc:
            self._rollback(n0, m0)
            raise ActivationStoreError(f"cannot write to {self.path}: {_os_reason(exc)}; the store keeps its "
                                       f"{m0} committed episodes ({n0} rows) and the next run resumes there") from None
        except BaseException:
            self._rollback(n0, m0)
            raise
        self.n_rows, self.n_episodes = n1, m1
        self.done.update(new_ids)

    def _rollback(self, n0: int, m0: int) -> None:
        """Best effort: put the marker and the extents back to the last commit."""
        try:
            self._f.attrs["n_rows"] = n0
            self._f.attrs["n_episodes"] = m0
            for obj in list(self._acts.values()) + list(self._index.values()):
                if _column_len(obj) > n0:
                    _truncate_column(obj, n0)
            for obj in self._episodes.values():
                if _column_len(obj) > m0:
                    _truncate_column(obj, m0)
        except Exception:  # noqa: BLE001 - the reopen path truncates to the commit marker anyway
            pass

    def write_labels(self, labels: Mapping[str, Mapping[str, Any]], *, source: Mapping[str, Any] | None = None) -> int:
        """(Re)write the behaviour-label columns of every committed row from ``episode_id -> labels``.

        Returns how many committed episodes found labels.
        """
        n = self.n_rows
        ids = _read_column(self._index["episode_id"], n)
        cols = {c: [] for c in LABEL_COLUMNS}
        for eid in ids:
            rec = labels.get(str(eid), {})
            for c in LABEL_COLUMNS:
                cols[c].append(_label_value(c, rec.get(c)))
        try:
            for c in LABEL_COLUMNS:
                if n:
                    kind = INDEX_COLUMNS[c]
                    self._index[c][:n] = _encode_enum(cols[c], c) if kind == "enum" else np.asarray(cols[c], kind)
            if source is not None:
                self._f.attrs["labels_source"] = json.dumps(dict(source), ensure_ascii=False, sort_keys=True)
                keys = set(json.loads(_attr_text(self._f.attrs["json_attrs"]))) | {"labels_source"}
                self._f.attrs["json_attrs"] = json.dumps(sorted(keys))
            self._f.flush()
        except OSError as exc:
            raise ActivationStoreError(f"cannot write to {self.path}: {_os_reason(exc)}") from None
        return sum(1 for e in self.done if e in labels)

    def finish(self, *, planned: Iterable[str], extra_attrs: Mapping[str, Any] | None = None) -> bool:
        """Mark the store complete iff every planned episode is committed; returns that flag."""
        planned = sorted(set(planned))
        complete = all(e in self.done for e in planned)
        attrs = {"complete": bool(complete), "n_planned": len(planned),
                 "planned_sha256": sha256_json(planned)}
        attrs.update(extra_attrs or {})
        self._set_attrs(attrs)
        self._flush()
        return complete

    def close(self) -> None:
        try:
            self._f.close()
        except Exception:  # noqa: BLE001 - closing a file whose last write failed
            pass

    def __enter__(self) -> "ActivationWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _safe_text(value: Any) -> str:
    """HDF5 strings cannot hold NUL: it is stored as U+2400 (a byte-level token of byte 0 decodes to NUL)."""
    return str(value).replace("\x00", "\u2400")


def _label_value(column: str, value: Any) -> Any:
    if INDEX_COLUMNS[column] in ("text", "enum"):
        return "" if value is None else str(value)
    if value is None:
        return -1
    return 1 if bool(value) else 0


def _os_reason(exc: OSError) -> str:
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc):
        return f"no space left on device ({exc})"
    if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS) or "ermission denied" in str(exc) \
            or "Read-only" in str(exc):
        return f"not writable ({exc})"
    return str(exc)


def storage_report(path: str | Path) -> dict[str, int]:
    """File size vs bytes held by datasets (compressed stores accumulate dead space from rewritten chunks)."""
    live = 0

    def visit(name: str, obj: Any) -> None:
        nonlocal live
        if isinstance(obj, h5py.Dataset):
            live += int(obj.id.get_storage_size())

    with _open_h5(Path(path), "r") as f:
        f.visititems(visit)
    return {"file_bytes": Path(path).stat().st_size, "dataset_bytes": live}


def repack_store(path: str | Path, *, min_waste: float = 0.25, min_bytes: int = 1 << 20) -> bool:
    """Rewrite a store without dead space (through a temporary file and an atomic rename).

    A compressed store never reuses freed file space while it is written, so a hard kill cannot overwrite
    committed chunks; the price is that every rewritten partial chunk leaves its old copy behind. The
    extraction job repacks compressed stores when it finishes. Returns whether the file was rewritten.
    """
    path = Path(path)
    rep = storage_report(path)
    if rep["file_bytes"] <= (1 + min_waste) * rep["dataset_bytes"] + min_bytes:
        return False
    tmp = path.with_name(path.name + ".repack")
    try:
        with _open_h5(path, "r") as src, h5py.File(tmp, "w", fs_strategy="none") as dst:
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            for name in src:
                src.copy(src[name], dst, name=name)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise ActivationStoreError(f"cannot repack {path}: {_os_reason(exc)} (the store itself is unchanged)") from None
    return True


# -- reader -----------------------------------------------------------------------------------------------

class ActivationStore:
    """Read-only, lazy view of a store: nothing but the attributes is read until asked for.

    Only committed rows are visible (a batch torn by a crash is not).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = _open_h5(self.path, "r")
        try:
            _check_schema(self._f, self.path)
            self.n_rows, self.n_episodes = _committed_extent(self._f)
            self._encoding = _attr_text(self._f.attrs["encoding"])
            self._index: dict[str, np.ndarray] | None = None
        except BaseException:
            self._f.close()
            raise

    # .. metadata ..
    @property
    def layers(self) -> list[int]:
        """Stored sites (``output_hidden_states`` numbering; the last site is the pre-norm block output)."""
        return [int(s) for s in self._f.attrs["sites"]]

    @property
    def d_model(self) -> int:
        return int(self._f.attrs["d_model"])

    @property
    def storage_dtype(self) -> str:
        return _attr_text(self._f.attrs["storage_dtype"])

    @property
    def attrs(self) -> dict[str, Any]:
        """Provenance and schema attributes (JSON-valued ones decoded)."""
        return _json_attrs(self._f)

    @property
    def complete(self) -> bool:
        """True only if the last writer committed every episode it planned and closed the job."""
        return bool(self._f.attrs.get("complete", False)) and (
            (self.n_rows, self.n_episodes) == (int(self._f.attrs["n_rows"]), int(self._f.attrs["n_episodes"])))

    def __len__(self) -> int:
        return self.n_rows

    # .. index ..
    @property
    def index(self) -> dict[str, np.ndarray]:
        """Column -> array (strings as object arrays), ``row`` first; ``pandas.DataFrame(store.index)`` works."""
        if self._index is None:
            n = self.n_rows
            out: dict[str, np.ndarray] = {"row": np.arange(n, dtype=np.int64)}
            for name in self._f["index"]:
                out[name] = _read_column(self._f["index"][name], n)
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
        g, m = self._f["episodes"], self.n_episodes
        return {name: _read_column(g[name], m) for name in g}

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
    def _dataset(self, layer: int) -> h5py.Dataset:
        name = site_name(layer)
        if name not in self._f["acts"]:
            raise ActivationStoreError(f"layer {layer} is not stored in {self.path}; stored: {self.layers}")
        return self._f["acts"][name]

    def read_raw(self, layer: int, rows: Any = None) -> np.ndarray:
        """Rows of one layer in the stored representation (bfloat16 as uint16 bits)."""
        ds = self._dataset(layer)
        n = self.n_rows
        if rows is None:
            return ds[:n] if n else np.zeros((0, self.d_model), dtype=ds.dtype)
        if isinstance(rows, slice):
            start, stop, step = rows.indices(n)
            if step == 1:
                return ds[start:stop] if stop > start else np.zeros((0, self.d_model), dtype=ds.dtype)
            rows = np.arange(start, stop, step)
        rows = np.asarray(rows)
        if rows.dtype == bool:
            if rows.shape != (n,):
                raise ActivationStoreError(f"boolean row mask of shape {rows.shape}, store has {n} rows")
            rows = np.flatnonzero(rows)
        rows = rows.astype(np.int64).reshape(-1)
        if rows.size == 0:
            return np.zeros((0, self.d_model), dtype=ds.dtype)
        rows = np.where(rows < 0, rows + n, rows)
        if rows.min() < 0 or rows.max() >= n:
            raise ActivationStoreError(f"row index out of range (store has {n} rows)")
        uniq, inverse = np.unique(rows, return_inverse=True)
        out = np.empty((uniq.size, self.d_model), dtype=ds.dtype)
        # Read chunk-sized contiguous blocks that contain requested rows (fast and memory-bounded).
        block = max(int(ds.chunks[0]) if ds.chunks else 1024, 1)
        starts = (uniq // block) * block
        pos = 0
        for b in np.unique(starts):
            sel = uniq[starts == b]
            data = ds[int(b):int(min(b + block, n))]
            out[pos:pos + sel.size] = data[sel - b]
            pos += sel.size
        return out[inverse]

    def read(self, layer: int, rows: Any = None) -> np.ndarray:
        """``[n_rows, d_model]`` float32 activations of one layer (all rows, or ``rows``: slice/ints/bool mask)."""
        return decode_activations(self.read_raw(layer, rows), self._encoding)

    # .. lifetime ..
    def close(self) -> None:
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
