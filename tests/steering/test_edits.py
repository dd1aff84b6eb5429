"""Edits applied through the backend: exact deltas at exact positions, KV-cache semantics, strength 0, SAE clamp."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from memtoc.backends.hooks import site_hooks as hook_sites
from memtoc.backends.parts import n_sites
from activations.positions import layout_backend_batch
from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from steering import DirectionEdit, EditSpecError, SAEClampEdit
from memtoc.backends.hooks import hidden_of, replace_hidden

SPEC_VERSION = "memtoc-edit-v1"


def _episodes(n_questions=2, conditions=("tool_wrong", "no_tool", "tool_right")):
    eps = build_episodes(load_benchmark("demo").questions[:n_questions], formulations=("reference",),
                         conditions=conditions)
    prompts = [e.prompt for e in eps]
    spans = [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]
    return prompts, spans


def _unit(d, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def _direction(layers, positions, strength=1.0, d=32, scale=2.5):
    return DirectionEdit.build(name="test-direction", layers=layers, vectors={s: _unit(d, s) for s in layers},
                               scale={s: scale + s for s in layers}, positions=positions, strength=strength)


class FullCapture:
    """Records the full ``[B, T, d]`` residual at some sites; attached after the edit, so it reads the edited stream."""

    def __init__(self, sites):
        self.sites = sites
        self.values = {}

    @contextmanager
    def attach(self, backend, batch):
        def fn(site, hidden):
            self.values[site] = hidden.detach().clone().cpu()
        with hook_sites(backend.model, self.sites, fn):
            yield self


def _expected_columns(backend, prompts, spans, batch, positions):
    """Per row, the padded columns an edit at ``positions`` must touch (from the row layouts)."""
    lays = layout_backend_batch(backend, prompts, batch, spans)
    T = batch["input_ids"].shape[1]
    out = []
    for lay in lays:
        if positions == "last_input":
            cols = [lay.n_pad + lay.n_prompt - 1]
            assert cols == [T - 1]                       # left padding: the last prompt token is the last column
        else:
            span = lay.tool_token_span()
            if span is None:
                cols = []
            elif positions == "tool_span":
                cols = list(range(lay.n_pad + span[0], lay.n_pad + span[1]))
            else:
                cols = list(range(lay.n_pad + span[0], T))
        out.append((lay.n_pad, cols))
    return out


@pytest.mark.parametrize("positions", ["last_input", "tool_span", "from_tool_return"])
def test_direction_edit_adds_exactly_the_vector_at_exactly_the_positions(tiny_backend, positions):
    prompts, spans = _episodes()
    L = n_sites(tiny_backend.model) - 1
    sites = list(range(L + 1))
    for edit_site in (0, 2):                         # site 0 = input of block 0 (pre-hook); 2 = output of block 1
        edit = _direction([edit_site], positions, strength=1.7)
        plain, edited = FullCapture(sites), FullCapture(sites)
        out = tiny_backend.forward(prompts, capture=plain)
        tiny_backend.forward(prompts, capture=edited, edit=edit.bind(prompts, spans))
        expected = _expected_columns(tiny_backend, prompts, spans, out, positions)
        assert any(n_pad > 0 for n_pad, _ in expected)               # the batch really is left padded
        assert any(cols for _, cols in expected) and any(not cols for _, cols in expected) == (positions != "last_input")
        vec = edit.delta(edit_site)
        assert torch.allclose(vec, 1.7 * (2.5 + edit_site) * _unit(32, edit_site))
        for site in sites:
            delta = edited.values[site] - plain.values[site]
            for r, (_n_pad, cols) in enumerate(expected):
                mask = torch.zeros(delta.shape[1], dtype=torch.bool)
                mask[cols] = True
                if site < edit_site:
                    assert torch.equal(delta[r], torch.zeros_like(delta[r]))
                elif site == edit_site:
                    # exactly the vector at exactly the selected columns, nothing anywhere else
                    if cols:
                        torch.testing.assert_close(delta[r, mask], vec.expand(len(cols), -1), rtol=0, atol=2e-6)
                    assert torch.equal(delta[r, ~mask], torch.zeros_like(delta[r, ~mask]))
                else:
                    # later sites see the propagated change: none before the first edited column (causal), left
                    # padding included; a change at the edited columns
                    first = cols[0] if cols else delta.shape[1]
                    assert torch.equal(delta[r, :first], torch.zeros_like(delta[r, :first]))
                    if cols:
                        assert delta[r, cols[0]:].abs().max() > 1e-3
            # padding columns are never edited
            for r, (n_pad, _) in enumerate(expected):
                assert torch.equal(delta[r, :n_pad], torch.zeros_like(delta[r, :n_pad]))


def _record_calls(edit):
    """Wrap the edit's appliers so every call (chunk length, rows, cols) is recorded."""
    calls = []
    orig = edit.appliers

    def appliers(model):
        out = {}
        for s, fn in orig(model).items():
            def rec(h, rows, cols, _fn=fn, _s=s):
                calls.append((_s, h.shape[1], rows.tolist(), cols.tolist()))
                return _fn(h, rows, cols)
            out[s] = rec
        return out
    edit.appliers = appliers
    return calls


