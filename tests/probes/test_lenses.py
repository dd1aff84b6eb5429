"""Lenses on a tiny random Llama in float64, checked against independent references.

transformers' LlamaRMSNorm and eager softmax compute in float32 even in a float64 model; the fixture patches
both to keep the input dtype (test-only), so the comparisons hold to ~1e-10.
"""

from __future__ import annotations

import pytest
import torch

from memtoc.core.errors import MemtocError

from probes.fit import sequence_jacobians, valid_positions
from probes.lens import JacobianLens, LensCapture, forward_jvp, local_jvp_vectors
from memtoc.backends.hooks import site_hooks
from probes.model import (ModelParts, ProbeError, base_model, default_band, parse_sites, token_ranks,
                          vocab_ordering)


def _norm64(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(scope="module")
def tiny64():
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    mp = pytest.MonkeyPatch()
    mp.setattr(modeling_llama.LlamaRMSNorm, "forward", _norm64)
    softmax = torch.nn.functional.softmax
    mp.setattr(modeling_llama.nn.functional, "softmax",
               lambda x, dim=None, dtype=None, **kw: softmax(x, dim=dim, dtype=x.dtype if dtype is not None else None))

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=72, hidden_size=16, intermediate_size=40, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attn_implementation="eager", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.4)
    # 72 embedding rows, of which the "tokenizer" knows 64: rows 64..71 are padding.
    yield ModelParts.of(model, n_vocab=64)
    mp.undo()


def _states(parts, ids, mask=None):
    mask = torch.ones_like(ids) if mask is None else mask
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    out = {}
    with torch.no_grad(), site_hooks(parts.model, range(parts.n_sites), lambda s, h: out.__setitem__(s, h.clone())):
        res = parts.model(input_ids=ids, attention_mask=mask, position_ids=pos)
    return out, res.logits


def _run_from(parts, ids, site, value):
    """Last block output [1, T, d] when the state at ``site`` is replaced by ``value`` (all positions)."""
    got = {}

    def fn(s, h):
        if s == site:
            if s == parts.n_layers:
                got["out"] = value
            return value
        if s == parts.n_layers:
            got["out"] = h
        return None

    with site_hooks(parts.model, sorted({site, parts.n_layers}), fn):
        base_model(parts.model)(input_ids=ids)
    return got["out"]


def test_averaged_lens_estimator_equals_explicit_jacobian_average(tiny64):
    parts = tiny64
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (1, 9), generator=g), torch.randint(0, 64, (1, 7), generator=g)]
    skip = 2
    sites = [0, 1, 2]
    est = {s: torch.zeros(16, 16, dtype=torch.float64) for s in sites}
    ref = {s: torch.zeros(16, 16, dtype=torch.float64) for s in sites}
    for ids in prompts:
        contrib = sequence_jacobians(parts, ids, sites, skip_first=skip, batch_rows=5)
        P = valid_positions(ids.shape[1], skip)
        states, _ = _states(parts, ids)
        for s in sites:
            est[s] += contrib[s] / len(prompts)
            J = torch.autograd.functional.jacobian(lambda x: _run_from(parts, ids, s, x), states[s])[0, :, :, 0]
            # J[p', i, p, j] = d out[p', i] / d x_s[p, j]: sum over target positions, mean over source positions
            ref[s] += J[P][:, :, P].sum(0).mean(1) / len(prompts)
    for s in sites:
        assert ref[s].abs().max() > 0.1
        torch.testing.assert_close(est[s], ref[s], atol=1e-10, rtol=1e-9)
    # the one-row-at-a-time loop and the vmapped variant give the same rows
    ids = prompts[0]
    naive = sequence_jacobians(parts, ids, [1], skip_first=skip, batch_rows=1, rows=[0, 3, 7])
    vm = sequence_jacobians(parts, ids, [1], skip_first=skip, batch_rows=3, rows=[0, 3, 7], mode="vmap")
    full = sequence_jacobians(parts, ids, [1], skip_first=skip, batch_rows=16)
    torch.testing.assert_close(naive[1], full[1][[0, 3, 7]], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(vm[1], full[1][[0, 3, 7]], atol=1e-9, rtol=1e-9)


def test_too_short_sequence_contributes_nothing(tiny64):
    assert sequence_jacobians(tiny64, torch.tensor([[1, 2, 3]]), [0, 1], skip_first=2) is None


def test_detached_lens_exact_decomposition_identity(tiny64):
    parts = tiny64
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    states, _ = _states(parts, ids)
    L = parts.n_layers
    for s in range(L):
        # tangent = the whole state at every position: sum_p J^det[T, p] x_s[p] = x_L[T] (and at every T)
        primal, tan = forward_jvp(parts, batch, s, states[s].clone(), detached=True)
        torch.testing.assert_close(primal, states[L], atol=1e-10, rtol=0)
        torch.testing.assert_close(tan, states[L], atol=1e-10, rtol=1e-9)
        # ... while the non-detached Jacobian does not reproduce the state (the identity is not trivial)
        _, plain = forward_jvp(parts, batch, s, states[s].clone(), detached=False)
        assert (plain - states[L]).abs().max() > 1e-2


def test_detached_manual_route_equals_forward_ad_route(tiny64, read_lenses):
    parts = tiny64
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
    # at site 0 the self-contribution is a genuine transport, different from the raw state
    assert (got["detached"][0] - got["logit"][0]).abs().max() > 1e-2


def test_local_jvp_matches_finite_differences(tiny64):
    parts = tiny64
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(4))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    states, _ = _states(parts, ids)
    jvp = local_jvp_vectors(parts, batch, [0, 1, 2])
    detached = local_jvp_vectors(parts, batch, [0, 1, 2], detached=True)
    eps = 1e-3  # five-point central difference: truncation error O(eps^4)

    def F(site, delta):
        x = states[site].clone()
        x[:, -1] += delta
        with torch.no_grad():
            return _run_from(parts, ids, site, x)[:, -1]

    for s in (0, 1, 2):
        v = states[s][:, -1]
        fd = (8 * (F(s, eps * v) - F(s, -eps * v)) - (F(s, 2 * eps * v) - F(s, -2 * eps * v))) / (12 * eps)
        torch.testing.assert_close(jvp[s], fd, atol=1e-9, rtol=1e-8)
        assert (jvp[s] - detached[s]).abs().max() > 1e-3   # the local JVP is not the detached share


