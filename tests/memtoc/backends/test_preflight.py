"""A model's shape read without its weights (memtoc.backends.preflight): the numbers the pre-load checks use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.backends.preflight import model_shape, read_gguf_metadata
from memtoc.core.errors import ModelNotAvailableError


def _default_gguf() -> Path:
    from memtoc.backends.models import resolve_model

    try:
        src = resolve_model("default")
    except ModelNotAvailableError as exc:
        pytest.skip(str(exc))
    return Path(src.path) / str(src.gguf_file)


def test_the_gguf_header_reads_as_the_gguf_package_reads_it() -> None:
    """Independent reference: the ``gguf`` package's reader (which maps every tensor) on the embedded model."""
    gguf = pytest.importorskip("gguf")
    path = _default_gguf()
    ours = read_gguf_metadata(path)
    reader = gguf.GGUFReader(path)
    for key in ("general.architecture", "llama.block_count", "llama.embedding_length", "llama.context_length",
                "llama.vocab_size"):
        field = reader.fields[key]
        theirs = field.contents() if hasattr(field, "contents") else field.parts[field.data[0]].tolist()
        theirs = theirs[0] if isinstance(theirs, list) and len(theirs) == 1 else theirs
        assert ours[key] == theirs, key
    shape = model_shape("default")
    assert (shape.model_type, shape.n_layers, shape.d_model) == ("llama", 30, 576)
    assert shape.n_sites == 31


def test_a_model_directory_is_read_from_its_config(tiny_model_dir) -> None:
    cfg = json.loads((Path(tiny_model_dir) / "config.json").read_text(encoding="utf-8"))
    shape = model_shape(str(tiny_model_dir))
    assert (shape.n_layers, shape.d_model, shape.n_vocab) == (cfg["num_hidden_layers"], cfg["hidden_size"],
                                                             cfg["vocab_size"])


def test_a_hub_id_has_no_local_shape() -> None:
    assert model_shape("some-org/some-model") is None


@pytest.mark.parametrize("content, message", [
    (b"not a gguf file at all", "no GGUF signature"),
    (b"GGUF\x03\x00\x00\x00\x01\x00", "truncated or corrupt"),
])
def test_a_broken_gguf_is_one_line(tmp_path, content, message) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(content)
    with pytest.raises(ModelNotAvailableError) as exc:
        model_shape(str(fake))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_truncated_copy_of_the_real_header_is_refused(tmp_path) -> None:
    data = _default_gguf().read_bytes()[:4096]
    fake = tmp_path / "cut.gguf"
    fake.write_bytes(data)
    with pytest.raises(ModelNotAvailableError, match="truncated or corrupt"):
        read_gguf_metadata(fake)