def _teacher_forced_greedy(backend, prompts, gens, bound_factory):
    """Recompute every generated token without a KV cache (prompt + prefix, full forward) under the edit."""
    n = max(len(g.token_ids) for g in gens)
    for k in range(n):
        conts = [list(g.token_ids[:k]) for g in gens]
        out = backend.forward(prompts, continuations=conts, edit=bound_factory())
        pred = out["last_logits"].argmax(-1).tolist()
        for r, g in enumerate(gens):
            if k < len(g.token_ids):
                assert pred[r] == g.token_ids[k], (r, k)


@pytest.mark.parametrize("positions", ["from_tool_return", "last_input"])
def test_kv_cache_generation_edits_the_right_passes(tiny_backend, positions):
    prompts, spans = _episodes(2, conditions=("tool_wrong", "no_tool"))
    cfg = GenerationConfig(max_new_tokens=6, stop_at_final_line=False)
    edit = _direction([1, 2], positions, strength=12.0)
    calls = _record_calls(edit)
    gens = tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
    plain = tiny_backend.generate(prompts, cfg)
    assert [g.token_ids for g in gens] != [g.token_ids for g in plain]     # the edit matters
    batch = tiny_backend.encode(prompts)
    T = batch["input_ids"].shape[1]
    expected = _expected_columns(tiny_backend, prompts, spans, batch, positions)
    prompt_calls = [c for c in calls if c[1] == T]
    step_calls = [c for c in calls if c[1] == 1]
    assert len(prompt_calls) == 2 and len(prompt_calls) + len(step_calls) == len(calls)
    for _, _, rows, cols in prompt_calls:
        assert sorted(zip(rows, cols)) == sorted((r, c) for r, (_, cs) in enumerate(expected) for c in cs)
    if positions == "last_input":
        assert step_calls == []                                  # decoding steps are not edited
    else:
        n_steps = max(g.n_new_tokens for g in gens) - 1
        assert n_steps >= 1 and len(step_calls) == 2 * n_steps  # every generated token, at both sites
        tool_rows = [r for r, s in enumerate(spans) if s is not None]
        assert all(rows == tool_rows and cols == [0] * len(tool_rows) for _, _, rows, cols in step_calls)
    # The cached generation equals a recomputation without the cache under the same edit.
    edit.appliers = type(edit).appliers.__get__(edit)
    _teacher_forced_greedy(tiny_backend, prompts, gens, lambda: edit.bind(prompts, spans))


