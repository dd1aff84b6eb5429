"""``mt.trace``: activations and logits of one's own prompts, named as TransformerLens names them, read through
the backend seam. References are independent: transformers' ``output_hidden_states`` and logits, the residual
identity ``resid_post = resid_pre + attn_out + mlp_out`` of a pre-norm block, and a hand-added vector."""

from __future__ import annotations

import pytest
import torch

import memtoc as mt
from memtoc.api.tracing import TraceError

TEXTS = ["The capital of France is", "FINAL: Paris"]


def _hf(backend, ids):
    with torch.no_grad():
        return backend.model(input_ids=torch.tensor([ids]), output_hidden_states=True)


def test_trace_sites_equal_output_hidden_states_and_logits(tiny_backend) -> None:
    t = mt.trace(tiny_backend, TEXTS, sites=[0, 1, 2, 3, "ln_final.hook_normalized"])
    assert t.names == ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                       "blocks.2.hook_resid_post", "ln_final.hook_normalized")
    for row, ids in enumerate(t.tokens):
        ref = _hf(tiny_backend, ids)
        pad = t.activations[t.names[0]].shape[1] - len(ids)
        # sites 0..L-1: hidden_states[s]; the embedding exactly, the blocks to float32 round-off (a batched forward
        # blocks its matmuls differently from a one-prompt forward: measured differences up to 1.2e-5)
        assert torch.equal(t[t.names[0]][row, pad:], ref.hidden_states[0][0])
        for s in (1, 2):
            assert torch.allclose(t[t.names[s]][row, pad:], ref.hidden_states[s][0], rtol=1e-5, atol=5e-5)
        # the last site is the raw block output; transformers' hidden_states[L] is final-normed
        assert torch.allclose(t["ln_final.hook_normalized"][row, pad:], ref.hidden_states[3][0], atol=1e-5)
        normed = tiny_backend.model.model.norm(t["blocks.2.hook_resid_post"][row, pad:])
        assert torch.allclose(normed, ref.hidden_states[3][0], atol=1e-5)
        assert torch.allclose(t.logits[row, pad:], ref.logits[0], atol=1e-5)


def test_raw_text_by_default_chat_template_only_when_asked(tiny_backend) -> None:
    tok = tiny_backend.tokenizer
    raw = mt.trace(tiny_backend, "Hello there", positions="last")
    assert raw.tokens == [tok("Hello there")["input_ids"]]           # no template, no system prompt
    chat = mt.trace(tiny_backend, "Hello there", positions="last", chat_template=True)
    templated = tok.apply_chat_template([{"role": "user", "content": "Hello there"}], tokenize=False,
                                        add_generation_prompt=True)
    assert chat.texts == [templated] and chat.tokens[0] != raw.tokens[0]
    assert raw["blocks.0.hook_resid_post"].shape == (1, 1, tiny_backend.parts.d_model)
    by_ids = mt.trace(tiny_backend, raw.tokens, positions="last")        # token ids give the same forward
    assert torch.equal(by_ids["blocks.2.hook_resid_post"], raw["blocks.2.hook_resid_post"])
    one = mt.trace(tiny_backend, raw.tokens[0], positions="last")        # one prompt's ids, unwrapped
    assert one.tokens == raw.tokens


def test_attention_and_mlp_outputs_sum_to_the_block_output(tiny_backend) -> None:
    t = mt.trace(tiny_backend, TEXTS, sites="all+parts")
    for b in range(3):
        pre = t["blocks.0.hook_resid_pre"] if b == 0 else t[f"blocks.{b - 1}.hook_resid_post"]
        total = pre + t[f"blocks.{b}.hook_attn_out"] + t[f"blocks.{b}.hook_mlp_out"]
        assert torch.allclose(total, t[f"blocks.{b}.hook_resid_post"], atol=1e-5)
    assert t.paths["blocks.1.hook_attn_out"] == "model.layers.1.self_attn.output"
    assert t.paths["blocks.0.hook_resid_pre"] == "model.layers.0.input"
    table = mt.hook_names(tiny_backend)
    assert list(table.loc[table.site.notna(), "name"]) == ["blocks.0.hook_resid_pre"] + [
        f"blocks.{b}.hook_resid_post" for b in range(3)]


def test_an_edit_is_applied_without_bind(tiny_backend) -> None:
    d = tiny_backend.parts.d_model
    v = torch.zeros(d)
    v[0] = 5.0

    def push(site, hidden, positions):
        return hidden + v.to(hidden)

    edit = mt.function_edit(push, layers=[2], positions="last_input")
    base = mt.trace(tiny_backend, TEXTS, sites=[2, 3], positions="last")
    edited = mt.trace(tiny_backend, TEXTS, sites=[2, 3], positions="last", edit=edit)
    assert torch.allclose(edited["blocks.1.hook_resid_post"], base["blocks.1.hook_resid_post"] + v, atol=1e-6)
    assert not torch.allclose(edited["blocks.2.hook_resid_post"], base["blocks.2.hook_resid_post"])
    out = tiny_backend.forward(TEXTS, edit=edit)                           # backend.forward takes it too
    plain = tiny_backend.forward(TEXTS)
    assert not torch.allclose(out["last_logits"], plain["last_logits"])


