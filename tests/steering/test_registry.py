"""The edit-kind registry: the toy ``scale`` kind of docs/extending.md, registered exactly as the doc shows,
validated, and run through the real hooks on the tiny model against an independent forward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from steering import EditSpecError, edit_kinds, load_edit
from steering.edits import Edit, edit_from_spec
from steering.registry import edit_kind, register_edit_kind, unregister_edit_kind
from steering.spec import validate_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
KINDS_INIT = Path(__file__).resolve().parents[2] / "steering" / "kinds" / "__init__.py"


def doc_block(title: str) -> str:
    """The ```python title="..."``` code block of docs/extending.md with that title."""
    m = re.search(r'```python title="' + re.escape(title) + r'"\n(.*?)```', DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/extending.md has no code block titled {title}"
    return m.group(1)


@pytest.fixture(scope="module")
def scale_kind():
    """Execute the doc's module as ``steering.kinds.scale`` (what the registration line would import)."""
    assert edit_kind("scale") is None
    ns = {"__name__": "steering.kinds.scale"}
    exec(compile(doc_block("steering/kinds/scale.py"), "docs/extending.md:steering/kinds/scale.py", "exec"), ns)
    try:
        yield ns["ScaleEdit"]
    finally:
        unregister_edit_kind("scale")


def _spec(**kw):
    spec = {"schema_version": "memtoc-edit-v1", "name": "halve", "kind": "scale", "layers": [2],
            "positions": "last_input", "strength": 1.0, "factor": 0.5}
    spec.update(kw)
    return spec


def test_registration_line_in_the_doc_matches_the_package():
    """The doc's registration line is the package's real import line plus the new module."""
    real = [ln for ln in KINDS_INIT.read_text(encoding="utf-8").splitlines() if ln.startswith("from steering.kinds")]
    assert real == ["from steering.kinds import direction, sae_clamp, function  # noqa: F401  (registration on import)"]
    assert doc_block("steering/kinds/__init__.py").strip() == real[0].replace("function", "function, scale")


def test_builtin_kinds_are_registered():
    assert edit_kinds()[:3] == ("direction", "sae_clamp", "function")
    for name in ("direction", "sae_clamp", "function"):
        cls = edit_kind(name)
        assert issubclass(cls, Edit) and cls.kind == name


def test_toy_kind_validates_like_any_other(scale_kind, tmp_path):
    assert "scale" in edit_kinds() and scale_kind.kind == "scale"
    spec = validate_spec(_spec(factor=2))
    assert spec["factor"] == 2.0 and spec["apply_to_closed_book"] is False
    p = tmp_path / "halve.json"
    p.write_text(json.dumps(_spec()))
    edit = load_edit(p)
    assert isinstance(edit, scale_kind) and edit.multiplier == 0.5 and edit.toward is None
    assert edit.with_strength(0).multiplier == 1.0 and edit.with_strength(2).multiplier == 0.0
    # its own field: errors name the file and the field
    p.write_text(json.dumps(_spec(factor="big")))
    with pytest.raises(EditSpecError) as ei:
        load_edit(p)
    assert ei.value.field == "factor" and str(p) in str(ei.value)
    # the common fields are still checked first
    with pytest.raises(EditSpecError, match="field 'positions'"):
        validate_spec(_spec(positions="everywhere"))
    # its field on another kind is refused, naming the kind that owns it
    direction = {"schema_version": "memtoc-edit-v1", "name": "d", "kind": "direction", "layers": [1],
                 "positions": "last_input", "strength": 1.0, "scale": {"1": 1.0}, "factor": 2.0}
    with pytest.raises(EditSpecError, match="field 'factor': belongs to kind 'scale', not 'direction'"):
        validate_spec(direction)
    # a kind without a side cannot be swept toward memory or tool
    with pytest.raises(EditSpecError, match="no memory/tool side"):
        edit.steer("memory", 1.0)


def test_unknown_kind_names_the_file_and_the_registered_kinds(scale_kind, tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps(_spec(kind="scael")))
    with pytest.raises(EditSpecError) as ei:
        load_edit(p)
    msg = str(ei.value)
    assert ei.value.field == "kind" and str(p) in msg
    assert "direction, sae_clamp, function, scale" in msg and "'scael'" in msg