def test_zero_strength_generation_is_byte_identical(tiny_backend):
    prompts, spans = _episodes(3, conditions=("tool_wrong", "no_tool", "tool_error"))
    cfg = GenerationConfig(max_new_tokens=12)
    plain = tiny_backend.generate(prompts, cfg)
    assert len({len(p) for p in prompts}) > 1
    for positions in ("last_input", "from_tool_return"):
        edit = _direction([1, 2, 3], positions, strength=5.0)
        zero = edit.with_strength(0.0)
        calls = _record_calls(zero)
        got = tiny_backend.generate(prompts, cfg, edit=zero.bind(prompts, spans))
        assert calls                                                   # the hooks ran
        assert [(g.text, g.token_ids, g.stop_reason) for g in got] == \
            [(g.text, g.token_ids, g.stop_reason) for g in plain]
        strong = tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
        assert [g.token_ids for g in strong] != [g.token_ids for g in plain]


def test_hook_keeps_the_block_output_container():
    h = torch.ones(1, 2, 3)
    for out in (h, (h, "attn"), [h, None]):
        hidden = hidden_of(out)
        assert hidden is h
        new = replace_hidden(out, h + 1)
        assert type(new) is type(out)
        if not isinstance(out, torch.Tensor):
            assert torch.equal(new[0], h + 1) and new[1] == out[1]


def test_tuple_returning_blocks_are_edited(tiny_model_dir):
    """Older transformers blocks return tuples; the hook edits the first element and keeps the rest."""
    from memtoc.backends.hf import HFBackend
    from memtoc.backends.parts import decoder_layers

    backend = HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")
    prompts, spans = _episodes(1, conditions=("tool_wrong",))
    block = decoder_layers(backend.model)[0]
    seen = []

    def as_tuple(module, args, output):
        return (output, "extra")

    def unwrap(module, args, output):       # registered last: what the next block receives must be a tensor
        seen.append(type(output))
        return output[0]
    edit = _direction([1], "last_input", strength=3.0)
    plain = backend.forward(prompts)["last_logits"]
    h1 = block.register_forward_hook(as_tuple)
    try:
        bound = edit.bind(prompts, spans)
        with bound.attach(backend, backend.encode(prompts)):
            h2 = block.register_forward_hook(unwrap)
            try:
                with torch.inference_mode():
                    batch = backend.encode(prompts)
                    mask = batch["attention_mask"]
                    pos = (mask.cumsum(-1) - 1).clamp(min=0)
                    edited = backend.model(**batch, position_ids=pos, use_cache=False).logits[:, -1]
            finally:
                h2.remove()
    finally:
        h1.remove()
    assert seen == [tuple]
    ref = backend.forward(prompts, edit=edit.bind(prompts, spans))["last_logits"]
    torch.testing.assert_close(edited, ref)
    assert not torch.allclose(edited, plain)


# ---------------------------------------------------------------------------------------------------------------
# SAE clamp

def _identity_sae(d):
    from sae_lens import StandardSAE, StandardSAEConfig

    sae = StandardSAE(StandardSAEConfig(d_in=d, d_sae=d))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae


def _clamp_spec(site, remove, remove_t, add, add_t, *, strength=1.0, positions="from_tool_return", **kw):
    spec = {"schema_version": SPEC_VERSION, "name": "clamp", "kind": "sae_clamp", "layers": [site],
            "positions": positions, "strength": strength, "sae": {str(site): {"path": "unused"}},
            "features": {str(site): {"remove": remove, "remove_targets": remove_t, "add": add, "add_targets": add_t}},
            "steer_toward": "memory", "fvu": {str(site): 0.1}}
    spec.update(kw)
    return spec


