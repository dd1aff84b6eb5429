"""Activation and attribution patching (probes.patching) on a model built so that one block carries the decision.

Every attention output projection but block K's is zeroed: before block K each position depends on its own token
only, and after it the final position no longer reads other positions. So, for a pair differing in one input
token, exact patching must find (analytically, not approximately): the final position's residual restores the
clean metric from block K on and does nothing before it; only block K's attention output matters at the final
position; the differing token's residual restores it before block K and does nothing after; the question tokens
(identical in both sequences) never matter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probes.patching import PatchPair, attribution_patching, effect_table, exact_patching, hook_names_for

K = 2


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=64)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.4)
        for b, layer in enumerate(m.model.layers):
            if b != K:
                layer.self_attn.o_proj.weight.zero_()
    return m


@pytest.fixture(scope="module")
def pair() -> PatchPair:
    clean = [5, 9, 12, 20, 7, 3, 11, 2]
    corrupt = [5, 9, 12, 30, 7, 3, 11, 2]
    return PatchPair("q1|reference", clean, corrupt,
                     {"question": ([0, 1, 2], [0, 1, 2]), "tool_span": ([3], [3]), "final": ([7], [7])},
                     answer_ids=(4, 6))


def test_exact_patching_finds_the_block_that_carries_the_decision(model, pair) -> None:
    names = hook_names_for(4)
    res = exact_patching(model, pair, names, batch_rows=7)
    gap = res.gap
    assert abs(gap) > 1e-3
    e = res.effects
    for b in range(4):
        assert e[f"blocks.{b}.hook_resid_post"]["final"] == pytest.approx(gap if b >= K else 0.0, abs=1e-4)
        assert e[f"blocks.{b}.hook_attn_out"]["final"] == pytest.approx(gap if b == K else 0.0, abs=1e-4)
        assert e[f"blocks.{b}.hook_resid_post"]["tool_span"] == pytest.approx(gap if b < K else 0.0, abs=1e-4)
        for kind in ("hook_resid_post", "hook_attn_out", "hook_mlp_out"):
            assert e[f"blocks.{b}.{kind}"]["question"] == pytest.approx(0.0, abs=1e-5)
        if b < K:
            assert e[f"blocks.{b}.hook_mlp_out"]["final"] == pytest.approx(0.0, abs=1e-5)


def test_attribution_patching_ranks_the_same_top_cell_and_is_exactly_zero_where_nothing_differs(model, pair) -> None:
    names = hook_names_for(4)
    exact = effect_table([exact_patching(model, pair, names)], names)[0]
    approx = effect_table([attribution_patching(model, pair, names)], names)[0]
    top_exact = np.unravel_index(np.nanargmax(np.abs(exact[:, 1:])), exact[:, 1:].shape)
    top_attr = np.unravel_index(np.nanargmax(np.abs(approx[:, 1:])), approx[:, 1:].shape)
    # the top cell by attribution is one whose exact effect is the full gap
    assert abs(exact[:, 1:][top_attr]) == pytest.approx(abs(exact[:, 1:][top_exact]), rel=1e-4)
    assert np.allclose(approx[:, 0], 0.0, atol=1e-6)          # question tokens: identical activations
    j = names.index(f"blocks.{K - 1}.hook_attn_out")
    assert approx[j, 2] == 0.0                                # a zeroed attention output differs nowhere


def test_attribution_is_exact_for_a_linear_readout(model, pair) -> None:
    """At the last block's residual output the metric is a function of the final position alone: the
    first-order estimate at the final position equals a finite-difference check of the same gradient."""
    name = "blocks.3.hook_resid_post"
    approx = attribution_patching(model, pair, [name]).effects[name]["final"]
    exact = exact_patching(model, pair, [name]).effects[name]["final"]
    assert np.sign(approx) == np.sign(exact) and abs(approx) > 0


def test_a_hook_that_does_not_fire_is_an_error(model, pair) -> None:
    from probes.model import ProbeError

    with pytest.raises(Exception) as exc:
        exact_patching(model, pair, ["blocks.9.hook_resid_post"])
    assert isinstance(exc.value, (ProbeError,)) or "blocks 0..3" in str(exc.value)


def test_direct_logit_attribution_adds_up_to_the_metric(model, pair) -> None:
    """The frozen-scale decomposition is exact: embedding + every attention and MLP output = logit(a) - logit(b),
    and the heads of a block add up to its attention output (no output-projection bias in Llama)."""
    from probes.patching import direct_logit_attribution

    comps, heads, metric = direct_logit_attribution(model, pair.corrupt_ids, *pair.answer_ids)
    assert sum(comps.values()) == pytest.approx(metric, abs=1e-4)
    for b in range(4):
        assert heads[b].sum() == pytest.approx(comps[f"blocks.{b}.hook_attn_out"], abs=1e-4)
    assert all(abs(comps[f"blocks.{b}.hook_attn_out"]) < 1e-6 for b in range(4) if b != K)


def test_attention_mass_is_a_probability(model, pair) -> None:
    from probes.patching import attention_mass

    mass = attention_mass(model, pair.corrupt_ids, query=7, keys=[3])
    everything = attention_mass(model, pair.corrupt_ids, query=7, keys=list(range(8)))
    assert mass.shape == (4, 4) and np.all((mass >= 0) & (mass <= 1 + 1e-6))
    assert np.allclose(everything, 1.0, atol=1e-5)
