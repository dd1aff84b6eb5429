"""Captured residuals equal transformers' own ``output_hidden_states`` of a plain forward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from activations.capture import LayerSpecError, ResidualCapture, parse_layers
from memtoc.backends.hf_plans import capture_sites
from memtoc.backends.hooks import site_hooks as hook_sites
from memtoc.backends.parts import decoder_layers, n_sites
from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from memtoc.core.errors import MemtocError


def _episodes(n_questions, conditions=("tool_wrong", "no_tool", "tool_error")):
    return build_episodes(load_benchmark("demo").questions[:n_questions], formulations=("reference",),
                          conditions=conditions)


def _reference_hidden_states(backend, prompts):
    """A plain forward with output_hidden_states on a batch built by ``encode`` (no hooks of ours)."""
    batch = backend.encode(prompts)
    mask = batch["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = backend.model(**batch, position_ids=pos, output_hidden_states=True, use_cache=False)
    return batch, out.hidden_states


def _final_norm(model):
    return model.get_decoder().norm


def _assert_capture_matches(backend, episodes, kinds, *, rtol, atol):
    prompts = [e.prompt for e in episodes]
    spans = [e.tool_output_span if e.with_tool_prompt is not None else None for e in episodes]
    L = n_sites(backend.model) - 1
    cap = ResidualCapture(range(L + 1), kinds, prompts=prompts, tool_spans=spans)
    backend.forward(prompts, capture=cap)
    batch, hs = _reference_hidden_states(backend, prompts)
    assert len(hs) == L + 1
    sel = cap.selection
    rows, cols = torch.as_tensor(sel.row), torch.as_tensor(sel.column)
    # The selection points at the tokens it claims (left padding: last_input is the last column).
    assert torch.equal(batch["input_ids"][rows, cols].cpu(), torch.as_tensor(sel.token_id))
    last = sel.kind == "last_input"
    assert (sel.column[last] == batch["input_ids"].shape[1] - 1).all()
    for site in range(L):          # embeddings and blocks 0..L-2: raw hidden_states[site]
        torch.testing.assert_close(cap.values[site], hs[site][rows, cols].cpu(), rtol=rtol, atol=atol)
    # The last site is the raw (pre-norm) block output; hidden_states[L] is final-norm of it.
    raw_last = cap.values[L]
    normed = _final_norm(backend.model)(raw_last.to(backend.device)).cpu()
    torch.testing.assert_close(normed, hs[L][rows, cols].cpu(), rtol=rtol, atol=atol)
    assert not torch.allclose(raw_last, hs[L][rows, cols].cpu(), rtol=1e-2, atol=1e-2)
    # Different sites really are different layers (a capture of the wrong site would not match above).
    assert not torch.allclose(cap.values[1], cap.values[2])
    return cap


def test_tiny_capture_equals_hidden_states_every_site_and_position(tiny_backend):
    eps = _episodes(3)
    cap = _assert_capture_matches(tiny_backend, eps, "last_input,tool_span,from_tool_return,all", rtol=1e-5, atol=1e-6)
    assert set(cap.selection.kind) == {"last_input", "tool_span", "from_tool_return", "all"}
    assert len({lay.n_pad for lay in cap.layouts}) > 1          # the batch was padded
    for r, lay in enumerate(cap.layouts):                        # 'all' covers each real token exactly once
        cols = cap.selection.column[(cap.selection.row == r) & (cap.selection.kind == "all")]
        assert cols.tolist() == list(range(lay.n_pad, lay.n_pad + lay.n_prompt))


def test_tiny_capture_in_a_padded_batch_equals_capture_alone(tiny_backend):
    eps = _episodes(2, conditions=("tool_wrong", "no_tool"))
    prompts = [e.prompt for e in eps]
    spans = [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]
    cap = ResidualCapture([0, 2, 3], "tool_span,last_input", prompts=prompts, tool_spans=spans)
    tiny_backend.forward(prompts, capture=cap)
    assert max(lay.n_pad for lay in cap.layouts) > 0
    for r, (p, sp) in enumerate(zip(prompts, spans)):
        alone = ResidualCapture([0, 2, 3], "tool_span,last_input", prompts=[p], tool_spans=[sp])
        tiny_backend.forward([p], capture=alone)
        mine = cap.selection.row == r
        assert alone.selection.token_index.tolist() == cap.selection.token_index[mine].tolist()
        for s in (0, 2, 3):
            torch.testing.assert_close(cap.values[s][torch.as_tensor(mine)], alone.values[s], rtol=1e-4, atol=1e-5)


def test_tiny_generated_tokens_align_with_generation(tiny_backend):
    eps = _episodes(2, conditions=("tool_wrong",))
    prompts = [e.prompt for e in eps]
    gens = tiny_backend.generate(prompts, GenerationConfig(max_new_tokens=6, stop_at_final_line=False))
    conts = [list(g.token_ids) for g in gens]
    assert all(conts) and len({len(c) for c in conts}) >= 1
    L = n_sites(tiny_backend.model) - 1
    cap = ResidualCapture(range(L + 1), "generated,last_input", prompts=prompts)
    tiny_backend.forward(prompts, capture=cap, continuations=conts)
    tok = tiny_backend.tokenizer
    for r, (p, cont) in enumerate(zip(prompts, conts)):
        mine = (cap.selection.row == r) & (cap.selection.kind == "generated")
        assert cap.selection.token_id[mine].tolist() == cont            # aligned to the generated ids
        # Independent reference: one unpadded row, prompt ids + generated ids, plain forward.
        prompt_ids = tok(tiny_backend.format_prompt(p), add_special_tokens=False)["input_ids"]
        assert cap.selection.token_index[mine].tolist() == list(range(len(prompt_ids), len(prompt_ids) + len(cont)))
        ids = torch.tensor([prompt_ids + cont])
        with torch.inference_mode():
            hs = tiny_backend.model(input_ids=ids, output_hidden_states=True).hidden_states
        for s in range(L):
            torch.testing.assert_close(cap.values[s][torch.as_tensor(mine)], hs[s][0, len(prompt_ids):],
                                       rtol=1e-4, atol=1e-5)
        # The last prompt token (where generation started) is unchanged by the appended tokens.
        li = (cap.selection.row == r) & (cap.selection.kind == "last_input")
        torch.testing.assert_close(cap.values[1][torch.as_tensor(li)], hs[1][0, len(prompt_ids) - 1:len(prompt_ids)],
                                   rtol=1e-4, atol=1e-5)


def test_teacher_forced_generated_rows_equal_the_states_seen_during_generation(tiny_backend):
    """The residual at generated token k equals what the KV-cached greedy loop computed when k was fed in."""
    prompt = _episodes(1, conditions=("tool_wrong",))[0].prompt
    steps = []
    with hook_sites(tiny_backend.model, [2], lambda site, h: steps.append(h.detach().clone())):
        gen = tiny_backend.generate([prompt], GenerationConfig(max_new_tokens=6, stop_at_final_line=False))[0]
    ids = list(gen.token_ids)
    assert len(ids) >= 3
    cap = ResidualCapture([2], "generated", prompts=[prompt])
    tiny_backend.forward([prompt], capture=cap, continuations=[ids])
    # steps[0] is the prefill; step j >= 1 fed generated token j-1. The last generated token is never fed.
    during = torch.cat([h[0, -1:] for h in steps[1:len(ids)]])
    torch.testing.assert_close(cap.values[2][: len(ids) - 1], during, rtol=1e-4, atol=1e-5)


@pytest.mark.real_model
def test_default_model_capture_equals_hidden_states(default_backend):
    eps = _episodes(1, conditions=("tool_wrong", "no_tool"))     # two prompts of different lengths
    assert n_sites(default_backend.model) == 31
    _assert_capture_matches(default_backend, eps, "last_input,tool_span", rtol=1e-4, atol=1e-4)


# -- hook machinery ---------------------------------------------------------------------------------------

def test_hooks_are_removed_when_the_forward_raises(tiny_backend):
    layers = decoder_layers(tiny_backend.model)
    # transformers 5 keeps its own output-recording hooks installed; ours must be gone afterwards.
    before = [(set(m._forward_hooks), set(m._forward_pre_hooks)) for m in layers]

    def boom(site, hidden):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        with hook_sites(tiny_backend.model, [0, 1, 3], boom):
            tiny_backend.forward(["hello"])
    assert [(set(m._forward_hooks), set(m._forward_pre_hooks)) for m in layers] == before
    cap = ResidualCapture([1], "last_input", prompts=["hello"])
    with pytest.raises(RuntimeError, match="boom"):
        with hook_sites(tiny_backend.model, [2], boom):
            tiny_backend.forward(["hello"], capture=cap)
    assert [(set(m._forward_hooks), set(m._forward_pre_hooks)) for m in layers] == before


class _TupleBlock(nn.Module):
    """A block in the pre-5.x style: returns ``(hidden, extra)``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, hidden_states):
        return hidden_states * self.scale + 1.0, None


class _ToyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([_TupleBlock(2.0), _TupleBlock(3.0)])

    def forward(self, x):
        for block in self.model.layers:
            x = block(x)[0]
        return x


def test_tuple_block_outputs_are_accepted():
    toy = _ToyLM()
    x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([3, 0, 2])
    with capture_sites(toy, [0, 1, 2], rows, cols) as got:
        toy(x)
    h1 = x * 2 + 1
    h2 = h1 * 3 + 1
    for site, ref in ((0, x), (1, h1), (2, h2)):
        assert torch.equal(got[site], ref[rows, cols])


def test_parse_layers():
    assert parse_layers("all", 4) == (0, 1, 2, 3)
    assert parse_layers("last", 31) == (30,)
    assert parse_layers("0, 5-7,6,last", 31) == (0, 5, 6, 7, 30)
    assert parse_layers([3, 1], 4) == (1, 3)
    for bad, msg in (("4", "unknown layer '4'"), ("-1", "unknown layer"), ("2-1", "start after end"),
                     ("x", "bad layer"), ("", "empty layer selection"), (" , ", "empty layer selection")):
        with pytest.raises(LayerSpecError, match=msg):
            parse_layers(bad, 4)
    assert issubclass(LayerSpecError, MemtocError)