def test_bad_requests_name_the_value(tiny_backend) -> None:
    with pytest.raises(TraceError, match="blocks.9.hook_resid_post"):
        mt.trace(tiny_backend, "x", sites=["blocks.9.hook_resid_post"])
    with pytest.raises(TraceError, match="position 40"):
        mt.trace(tiny_backend, "x", positions=[40])
    with pytest.raises(TraceError, match="chat_template=True"):
        mt.trace(tiny_backend, [[{"role": "user", "content": "x"}]])


@pytest.mark.real_model
def test_default_model_trace_equals_output_hidden_states(default_backend) -> None:
    t = mt.trace(default_backend, "The Eiffel Tower is in the city of", sites="all")
    ref = _hf(default_backend, t.tokens[0])
    n = default_backend.parts.n_sites
    assert t.names[0] == "blocks.0.hook_resid_pre" and t.names[-1] == f"blocks.{n - 2}.hook_resid_post"
    assert len(t.names) == n == len(ref.hidden_states)
    for s in range(n - 1):
        assert torch.equal(t[t.names[s]][0], ref.hidden_states[s][0]), t.names[s]
    assert torch.allclose(default_backend.parts.final_norm(t[t.names[-1]][0]), ref.hidden_states[-1][0], atol=1e-5)
    assert torch.allclose(t.logits[0], ref.logits[0], atol=1e-4)


def test_an_edit_is_taken_as_every_api_function_takes_it(tiny_backend, tmp_path) -> None:
    """An edit object, its spec file (str or ``pathlib.Path``) give one trace; a bare callable is refused with the
    hint the other API functions give."""
    from steering.kinds.direction import save_direction_edit

    v = torch.zeros(tiny_backend.parts.d_model)
    v[1] = 3.0
    edit = mt.vector_edit({2: v})
    spec = save_direction_edit(tmp_path / "push.json", edit)
    got = [mt.trace(tiny_backend, TEXTS, sites=[2], positions="last", edit=e)["blocks.1.hook_resid_post"]
           for e in (edit, spec, str(spec))]
    base = mt.trace(tiny_backend, TEXTS, sites=[2], positions="last")["blocks.1.hook_resid_post"]
    assert torch.allclose(got[0], base + v, atol=1e-6)
    assert all(torch.equal(g, got[0]) for g in got[1:])
    with pytest.raises(mt.APIError, match="function_edit"):
        mt.trace(tiny_backend, TEXTS, edit=lambda site, h, pos: h)


@pytest.mark.parametrize("kw, message", [
    ({"prompts": 123}, "prompts: give a string, a list of strings, token ids or conversations; got int 123"),
    ({"prompts": [""]}, r"prompt 0 \(''\) has no tokens"),
    ({"prompts": ["x", 7]}, "prompt 1: 7 is neither a string, token ids nor a conversation"),
    ({"prompts": torch.zeros(1, 3)}, r"an integer \[batch, pos\] or \[pos\] tensor, got torch.float32 of shape \(1, 3\)"),
    ({"prompts": [[5, 999999]]}, r"prompt 0: token id 999999 is outside the vocabulary \(0\.\.\d+\)"),
    ({"prompts": [[-1, 2]]}, r"prompt 0: token id -1 is outside the vocabulary"),
    ({"sites": []}, "sites is empty"),
    ({"sites": -1}, r"site -1: this model has sites 0\.\.3 \(0 = embedding output\)"),
    ({"sites": 1.5}, "sites: 1.5 is not 'all', 'all\\+parts', a site number"),
    ({"sites": [True]}, "sites: True is not"),
    ({"positions": "first"}, "positions: 'first' is not 'all', 'last', a token index"),
    ({"positions": [0, 1.5]}, "positions: 1.5 is not"),
    ({"positions": []}, "positions is empty"),
    ({"chat_template": "yes"}, "chat_template must be True or False, got 'yes'"),
])
def test_a_bad_argument_is_one_trace_error_naming_it(tiny_backend, kw, message) -> None:
    args = {"prompts": "x y", **kw}
    with pytest.raises(TraceError, match=message):
        mt.trace(tiny_backend, args.pop("prompts"), **args)


def test_prompt_tokens_refuses_what_is_no_prompt(tiny_backend) -> None:
    with pytest.raises(TraceError, match="a prompt is a string or a conversation .*got int 5"):
        mt.prompt_tokens(tiny_backend, 5)
    assert mt.prompt_tokens(tiny_backend, "x") == list(tiny_backend.encode(["x"]).rows[0])
