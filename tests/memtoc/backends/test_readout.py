"""The readout on its own (``memtoc.backends.readout``): the final norm and head read from a checkpoint decode as
the loaded model's own modules, and the fingerprint recomputed from the checkpoint is the loaded model's."""

from __future__ import annotations

import pytest
import torch

from memtoc.backends.readout import ReadoutError, load_readout
from probes.model import model_fingerprint


def test_readout_of_a_checkpoint_equals_the_loaded_models_parts(tiny_backend, tiny_model_dir):
    p = tiny_backend.parts
    r = load_readout(tiny_model_dir, n_vocab=len(tiny_backend.tokenizer), n_layers=p.n_layers)
    assert r.readout_only and not p.readout_only
    assert (r.n_layers, r.n_vocab, r.d_model, r.model_type) == (p.n_layers, p.n_vocab, p.d_model, p.model_type)
    assert r.final_norm.weight.device.type == "cpu" and r.layers[0].mlp.up_proj.weight.is_meta   # no blocks loaded
    x = torch.randn(4, p.d_model, generator=torch.Generator().manual_seed(0)) * 3
    assert torch.equal(r.unembed(x), p.unembed(x))
    assert r.fingerprint() == p.fingerprint() == model_fingerprint(tiny_backend.parts.model)


def test_a_tied_head_is_read_from_the_embedding_and_fingerprinted_once(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.norm.weight.normal_(1, 0.2)
    model.save_pretrained(tmp_path)
    r = load_readout(tmp_path, n_vocab=60)
    assert torch.equal(r.lm_head.weight, model.model.embed_tokens.weight)
    assert r.fingerprint() == model_fingerprint(model)
    x = torch.randn(3, 16)
    with torch.no_grad():
        want = model.lm_head(model.model.norm(x))
    assert torch.allclose(r.unembed(x), want) and r.n_vocab == 60


def test_refusals_name_the_directory(tiny_model_dir, tmp_path):
    with pytest.raises(ReadoutError, match="engine runs 7"):
        load_readout(tiny_model_dir, n_vocab=10, n_layers=7)
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(ReadoutError, match="no safetensors checkpoint"):
        load_readout(tmp_path, n_vocab=10)


def test_the_rank_table_refuses_lenses_that_read_the_blocks_on_a_readout():
    from probes.lenses import make_lenses, parse_lens_option
    from probes.model import ProbeError
    from probes.rank_table import module_lenses, refuse_module_lenses

    lenses = make_lenses(parse_lens_option(["logit", "jacobian=x.safetensors", "detached", "jvp"]))
    assert module_lenses(lenses) == ["detached", "jvp"]
    refuse_module_lenses(lenses[:2], "vllm")
    with pytest.raises(ProbeError, match=r"--lens detached,jvp reads the model's blocks.*--backend hf"):
        refuse_module_lenses(lenses, "vllm")
