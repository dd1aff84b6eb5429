"""The converted-model cache: a GGUF read from its safetensors conversion is the GGUF, bit for bit.

The reference is transformers' own GGUF load, which ``HFBackend.load`` falls back to when the cache cannot be
written (here: the cache path lies under a regular file)."""

from __future__ import annotations

import torch

from memtoc.backends import gguf_cache
from memtoc.backends.hf import HFBackend
from memtoc.backends.models import resolve_model

TEXTS = ["Hello world", "FINAL: Paris\n", "The Eiffel Tower is in  the city of", "ünïcödé 東京 <|im_start|>user"]


def test_the_cached_default_equals_the_gguf_it_came_from(default_backend, tmp_path, monkeypatch):
    cached = default_backend                   # loaded through the session's cache (tests/conftest.py)
    converted = gguf_cache.converted_dir(resolve_model("default"))
    assert (converted / gguf_cache.STAMP).is_file() and (converted / "model.safetensors").is_file()

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker / "cache"))    # unwritable: the GGUF itself is parsed
    direct = HFBackend.load("default", device="cpu", dtype="float32")
    assert not (blocker.parent / "cache").exists()
    assert getattr(direct.model.config, "quantization_config", None) is not None     # it really read the GGUF
    assert getattr(cached.model.config, "quantization_config", None) is None

    assert cached.provenance() == direct.provenance()          # the run identity names the GGUF either way
    for text in TEXTS:
        assert cached.tokenizer(text)["input_ids"] == direct.tokenizer(text)["input_ids"], text
    assert cached.format_prompt("What is 2+2?") == direct.format_prompt("What is 2+2?")
    assert cached._eos_ids() == direct._eos_ids() and cached.tokenizer.pad_token_id == direct.tokenizer.pad_token_id
    batch = cached.encode(["What is the capital of France?", "Name a river."])
    with torch.no_grad():
        a = cached.model(batch.input_ids, attention_mask=batch.attention_mask).logits
        b = direct.model(batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.equal(a, b)
    state = direct.model.state_dict()
    assert all(torch.equal(t, state[k]) for k, t in cached.model.state_dict().items())


def test_a_finished_conversion_is_reused_and_a_directory_source_is_read_as_it_is(tmp_path, monkeypatch):
    source = resolve_model("default")
    target = gguf_cache.converted_dir(source, tmp_path)
    target.mkdir(parents=True)
    (target / gguf_cache.STAMP).write_text("x\n")
    monkeypatch.setattr(gguf_cache, "save_dequantized", lambda *a: (_ for _ in ()).throw(AssertionError("converted")))
    assert gguf_cache.model_dir(source, tmp_path) == str(target)
    d = tmp_path / "plain"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert gguf_cache.model_dir(resolve_model(str(d)), tmp_path) == str(d)


def test_processes_converting_at_once_convert_once(tmp_path, monkeypatch):
    """Two loaders (xdist workers, Ray workers) asking for the same conversion: one converts, the other waits for
    the lock and reads its copy."""
    import threading
    import time

    source = resolve_model("default")
    calls = []

    def slow_convert(src, out):
        calls.append(out)
        time.sleep(0.5)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_cache, "save_dequantized", slow_convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(gguf_cache.model_dir(source, tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    target = gguf_cache.converted_dir(source, tmp_path)
    assert len(calls) == 1 and got == [str(target)] * 2 and (target / gguf_cache.STAMP).is_file()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