def test_sae_clamp_with_identity_dictionary_changes_only_the_clamped_features(tiny_backend):
    prompts, spans = _episodes(2, conditions=("tool_wrong", "no_tool"))
    site, d = 2, 32
    remove, add = [0, 1, 2, 3], [4, 5, 6, 7]
    plain = FullCapture([site])
    out = tiny_backend.forward(prompts, capture=plain)
    h = plain.values[site]
    # targets near the typical activation, so both clamp branches occur (z above and below the target)
    typical = float(h[..., :8].abs().median())
    targets = [typical * f for f in (0.5, 1.0, 1.5, 2.0)]
    strength = 1.3
    edit = SAEClampEdit(_clamp_spec(site, remove, targets, add, targets, strength=strength),
                        saes={site: _identity_sae(d)})
    edited = FullCapture([site])
    tiny_backend.forward(prompts, capture=edited, edit=edit.bind(prompts, spans))
    h2 = edited.values[site]
    expected = _expected_columns(tiny_backend, prompts, spans, out, "from_tool_return")
    v = strength * torch.tensor(targets)
    saw = {"rm_low": 0, "rm_high": 0, "add_low": 0, "add_high": 0}
    for r, (_, cols) in enumerate(expected):
        mask = torch.zeros(h.shape[1], dtype=torch.bool)
        mask[cols] = True
        assert torch.equal(h2[r, ~mask], h[r, ~mask])                     # other positions untouched
        if not cols:
            continue
        x, y = h[r, mask], h2[r, mask]
        other = [j for j in range(d) if j not in remove + add]
        assert torch.equal(y[:, other], x[:, other])                      # other features untouched
        z = torch.relu(x)
        zr, za = z[:, remove], z[:, add]
        # removal lowers a coordinate by min(v, z); addition raises z to max(z, v)
        torch.testing.assert_close(y[:, remove], x[:, remove] - torch.minimum(v, zr), rtol=0, atol=1e-5)
        torch.testing.assert_close(y[:, add], x[:, add] + torch.clamp(v - za, min=0), rtol=0, atol=1e-5)
        pos = x[:, add] >= 0
        torch.testing.assert_close(y[:, add][pos], torch.maximum(za, v.expand_as(za))[pos], rtol=0, atol=1e-5)
        saw["rm_low"] += int((zr < v).sum())
        saw["rm_high"] += int((zr > v).sum())
        saw["add_low"] += int((za < v).sum())
        saw["add_high"] += int((za > v).sum())
    assert all(n > 0 for n in saw.values()), saw
    # strength 0 leaves the stream untouched (and swapping roles swaps the sets)
    zero = FullCapture([site])
    tiny_backend.forward(prompts, capture=zero, edit=edit.with_strength(0.0).bind(prompts, spans))
    assert torch.equal(zero.values[site], h)
    sw = edit.swapped()
    assert sw.spec["features"][str(site)]["remove"] == add and sw.spec["steer_toward"] == "tool"
    assert edit.steer("memory", 2.0).spec["features"] == edit.spec["features"]
    assert edit.steer("tool", 2.0).spec["features"] == sw.spec["features"]


def test_sae_clamp_from_disk_checks_the_training_site(tiny_backend, tmp_path):
    import json

    from steering import load_edit
    from steering.spec import save_spec

    prompts, spans = _episodes(1, conditions=("tool_wrong",))
    sae = _identity_sae(32)
    sae.save_model(str(tmp_path / "sae_site2"))
    cfg_path = tmp_path / "sae_site2" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("metadata", {})["hook_name"] = "blocks.1.hook_resid_post"      # output of block 1 = site 2
    cfg_path.write_text(json.dumps(cfg))
    spec = _clamp_spec(2, [0], [1.0], [1], [2.0], positions="last_input")
    spec["sae"] = {"2": {"path": "sae_site2"}}
    save_spec(tmp_path / "edit.json", spec)
    edit = load_edit(tmp_path / "edit.json")
    out = tiny_backend.forward(prompts, edit=edit.bind(prompts, spans))
    assert out["last_logits"].shape[0] == 1
    # the same SAE applied at another site is refused
    spec["layers"] = [3]
    for key in ("sae", "features", "fvu"):
        spec[key] = {"3": spec[key]["2"]}
    save_spec(tmp_path / "edit3.json", spec)
    with pytest.raises(EditSpecError, match=r"sae\.3.*site 2"):
        tiny_backend.forward(prompts, edit=load_edit(tmp_path / "edit3.json").bind(prompts, spans))
    # feature ids beyond d_sae are refused before any model is involved
    spec3 = json.loads((tmp_path / "edit.json").read_text())
    spec3["features"]["2"]["add"] = [40]
    (tmp_path / "bad.json").write_text(json.dumps(spec3))
    with pytest.raises(EditSpecError, match=r"features\.2.*d_sae 32"):
        load_edit(tmp_path / "bad.json")


