"""What a backend loads for a model source: a GGUF file becomes a cached safetensors directory of the same weights.

Both backends read it. hf: transformers parses a GGUF three times (config, tokenizer, weights) and rebuilds its
tensor-name map per tensor, so loading the embedded default took 19 s, against 0.2 s from the converted directory
(same weights bit for bit, same tokenizer and chat template: ``tests/memtoc/backends/test_gguf_cache.py``). The
first load on a machine converts (about 30 s), every later one reads the directory; a cache that cannot be
written (a read-only home) falls back to the GGUF itself.

vLLM 0.32 cannot serve the embedded default (``SmolLM2-135M-Instruct.Q4_1.gguf``) as a file here: its engine
config reads the ``.gguf`` as a JSON config (``maybe_override_with_speculators`` -> ``OSError ... is not a valid
JSON file``), and where GGUF does load, vLLM runs the quantized kernels, not the dequantized weights the hf
backend computes with, so the two backends would not agree token for token. So a GGUF source is converted once:
transformers dequantizes it exactly as ``HFBackend.load`` does, the state dict goes into a model built from the
same config (without its quantization entry) and is saved with the tokenizer (chat template included). The
directory is keyed by the GGUF file's sha256 and written atomically (a temporary sibling renamed into place),
so a crash never leaves a half directory and two processes converting at once both end with a whole one.

The run identity keeps naming the GGUF (its sha256 is the weights fingerprint of both backends); the directory
vLLM actually read is recorded beside it in the provenance (``served_from``).
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
