"""What a backend loads for a model source: a GGUF file becomes a cached safetensors directory of the same weights.

hf: transformers parses a GGUF three times and rebuilds its tensor-name map per tensor (19 s for the default
model, against 0.2 s from the converted directory; same weights bit for bit, same tokenizer and chat template).
vLLM cannot serve the default GGUF as a file, and where it can it runs quantized kernels, not the dequantized
weights hf computes with. So a GGUF is converted once: dequantized as ``HFBackend.load`` does and saved with its
tokenizer under a directory keyed by the file's sha256, written atomically (a temporary sibling renamed into
place); a cache that cannot be written falls back to the GGUF itself.

The run identity keeps naming the GGUF (its sha256 is the weights fingerprint of both backends); the directory
vLLM read is recorded beside it (``served_from``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from memtoc.backends.models import ModelSource
from memtoc.core.errors import ModelNotAvailableError
from memtoc.core.fileio import sha256_file

#: Where converted models live (override with ``MEMTOC_MODEL_CACHE``; ``MEMTOC_VLLM_CACHE``, its name when only
#: vLLM used it, is still read).
CACHE_ENV = "MEMTOC_MODEL_CACHE"
OLD_CACHE_ENV = "MEMTOC_VLLM_CACHE"
STAMP = ".memtoc-converted"


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV) or os.environ.get(OLD_CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "memtoc" / "models"


def converted_dir(source: ModelSource, root: Path | None = None) -> Path:
    """The cache directory a GGUF source converts into (named by the file's sha256)."""
    gguf = source.weight_files()[0]
    return (root or cache_root()) / f"{gguf.stem}-{sha256_file(gguf)[:16]}"


def save_dequantized(source: ModelSource, out: Path) -> None:
    """Dequantize a GGUF source with transformers and save model + tokenizer as a safetensors directory."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(source.path, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(source.path, dtype="float32", **kwargs)
    config = copy.deepcopy(loaded.config)     # the config the weights were read with (no third GGUF parse)
    if hasattr(config, "quantization_config"):
        del config.quantization_config       # the saved weights are plain float32
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ModelNotAvailableError(f"converting {source.gguf_file}: state dict mismatch (missing "
                                     f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def model_dir(source: ModelSource, root: Path | None = None) -> str:
    """The path a backend loads for ``source``: the directory or hub id itself, or a GGUF's cached conversion
    (made now when missing). An unwritable cache raises ``OSError``."""
    if source.kind != "gguf":
        return source.path
    target = converted_dir(source, root)
    if (target / STAMP).is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _converting(target):                # one process converts; the others wait, then read its copy
        if (target / STAMP).is_file():
            return str(target)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            save_dequantized(source, tmp)
            (tmp / STAMP).write_text(str(source.weight_files()[0]) + "\n")
            try:
                tmp.rename(target)
            except OSError:                  # another process finished first (no lock here): keep its copy
                if not (target / STAMP).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


@contextlib.contextmanager
def _converting(target: Path) -> Iterator[None]:
    """An exclusive lock on ``target``'s conversion (``flock`` on a sibling file) where the platform has one."""
    try:
        import fcntl
    except ImportError:                      # no flock: concurrent conversions still end with one whole copy
        yield
        return
    with open(target.parent / f"{target.name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