def test_registry_refuses_a_second_registration_and_non_edits(scale_kind):
    with pytest.raises(ValueError, match="already registered"):
        register_edit_kind("scale")(type("Other", (scale_kind,), {}))
    with pytest.raises(TypeError, match="lacks"):
        register_edit_kind("nothing")(type("NotAnEdit", (), {}))
    assert edit_kind("nothing") is None and edit_kind("scale") is scale_kind


def _prompts(n=3):
    eps = build_episodes(load_benchmark("demo").questions[:n], formulations=("reference",),
                         conditions=("tool_wrong", "no_tool"))
    return [e.prompt for e in eps], [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]


def _positions(batch):
    mask = batch["attention_mask"]
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def test_toy_kind_at_site_0_equals_a_forward_on_scaled_embeddings(scale_kind, tiny_backend):
    """Site 0 is the embedding output: the edited forward must equal a plain forward whose input embeddings have
    the last input position (the last column: left padding) scaled by m -- every hidden state and the logits."""
    prompts, spans = _prompts()
    batch = tiny_backend.encode(prompts)
    model = tiny_backend.model
    m = 1.0 + 2.0 * (-1.0 - 1.0)
    edit = edit_from_spec(_spec(layers=[0], factor=-1.0, strength=2.0))
    with torch.no_grad():
        with edit.bind(prompts, spans).attach(tiny_backend, batch):
            got = model(**batch, position_ids=_positions(batch), output_hidden_states=True)
        emb = model.get_input_embeddings()(batch["input_ids"])
        emb[:, -1] = emb[:, -1] * m
        want = model(inputs_embeds=emb, attention_mask=batch["attention_mask"], position_ids=_positions(batch),
                     output_hidden_states=True)
        plain = model(**batch, position_ids=_positions(batch))
    for s in range(1, len(want.hidden_states)):
        torch.testing.assert_close(got.hidden_states[s], want.hidden_states[s], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5)
    assert (got.logits[:, -1] - plain.logits[:, -1]).abs().max() > 1e-3      # the edit matters
    torch.testing.assert_close(got.logits[:, :-1], plain.logits[:, :-1], rtol=0, atol=1e-5)   # causal


def test_toy_kind_at_a_block_output_scales_exactly_the_selected_positions(scale_kind, tiny_backend):
    """Site s >= 1 is the output of block s-1: read with a plain forward hook registered after the edit's hooks
    (so it sees what block s receives) and compared with ``output_hidden_states`` of an unedited forward."""
    prompts, spans = _prompts()
    batch = tiny_backend.encode(prompts)
    model = tiny_backend.model
    with torch.no_grad():
        plain = model(**batch, position_ids=_positions(batch), output_hidden_states=True).hidden_states
    for site, factor, strength in ((2, 0.5, 1.0), (1, 3.0, 0.5)):
        edit = edit_from_spec(_spec(layers=[site], factor=factor, strength=strength))
        m = 1.0 + strength * (factor - 1.0)
        seen = {}

        def read(module, args, output, _site=site):
            seen[_site] = (output[0] if isinstance(output, tuple) else output).detach().clone()
        with torch.no_grad(), edit.bind(prompts, spans).attach(tiny_backend, batch):
            handle = model.model.layers[site - 1].register_forward_hook(read)
            try:
                model(**batch, position_ids=_positions(batch))
            finally:
                handle.remove()
        want = plain[site].clone()
        want[:, -1] = want[:, -1] * m
        torch.testing.assert_close(seen[site], want, rtol=0, atol=1e-6)
        assert not torch.equal(seen[site], plain[site])


def test_toy_kind_with_factor_one_leaves_generations_byte_identical(scale_kind, tiny_backend):
    prompts, spans = _prompts()
    cfg = GenerationConfig(max_new_tokens=10)
    plain = tiny_backend.generate(prompts, cfg)
    for positions in ("last_input", "from_tool_return"):
        edit = edit_from_spec(_spec(layers=[1, 2, 3], factor=1.0, strength=7.0, positions=positions))
        calls = []
        orig = edit.appliers

        def appliers(model, _orig=orig):
            return {s: (lambda h, r, c, _fn=fn: calls.append(len(r)) or _fn(h, r, c)) for s, fn in _orig(model).items()}
        edit.appliers = appliers
        got = tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
        assert calls                                               # the hooks ran
        assert [(g.text, g.token_ids, g.stop_reason) for g in got] == \
            [(g.text, g.token_ids, g.stop_reason) for g in plain]