def test_every_lens_is_the_logit_lens_at_the_last_site(tiny64, tmp_path, read_lenses):
    parts = tiny64
    L = parts.n_layers
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(5))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    states, logits = _states(parts, ids)
    model_last = logits[:, -1]
    # unembed = the model's own final norm + head: the logit lens at site L is the model's output
    torch.testing.assert_close(parts.unembed(states[L][:, -1]), model_last, atol=1e-10, rtol=1e-10)
    lens = JacobianLens(matrices={s: torch.randn(16, 16, dtype=torch.float64) for s in range(L)})
    cap = LensCapture(parts, [L - 1, L], detached=True)
    with torch.no_grad(), cap.attach(parts, batch):
        base_model(parts.model)(input_ids=ids)
    vecs = read_lenses(parts, cap, ["logit", "jacobian", "detached"], lens)
    vecs["jvp"] = local_jvp_vectors(parts, batch, [L - 1, L])
    for kind, per_site in vecs.items():
        torch.testing.assert_close(parts.unembed(per_site[L]), model_last, atol=1e-10, rtol=1e-10, msg=kind)
    # one site lower they differ from each other (so the check above is not vacuous)
    assert (vecs["jacobian"][L - 1] - vecs["logit"][L - 1]).abs().max() > 1e-2


def test_rank_function_ties_and_padded_vocabulary_rows():
    logits = torch.tensor([[5.0, 1.0, 5.0, 3.0, 9.0, 100.0, 100.0]])   # ids 5, 6 are padded rows
    n_vocab = 5
    r = token_ranks(logits, [0, 2, 4, 3, 1], n_vocab)
    # id 4 is first; ids 0 and 2 tie for second (ties count in the token's favour); padded rows are ignored
    assert r.tolist() == [[2, 2, 1, 4, 5]]
    assert int(token_ranks(logits[0], 0, n_vocab)) == 2
    assert vocab_ordering(logits, n_vocab).tolist() == [[4, 0, 2, 3, 1]]
    with pytest.raises(ProbeError):
        token_ranks(logits, [5], n_vocab)     # a padded row is not a token
    # batched [S, V] with one id list: the same ids are ranked at every row
    two = torch.stack([logits[0], -logits[0]])
    assert token_ranks(two, [4], n_vocab)[:, 0].tolist() == [1, 5]


def test_rank_matches_sorted_position_on_random_logits():
    g = torch.Generator().manual_seed(6)
    z = torch.randn(3, 50, generator=g)
    order = vocab_ordering(z, 40)
    for i in range(3):
        for pos, tid in enumerate(order[i, :10].tolist()):
            assert int(token_ranks(z[i], tid, 40)) == pos + 1


def test_default_band_and_site_parsing():
    assert default_band(30) == (8, 27)
    assert default_band(3) == (1, 3)
    assert parse_sites(None, 30) == tuple(range(8, 28))
    assert parse_sites("8-10,12", 30) == (8, 9, 10, 12)
    with pytest.raises(MemtocError, match="31"):
        parse_sites("8-31", 30)


@pytest.mark.parametrize("mode", ["replicate", "vmap", "one_row"])
def test_every_fit_estimator_equals_the_explicit_jacobian(tiny64, mode):
    """All rows of one sequence's contribution, per estimator, against torch.autograd.functional.jacobian."""
    parts = tiny64
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    skip, sites = 2, [0, 2]
    est = sequence_jacobians(parts, ids, sites, skip_first=skip, batch_rows=6, mode=mode)
    P = valid_positions(ids.shape[1], skip)
    states, _ = _states(parts, ids)
    for s in sites:
        J = torch.autograd.functional.jacobian(lambda x: _run_from(parts, ids, s, x), states[s])[0, :, :, 0]
        ref = J[P][:, :, P].sum(0).mean(1)
        assert ref.abs().max() > 0.1
        torch.testing.assert_close(est[s], ref, atol=1e-10, rtol=1e-9)


def test_token_ranks_equal_the_broadcast_count_with_ties():
    """The searchsorted count against the direct ``1 + #{z > z[a]}`` on logits with many ties."""
    g = torch.Generator().manual_seed(11)
    z = torch.randint(-3, 4, (4, 5, 90), generator=g).float()
    for ids in (torch.randint(0, 80, (7,), generator=g), torch.randint(0, 80, (4, 5, 7), generator=g)):
        t = torch.gather(z[..., :80], -1, ids.expand(4, 5, 7))
        ref = 1 + (z[..., :80].unsqueeze(-2) > t.unsqueeze(-1)).sum(-1)
        assert torch.equal(token_ranks(z, ids, 80), ref)
