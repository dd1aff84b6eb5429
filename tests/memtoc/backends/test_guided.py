"""Schema-constrained decoding: xgrammar on the hf backend (tiny test model), vLLM guided decoding on the vllm
backend (the fake ``vllm`` module of test_vllm)."""

from __future__ import annotations

import sys
import types

import pytest

from memtoc.tasks.agent.calls import check_call, find_call
from memtoc.core.backend_kinds import GUIDED
from memtoc.core.runtime import GenerationConfig
from memtoc.backends.guided import Sampling, call_schema, vllm_request_params

pytest.importorskip("xgrammar")

TOOL = {"name": "t", "description": "d", "parameters": {"type": "object", "properties": {
    "b": {"type": "boolean"}, "k": {"type": "string", "enum": ["x", "y"]}}, "required": ["b", "k"]}}
N = 50
PROMPT = "<|im_start|>user\nCall t.<|im_end|>\n<|im_start|>assistant\n"


def valid(text: str) -> bool:
    return check_call(find_call(text, required=True), TOOL).valid


def test_constrained_sampling_gives_only_schema_valid_calls_and_free_sampling_does_not(tiny_backend):
    assert GUIDED in tiny_backend.capabilities
    cfg = GenerationConfig(max_new_tokens=64, stop_at_final_line=False)
    constrained = tiny_backend.generate_guided([PROMPT] * N, cfg, schemas=[call_schema(TOOL)] * N,
                                               sampling=Sampling(temperature=1.0, seed=0))
    free = tiny_backend.generate_guided([PROMPT] * N, GenerationConfig(max_new_tokens=16, stop_at_final_line=False),
                                        schemas=None, sampling=Sampling(temperature=1.0, seed=0))
    assert len({g.text for g in constrained}) > 1                      # really sampled
    assert all(valid(g.text) and g.stop_reason == "eos" for g in constrained), [g.text for g in constrained]
    invalid_free = sum(not valid(g.text) for g in free) / N
    assert invalid_free > 0.5                                          # the random model writes no calls


def test_greedy_guided_without_schema_equals_the_backends_own_greedy_decoder(tiny_backend):
    cfg = GenerationConfig(max_new_tokens=12, stop_at_final_line=False)
    texts = [PROMPT, "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"]
    assert [g.text for g in tiny_backend.generate_guided(texts, cfg)] == \
           [g.text for g in tiny_backend.generate_formatted(texts, cfg)]


def test_vllm_guided_params_and_generate(monkeypatch):
    class FakeGuided:
        def __init__(self, **kw):
            self.kw = kw

    mod = types.ModuleType("vllm.sampling_params")
    mod.GuidedDecodingParams = FakeGuided
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", mod)
    base = {"temperature": 0.0, "max_tokens": 8, "seed": 0, "skip_special_tokens": True}
    p = vllm_request_params(GenerationConfig(), call_schema(TOOL), Sampling(0.7, 3), base)
    assert p["temperature"] == 0.7 and p["seed"] == 3 and p["guided_decoding"].kw["json"] == call_schema(TOOL)
    assert "guided_decoding" not in vllm_request_params(GenerationConfig(), None, Sampling(), base)
    # newer vLLM: structured outputs
    mod2 = types.ModuleType("vllm.sampling_params")
    mod2.StructuredOutputsParams = FakeGuided
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", mod2)
    p = vllm_request_params(GenerationConfig(), call_schema(TOOL), Sampling(), base)
    assert p["structured_outputs"].kw["json"] == call_schema(TOOL)


def test_constrained_greedy_equals_model_generate_with_xgrammars_own_logits_processor(tiny_backend):
    """The decoding loop's grammar mask against an independent path: transformers' generate with xgrammar's
    contrib LogitsProcessor (what the backend used before the two decoders were merged)."""
    import torch
    import xgrammar as xgr

    from memtoc.backends.guided import GrammarCompiler

    cfg = GenerationConfig(max_new_tokens=40, stop_at_final_line=False)
    texts = [PROMPT, "<|im_start|>user\nPlease call the tool t now.<|im_end|>\n<|im_start|>assistant\n"]
    ours = tiny_backend.generate_guided(texts, cfg, schemas=[call_schema(TOOL)] * 2)
    comp = GrammarCompiler.of(tiny_backend)
    batch = tiny_backend.encode_formatted(texts)
    eos = sorted(tiny_backend._eos_ids())
    with torch.inference_mode():
        seqs = tiny_backend.model.generate(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=40, do_sample=False,
            logits_processor=[xgr.contrib.hf.LogitsProcessor([comp.compile(call_schema(TOOL))] * 2)],
            pad_token_id=tiny_backend.tokenizer.pad_token_id, eos_token_id=eos, temperature=None, top_p=None,
            top_k=None)
    for g, row in zip(ours, seqs[:, batch.input_ids.shape[1]:].tolist()):
        ref = row[:next((k for k, t in enumerate(row) if t in eos), len(row))]
        assert list(g.token_ids) == ref
        assert valid(g.text)


def test_a_sampled_rows_draw_does_not_depend_on_the_rest_of_the_batch(tiny_backend):
    cfg = GenerationConfig(max_new_tokens=24, stop_at_final_line=False)
    other = "<|im_start|>user\nSomething else entirely.<|im_end|>\n<|im_start|>assistant\n"
    s = Sampling(temperature=1.0, seed=7)
    alone = tiny_backend.generate_guided([PROMPT], cfg, schemas=[call_schema(TOOL)], sampling=s)
    mixed = tiny_backend.generate_guided([other, PROMPT, other], cfg, schemas=[None, call_schema(TOOL), None],
                                         sampling=s)
    assert mixed[1].token_ids == alone[0].token_ids and len(alone[0].token_ids) > 0
