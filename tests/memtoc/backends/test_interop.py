"""Existing model objects as backends (``memtoc.backends.interop``): a transformers model, a TransformerLens
``HookedTransformer`` and an nnsight ``LanguageModel`` capture, edit and evaluate through the same seam as the hf
backend, and equal it on the same weights. nnsight's own tracing is the independent reference for its paths."""

from __future__ import annotations

import pytest
import torch

import memtoc as mt
from activations.capture import ResidualCapture
from memtoc.backends.base import InspectableBackend
from memtoc.core.runtime import GenerationConfig
from memtoc.backends.interop import InteropError, hooked_transformer_from_hf, weights_sha256

PROMPTS = ["Which city is the capital of France?", "Who wrote Hamlet? Answer briefly."]
SMALL = {"limit": 1, "max_new_tokens": 6, "conditions": "tool_wrong,tool_right", "progress": False}


@pytest.fixture(scope="module")
def tl_backend(tiny_backend):
    pytest.importorskip("transformer_lens")
    return mt.load_backend(hooked_transformer_from_hf(tiny_backend.model, tiny_backend.tokenizer))


@pytest.fixture(scope="module")
def nnsight_model(tiny_backend):
    nnsight = pytest.importorskip("nnsight")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # LanguageModel's deprecation notice (nnsight 0.8)
        return nnsight.LanguageModel(tiny_backend.model, tokenizer=tiny_backend.tokenizer)


def _capture(backend, sites=(0, 1, 2, 3)):
    cap = ResidualCapture(sites, "last_input", prompts=PROMPTS)
    out = backend.forward(PROMPTS, capture=cap)
    return {s: cap.values[s].float() for s in sites}, out["last_logits"].float()


def test_a_transformers_model_object_is_in_memory_with_a_weight_hash(tiny_backend) -> None:
    b = mt.load_backend(tiny_backend.model, tokenizer=tiny_backend.tokenizer)
    prov = b.provenance()
    assert prov["model_source"] == "in-memory" and prov["weights"]["sha256"] == weights_sha256(tiny_backend.model)
    copy = type(tiny_backend.model)(tiny_backend.model.config)
    copy.load_state_dict(tiny_backend.model.state_dict())
    assert weights_sha256(copy) == prov["weights"]["sha256"]
    with torch.no_grad():
        copy.model.norm.weight[0] += 1
    assert weights_sha256(copy) != prov["weights"]["sha256"]
    with pytest.raises(InteropError, match="tokenizer"):
        mt.load_backend(tiny_backend.model)
    with pytest.raises(InteropError, match="cannot use a builtins.object"):
        mt.load_backend(object())


def test_transformer_lens_capture_and_logits_equal_hf(tiny_backend, tl_backend) -> None:
    assert isinstance(tl_backend, InspectableBackend) and tl_backend.name == "transformer_lens"
    assert tl_backend.provenance()["model_source"] == "in-memory"
    ref, ref_logits = _capture(tiny_backend)
    got, logits = _capture(tl_backend)
    for s in ref:
        assert torch.allclose(got[s], ref[s], atol=1e-4), s
    assert torch.allclose(logits, ref_logits, atol=1e-4)
    # the attention / MLP outputs come from TransformerLens' own hook points
    a = mt.trace(tiny_backend, PROMPTS, sites="all+parts")
    b = mt.trace(tl_backend, a.tokens, sites="all+parts")
    assert a.names == b.names
    for n in a.names:
        assert torch.allclose(a[n], b[n], atol=1e-4), n
    assert b.paths["blocks.0.hook_attn_out"] == "blocks.0.hook_attn_out.output"


def test_attention_patterns_and_head_outputs_equal_transformer_lens(tiny_backend, tl_backend) -> None:
    """``blocks.L.attn.hook_pattern`` [B, H, q, k] and ``blocks.L.attn.hook_z`` [B, S, H, d_head] on the hf
    backend (hooks on the attention module and its output projection, eager attention while hooked) equal
    TransformerLens' own hook points on the same weights."""
    n = tiny_backend.parts.n_layers
    names = [f"blocks.{b}.attn.{k}" for b in range(n) for k in ("hook_pattern", "hook_z")]
    for prompt in PROMPTS:                            # one prompt at a time: no padding columns to compare
        a = mt.trace(tiny_backend, prompt, sites=names)
        b = mt.trace(tl_backend, a.tokens, sites=names)
        for name in names:
            assert a[name].shape == b[name].shape, name
            assert torch.allclose(a[name], b[name], atol=1e-4), name
        pattern = a["blocks.0.attn.hook_pattern"]
        assert torch.allclose(pattern.sum(-1), torch.ones_like(pattern.sum(-1)), atol=1e-5)
        assert torch.all(pattern.triu(1) == 0)        # causal: no query attends to a later key


