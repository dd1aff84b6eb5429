"""What a model is, read without its weights: depth, width, vocabulary and context, for the checks that must run
before the weights load (a layer range, a lens or SAE width, a generation budget against the context).

A local model directory is read from its ``config.json``; a GGUF file from its header's key-value block, which
this module walks without touching the tensor data (the ``gguf`` package's reader maps every tensor first: seconds
on a large file). A hub id has nothing local to read: :func:`model_shape` returns None and the checks wait for
the loaded model.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from memtoc.core.errors import ModelNotAvailableError

__all__ = ["ModelShape", "model_shape", "read_gguf_metadata"]


@dataclass(frozen=True)
class ModelShape:
    """The numbers the pre-load checks need (``n_sites`` = blocks + 1: site 0 is the embedding output)."""

    model_type: str
    n_layers: int
    d_model: int
    n_vocab: int | None = None
    context_length: int | None = None

    @property
    def n_sites(self) -> int:
        return self.n_layers + 1


# GGUF value types (the GGUF specification, versions 2 and 3)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(fh: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _string(fh: BinaryIO) -> str:
    n = _read(fh, "<Q")
    data = fh.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(fh, _SCALARS[kind])
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        item, n = _read(fh, "<I"), _read(fh, "<Q")
        if item in _SCALARS and not keep:            # skip a numeric array without unpacking it
            fh.seek(struct.calcsize(_SCALARS[item]) * n, 1)
            return None
        values = [_value(fh, item, keep) for _ in range(n)]
        return values if keep else None
    raise ValueError(f"unknown GGUF value type {kind}")


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The scalar key-value metadata of a GGUF file (arrays such as the vocabulary are skipped)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ModelNotAvailableError(f"{path} is not a GGUF file (no GGUF signature)")
            version = _read(fh, "<I")
            if version not in (2, 3):
                raise ModelNotAvailableError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            _read(fh, "<Q")                          # tensor count
            n_kv = _read(fh, "<Q")
            out: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(fh)
                kind = _read(fh, "<I")
                value = _value(fh, kind, keep=False)
                if value is not None:
                    out[key] = value
            return out
    except (EOFError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ModelNotAvailableError(f"{path}: a truncated or corrupt GGUF header ({str(exc) or type(exc).__name__}); "
                                     "give a complete .gguf file") from None


def _from_gguf(path: Path) -> ModelShape:
    meta = read_gguf_metadata(path)
    arch = str(meta.get("general.architecture") or "")
    get = lambda k: meta.get(f"{arch}.{k}")  # noqa: E731
    if get("block_count") is None or get("embedding_length") is None:
        raise ModelNotAvailableError(f"{path}: the GGUF header names no {arch}.block_count / embedding_length")
    vocab = get("vocab_size")
    return ModelShape(model_type=arch, n_layers=int(get("block_count")), d_model=int(get("embedding_length")),
                      n_vocab=int(vocab) if vocab is not None else None,
                      context_length=int(get("context_length")) if get("context_length") is not None else None)


def _from_config(path: Path) -> ModelShape | None:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return None
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelNotAvailableError(f"{cfg_file}: not a readable model config ({exc})") from None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    width = cfg.get("hidden_size", cfg.get("n_embd"))
    if layers is None or width is None:
        return None
    ctx = cfg.get("max_position_embeddings", cfg.get("n_positions"))
    return ModelShape(model_type=str(cfg.get("model_type") or ""), n_layers=int(layers), d_model=int(width),
                      n_vocab=cfg.get("vocab_size"), context_length=int(ctx) if ctx is not None else None)


def model_shape(spec: str) -> ModelShape | None:
    """The shape of the model ``spec`` names (``default``, a .gguf file, a local directory), read without its
    weights; None for a hub id or a directory whose config does not say. A missing local path raises (one line)."""
    from memtoc.backends.models import resolve_model

    source = resolve_model(spec)
    if source.kind == "gguf":
        return _from_gguf(Path(source.path) / str(source.gguf_file))
    if source.kind == "dir":
        return _from_config(Path(source.path))
    return None