def test_edit_on_a_site_the_model_lacks_is_refused(tiny_backend):
    prompts, spans = _episodes(1, conditions=("tool_wrong",))
    edit = _direction([9], "last_input")
    with pytest.raises(EditSpecError, match="layers"):
        tiny_backend.forward(prompts, edit=edit.bind(prompts, spans))
    wrong_width = DirectionEdit.build(name="w", layers=[1], vectors={1: _unit(16, 0)}, scale={1: 1.0})
    with pytest.raises(EditSpecError, match="width 16"):
        tiny_backend.forward(prompts, edit=wrong_width.bind(prompts, spans))


@pytest.mark.real_model
def test_default_model_edit_semantics(default_backend):
    """On the embedded default model: strength 0 is byte-identical; a from_tool_return edit generated with the KV
    cache equals its recomputation without the cache."""
    prompts, spans = _episodes(1, conditions=("tool_wrong", "no_tool"))
    d = default_backend.model.config.hidden_size
    sites = [8, 12]
    edit = DirectionEdit.build(name="default", layers=sites, vectors={s: _unit(d, s) for s in sites},
                               scale={s: 8.0 for s in sites}, positions="from_tool_return", strength=1.0)
    cfg = GenerationConfig(max_new_tokens=3, stop_at_final_line=False)
    plain = default_backend.generate(prompts, cfg)
    zero = default_backend.generate(prompts, cfg, edit=edit.with_strength(0.0).bind(prompts, spans))
    assert [(g.text, g.token_ids) for g in zero] == [(g.text, g.token_ids) for g in plain]
    gens = default_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
    assert [g.token_ids for g in gens] != [g.token_ids for g in plain]
    _teacher_forced_greedy(default_backend, prompts, gens, lambda: edit.bind(prompts, spans))


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8 dtype")
def test_a_direction_is_rounded_to_the_activation_dtype_not_a_float8_parameter_dtype():
    """An FP8 checkpoint's first parameter is float8 while its stream is bfloat16: the added vector is the float32
    delta rounded once to bfloat16 (as on a bfloat16 model), never through float8 first; the hf path's dtype
    (``memtoc.backends.hf_plans.model_device_dtype``) of such a model is float32."""
    from memtoc.backends.hf_plans import model_device_dtype as _model_device_dtype
    from memtoc.backends.plans import EditRows

    fp8 = torch.float8_e4m3fn
    u = _unit(32, 3)
    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: u}, scale={1: 3.0}, strength=1.0)
    fn = edit.row_appliers(32, torch.device("cpu"), fp8)[1]
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    rows = torch.arange(4)
    same = fn(x, EditRows(rows=rows, cols=rows, strength=torch.ones(4, dtype=torch.float64), scalar=1.0))
    assert torch.equal(same, x + (3.0 * u).to(torch.bfloat16))
    assert not torch.equal(same, x + (3.0 * u).to(fp8).to(torch.bfloat16))      # what float8 rounding gives
    s = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=torch.float64)
    per_row = fn(x, EditRows(rows=rows, cols=rows, strength=s, scalar=None))
    assert torch.equal(per_row, x + ((s * 3.0).to(torch.float32)[:, None] * u).to(torch.bfloat16))
    model = torch.nn.Linear(4, 4).to(fp8)
    assert _model_device_dtype(model) == (torch.device("cpu"), torch.float32)
    assert _model_device_dtype(torch.nn.Linear(4, 4).to(torch.bfloat16))[1] == torch.bfloat16