def test_reading_the_pattern_restores_the_attention_kernel(tiny_backend) -> None:
    before = tiny_backend.model.config._attn_implementation
    mt.trace(tiny_backend, PROMPTS[0], sites=["blocks.0.attn.hook_pattern"])
    assert tiny_backend.model.config._attn_implementation == before


@pytest.mark.parametrize("wrapper", ["tl_backend", "nnsight_model"])
def test_wrapped_models_generate_edit_and_evaluate_as_hf(tiny_backend, wrapper, request, tmp_path) -> None:
    """A TransformerLens HookedTransformer and an nnsight LanguageModel: the same tokens (untreated and edited)
    and the same evaluate records as hf on the same weights."""
    b = request.getfixturevalue(wrapper)                          # tl_backend is loaded already; nnsight is not
    b = b if wrapper == "tl_backend" else mt.load_backend(b)
    cfg = GenerationConfig(max_new_tokens=8, stop_at_final_line=False)
    assert [g.token_ids for g in b.generate(PROMPTS, cfg)] == [g.token_ids for g in tiny_backend.generate(PROMPTS, cfg)]
    edit = mt.vector_edit(torch.ones(tiny_backend.parts.d_model), layers=[2], strength=3.0)
    assert [g.token_ids for g in b.generate(PROMPTS, cfg, edit=edit)] == \
        [g.token_ids for g in tiny_backend.generate(PROMPTS, cfg, edit=edit)]
    ref = mt.evaluate(backend=tiny_backend, out=tmp_path / "hf", **SMALL)
    got = mt.evaluate(backend=b, out=tmp_path / "wrapped", **SMALL)
    keys = ("episode_id", "response", "outcome")
    assert [{k: r[k] for k in keys} for r in got.records] == [{k: r[k] for k in keys} for r in ref.records]


def test_nnsight_capture_equals_hf_and_nnsight_own_trace(tiny_backend, nnsight_model) -> None:
    b = mt.load_backend(nnsight_model)
    assert b.provenance()["weights"]["object"] == "nnsight.LanguageModel"
    ref, ref_logits = _capture(tiny_backend)
    got, logits = _capture(b)
    assert all(torch.equal(got[s], ref[s]) for s in ref) and torch.equal(logits, ref_logits)
    t = mt.trace(b, PROMPTS[0], sites="all+parts")
    assert t.paths["blocks.1.hook_resid_post"] == "model.layers.1.output"
    with nnsight_model.trace(torch.tensor([t.tokens[0]])):
        attn = nnsight_model.model.layers[1].self_attn.output.save()
        mlp = nnsight_model.model.layers[1].mlp.output.save()
        post = nnsight_model.model.layers[1].output.save()
    post = post[0] if isinstance(post, tuple) else post
    assert torch.equal(t["blocks.1.hook_attn_out"][0], attn[0][0])
    assert torch.equal(t["blocks.1.hook_mlp_out"][0], mlp[0])
    assert torch.equal(t["blocks.1.hook_resid_post"][0], post[0])



@pytest.mark.real_model
def test_default_model_converts_to_transformer_lens(default_backend) -> None:
    """The GGUF default, dequantized by transformers on load, goes the Llama path into a HookedTransformer."""
    pytest.importorskip("transformer_lens")
    tl = hooked_transformer_from_hf(default_backend.model, default_backend.tokenizer)
    ids = default_backend.tokenizer("The Eiffel Tower is in the city of")["input_ids"]
    with torch.no_grad():
        ref = default_backend.model(input_ids=torch.tensor([ids])).logits
        got = tl(torch.tensor([ids]))
    assert torch.allclose(got, ref, atol=1e-3)
    assert int(got[0, -1].argmax()) == int(ref[0, -1].argmax())
