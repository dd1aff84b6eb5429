"""HF backend: greedy generation, left padding, FINAL-line stopping, local loading."""

from __future__ import annotations

import pytest

from memtoc.backends.base import cut_at_final_line, final_line_end
from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes


def _prompts(n: int) -> list[str]:
    eps = build_episodes(load_benchmark("demo").questions[:n], formulations=("reference",),
                         conditions=("tool_wrong", "no_tool"))
    return [e.prompt for e in eps]


@pytest.mark.parametrize("text,end", [
    ("FINAL: Paris\nmore", 13),
    ("FINAL: Paris", None),                 # line not complete yet
    ("Reasoning\nFINAL:\n\n Rome\n", 24),   # answer on a later line
    ("say 'FINAL: ' then\nFINAL: X\n", 28),  # quoted mention skipped
    ("no marker\n", None),
    ("FINAL:\n", None),
])
def test_final_line_end(text, end):
    assert final_line_end(text) == end
    if end is not None:
        assert cut_at_final_line(text) == (text[:end], True)


def test_batched_equals_one_at_a_time_on_tiny_model(tiny_backend):
    prompts = _prompts(4)
    cfg = GenerationConfig(max_new_tokens=12)
    batched = tiny_backend.generate(prompts, cfg)
    single = [tiny_backend.generate([p], cfg)[0] for p in prompts]
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    assert len({g.n_prompt_tokens for g in batched}) > 1  # prompts of different lengths were padded
    assert all(g.n_new_tokens <= 12 for g in batched)


def test_chat_template_wraps_single_user_message(tiny_backend):
    text = tiny_backend.format_prompt("Question: X?\n")
    assert text == "<|im_start|>user\nQuestion: X?\n<|im_end|>\n<|im_start|>assistant\n"


def test_provenance_has_weights_hash(tiny_backend):
    prov = tiny_backend.provenance()
    assert prov["model_source"] == "dir" and len(prov["weights"]["sha256"]) == 64
    assert prov["n_layers"] == 3 and prov["dtype"] == "float32"


def test_unknown_model_spec_is_refused():
    from memtoc.backends.models import resolve_model
    from memtoc.core.errors import ModelNotAvailableError

    with pytest.raises(ModelNotAvailableError, match="local model path .* does not exist"):
        resolve_model("./no/such/dir")
    with pytest.raises(ModelNotAvailableError, match="GGUF file not found"):
        resolve_model("missing.gguf")


@pytest.mark.real_model
def test_default_model_batched_equals_single(default_backend):
    prompts = _prompts(3)
    cfg = GenerationConfig(max_new_tokens=48)
    batched = default_backend.generate(prompts, cfg)
    single = [default_backend.generate([p], cfg)[0] for p in prompts]
    assert [g.text for g in batched] == [g.text for g in single]
    assert all(g.text.strip() for g in batched)


def test_auto_device_and_dtype_follow_cuda_availability(monkeypatch):
    """The GPU answers of ``pick_device``/``pick_dtype`` with CUDA availability forced: ``auto`` is cuda and
    bfloat16 where torch sees a GPU; ``cuda`` without one is refused naming the setting."""
    import torch

    from memtoc.backends.hf import pick_device, pick_dtype
    from memtoc.core.errors import ModelNotAvailableError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device("auto") == torch.device("cuda") and pick_device("cuda:1") == torch.device("cuda:1")
    assert pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert pick_dtype("auto", torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(ModelNotAvailableError, match="--device cuda"):
        pick_device("cuda")
