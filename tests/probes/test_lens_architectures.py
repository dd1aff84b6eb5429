"""The detached lens on several architectures: the per-architecture block table (memtoc.backends.parts).

Each tiny random model is built from a config in float64. transformers' RMSNorms and eager softmax compute in
float32 even in a float64 model; the fixture patches them to keep the input dtype (test-only), so the detached
lens can be checked against its forward-mode-AD reference and the exact decomposition identity to ~1e-10.
"""

from __future__ import annotations

import pytest
import torch

from memtoc.backends.hooks import site_hooks
from memtoc.backends.parts import BLOCK_LAYOUTS, UnsupportedArchitectureError, block_layout
from memtoc.core.errors import MemtocError
from probes.lens import LensCapture, forward_jvp, local_jvp_vectors
from probes.model import ModelParts, base_model

COMMON = dict(vocab_size=72, hidden_size=16, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager",
              tie_word_embeddings=False)


def _llama_norm(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _gemma_norm(self, x):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * (1.0 + self.weight)


def _build(arch: str, mp: pytest.MonkeyPatch):
    import transformers as tf

    if arch == "llama":
        from transformers.models.llama import modeling_llama as m
        mp.setattr(m.LlamaRMSNorm, "forward", _llama_norm)
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON))
    elif arch == "qwen2":
        from transformers.models.qwen2 import modeling_qwen2 as m
        mp.setattr(m.Qwen2RMSNorm, "forward", _llama_norm)
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON))
    else:
        from transformers.models.gemma2 import modeling_gemma2 as m
        mp.setattr(m.Gemma2RMSNorm, "forward", _gemma_norm)
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(**COMMON, head_dim=4, query_pre_attn_scalar=4,
                                                     sliding_window=4, final_logit_softcapping=30.0,
                                                     attn_logit_softcapping=50.0))
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.4)
            elif "norm" in name:
                p.normal_(0 if arch == "gemma2" else 1, 0.2)
            elif name.endswith("v_proj.bias"):
                p.zero_()       # a value bias is not part of a Jacobian (keeps the decomposition identity exact)
            else:
                p.normal_(0, 0.1)   # qwen2's query/key biases
    return ModelParts.of(model, n_vocab=64)


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2"])
def parts64(request):
    mp = pytest.MonkeyPatch()
    softmax = torch.nn.functional.softmax
    mp.setattr(torch.nn.functional, "softmax",
               lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim, dtype=x.dtype if dtype is not None else None))
    parts = _build(request.param, mp)
    yield parts
    mp.undo()


def _states(parts, ids):
    out = {}
    with torch.no_grad(), site_hooks(parts.model, range(parts.n_sites), lambda s, h: out.__setitem__(s, h.clone())):
        res = parts.model(input_ids=ids)
    return out, res.logits


def test_table_entry_matches_the_model(parts64):
    assert parts64.layout == BLOCK_LAYOUTS[parts64.model_type]
    assert parts64.d_model == 16 and parts64.n_sites == 4


def test_detached_manual_route_equals_forward_ad_route(parts64, read_lenses):
    parts = parts64
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    sites = list(range(parts.n_sites))
    ref = local_jvp_vectors(parts, batch, sites, detached=True)
    cap = LensCapture(parts, sites, detached=True)
    with torch.no_grad(), cap.attach(parts, batch):
        base_model(parts.model)(input_ids=ids)
    got = read_lenses(parts, cap, ["detached", "logit"])
    for s in sites:
        torch.testing.assert_close(got["detached"][s], ref[s], atol=1e-10, rtol=1e-9)
    # a genuine transport below the last site (not the raw state), equal to it at the last site
    assert (got["detached"][0] - got["logit"][0]).abs().max() > 1e-2
    torch.testing.assert_close(got["detached"][parts.n_layers], got["logit"][parts.n_layers])


def test_detached_exact_decomposition_identity(parts64):
    parts = parts64
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    states, logits = _states(parts, ids)
    L = parts.n_layers
    torch.testing.assert_close(parts.unembed(states[L][:, -1]), logits[:, -1], atol=1e-10, rtol=1e-10)
    for s in range(L):
        primal, tan = forward_jvp(parts, batch, s, states[s].clone(), detached=True)
        torch.testing.assert_close(primal, states[L], atol=1e-10, rtol=0)
        torch.testing.assert_close(tan, states[L], atol=1e-10, rtol=1e-9)
        _, plain = forward_jvp(parts, batch, s, states[s].clone(), detached=False)
        assert (plain - states[L]).abs().max() > 1e-2


def test_every_table_entry_fits_its_architecture():
    import transformers as tf

    small = dict(COMMON, attn_implementation="eager")
    configs = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config,
               "qwen3": tf.Qwen3Config, "gemma": tf.GemmaConfig, "gemma2": tf.Gemma2Config,
               "gemma3_text": tf.Gemma3TextConfig}
    assert set(configs) == set(BLOCK_LAYOUTS)
    for mtype, cfg_cls in configs.items():
        extra = {"head_dim": 4} if mtype.startswith("gemma") or mtype == "qwen3" else {}
        model = tf.AutoModelForCausalLM.from_config(cfg_cls(**small, **extra))
        assert model.config.model_type == mtype
        assert block_layout(model) is BLOCK_LAYOUTS[mtype]


def test_unknown_architecture_is_a_clear_error():
    import transformers as tf

    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2, n_positions=32)).eval()
    parts = ModelParts.of(model)
    ids = torch.randint(0, 40, (1, 5), generator=torch.Generator().manual_seed(0))
    cap = LensCapture(parts, [0, 1], detached=True)
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'") as err:
        with torch.no_grad(), cap.attach(parts, {"input_ids": ids}):
            model(input_ids=ids)
    assert isinstance(err.value, MemtocError)
    # the logit lens needs no table: it works on any architecture
    plain = LensCapture(parts, [0, 1])
    with torch.no_grad(), plain.attach(parts, {"input_ids": ids}):
        model(input_ids=ids)
    assert set(plain.states) == {0, 1}
