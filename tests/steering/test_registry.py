"""The edit-kind registry: the ``project`` kind of docs/extending.md (project a direction out), registered exactly
as the doc shows, validated, and run through the real hooks on the tiny model against an independent computation."""

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
def project_kind():
    """Execute the doc's module as ``steering.kinds.project`` (what the registration line would import)."""
    assert edit_kind("project") is None
    ns = {"__name__": "steering.kinds.project"}
    exec(compile(doc_block("steering/kinds/project.py"), "docs/extending.md:steering/kinds/project.py", "exec"), ns)
    try:
        yield ns["ProjectEdit"]
    finally:
        unregister_edit_kind("project")


def _axis(d: int, seed: int = 0) -> list[float]:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).tolist()


def _spec(**kw):
    spec = {"schema_version": "memtoc-edit-v1", "name": "ablate", "kind": "project", "layers": [2],
            "positions": "last_input", "strength": 1.0, "axis": [3.0, 4.0]}
    spec.update(kw)
    return spec


def test_the_doc_claims_two_files_and_its_registration_line_matches_the_package():
    """The doc's registration line is the package's real import line plus the new module; the section names the
    two files it touches, and they are the two titled blocks."""
    real = [ln for ln in KINDS_INIT.read_text(encoding="utf-8").splitlines() if ln.startswith("from steering.kinds")]
    assert real == ["from steering.kinds import direction, sae_clamp, function  # noqa: F401  (registration on import)"]
    assert doc_block("steering/kinds/__init__.py").strip() == real[0].replace("function", "function, project")
    section = DOC.read_text(encoding="utf-8").split("## Add a new edit kind")[1].split("\n## ")[0]
    titles = re.findall(r'```python title="([^"]+)"', section)
    assert titles == ["steering/kinds/project.py", "steering/kinds/__init__.py"]
    assert "**Files touched: 2** (`steering/kinds/project.py`, new; `steering/kinds/__init__.py`, one line)" in section
    assert not (KINDS_INIT.parent / "project.py").exists()      # the exercise is not done in the package itself


def test_builtin_kinds_are_registered():
    assert edit_kinds()[:3] == ("direction", "sae_clamp", "function")
    for name in ("direction", "sae_clamp", "function"):
        cls = edit_kind(name)
        assert issubclass(cls, Edit) and cls.kind == name


def test_the_doc_kind_validates_like_any_other(project_kind, tmp_path):
    assert "project" in edit_kinds() and project_kind.kind == "project"
    spec = validate_spec(_spec(axis=[1, 0]))
    assert spec["axis"] == [1.0, 0.0] and spec["apply_to_closed_book"] is False
    p = tmp_path / "ablate.json"
    p.write_text(json.dumps(_spec()))
    edit = load_edit(p)
    assert isinstance(edit, project_kind) and edit.toward is None and edit.has_row_appliers
    # its own field: errors name the file and the field
    for bad, why in (("big", "non-empty list of finite numbers"), ([], "non-empty list"),
                     ([1.0, float("nan")], "finite numbers"), ([0, 0.0], "all zeros")):
        p.write_text(json.dumps(_spec(axis=bad)))
        with pytest.raises(EditSpecError, match=why) as ei:
            load_edit(p)
        assert ei.value.field == "axis" and str(p) in str(ei.value)
    # a width that is not the model's is refused when the appliers are built, naming the field
    with pytest.raises(EditSpecError, match="axis has 2 numbers, the model's residual stream has 8"):
        edit.row_appliers(8, torch.device("cpu"), torch.float32)
    # the common fields are still checked first
    with pytest.raises(EditSpecError, match="field 'positions'"):
        validate_spec(_spec(positions="everywhere"))
    # its field on another kind is refused, naming the kind that owns it
    direction = {"schema_version": "memtoc-edit-v1", "name": "d", "kind": "direction", "layers": [1],
                 "positions": "last_input", "strength": 1.0, "scale": {"1": 1.0}, "axis": [1.0]}
    with pytest.raises(EditSpecError, match="field 'axis': belongs to kind 'project', not 'direction'"):
        validate_spec(direction)
    # a kind without a side cannot be swept toward memory or tool
    with pytest.raises(EditSpecError, match="no memory/tool side"):
        edit.steer("memory", 1.0)


def test_unknown_kind_names_the_file_and_the_registered_kinds(project_kind, tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps(_spec(kind="porject")))
    with pytest.raises(EditSpecError) as ei:
        load_edit(p)
    msg = str(ei.value)
    assert ei.value.field == "kind" and str(p) in msg
    assert "direction, sae_clamp, function, project" in msg and "'porject'" in msg


def test_registry_refuses_a_second_registration_and_non_edits(project_kind):
    with pytest.raises(ValueError, match="already registered"):
        register_edit_kind("project")(type("Other", (project_kind,), {}))
    with pytest.raises(TypeError, match="lacks"):
        register_edit_kind("nothing")(type("NotAnEdit", (), {}))
    assert edit_kind("nothing") is None and edit_kind("project") is project_kind


def _prompts(n=3):
    eps = build_episodes(load_benchmark("demo").questions[:n], formulations=("reference",),
                         conditions=("tool_wrong", "no_tool"))
    return [e.prompt for e in eps], [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]


def _positions(batch):
    mask = batch["attention_mask"]
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _projected(x: torch.Tensor, axis: list[float], strength: float) -> torch.Tensor:
    """``x - strength (x.u) u``, computed in float64 from the plain list (independent of the kind's code)."""
    u = torch.tensor(axis, dtype=torch.float64)
    u = u / u.norm()
    x64 = x.double()
    return (x64 - strength * (x64 @ u)[..., None] * u).to(x.dtype)


def _edited_site(model, batch, edit, site, tiny_backend, prompts, spans, strengths=None):
    """The output of block ``site - 1`` as block ``site`` receives it (a forward hook registered after the edit's)."""
    seen = {}

    def read(module, args, output):
        seen["h"] = (output[0] if isinstance(output, tuple) else output).detach().clone()
    with torch.no_grad(), edit.bind(prompts, spans, strengths=strengths).attach(tiny_backend, batch):
        handle = model.model.layers[site - 1].register_forward_hook(read)
        try:
            model(**batch, position_ids=_positions(batch))
        finally:
            handle.remove()
    return seen["h"]


def test_the_doc_kind_projects_u_out_at_exactly_the_planned_positions(project_kind, tiny_backend):
    """Site s >= 1 is the output of block s-1: the edited state equals the unedited ``output_hidden_states`` with
    ``x - strength (x.u) u`` applied at the last input position (the last column: left padding) and nothing else."""
    prompts, spans = _prompts()
    batch = tiny_backend.encode(prompts)
    model = tiny_backend.model
    d = model.config.hidden_size
    with torch.no_grad():
        plain = model(**batch, position_ids=_positions(batch), output_hidden_states=True).hidden_states
    for site, strength, seed in ((2, 1.0, 0), (1, 0.5, 1)):
        axis = _axis(d, seed)
        got = _edited_site(model, batch, edit_from_spec(_spec(layers=[site], axis=axis, strength=strength)), site,
                           tiny_backend, prompts, spans)
        want = plain[site].clone()
        want[:, -1] = _projected(plain[site][:, -1], axis, strength)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        u = torch.tensor(axis) / torch.tensor(axis).norm()
        before, after = plain[site][:, -1] @ u, got[:, -1] @ u
        assert before.abs().min() > 1e-3                               # there was something to remove
        torch.testing.assert_close(after, (1 - strength) * before, rtol=0, atol=1e-4)
        torch.testing.assert_close(got[:, :-1], plain[site][:, :-1], rtol=0, atol=0)   # other positions untouched


def test_the_doc_kind_carries_one_strength_per_row(project_kind, tiny_backend):
    """Strengths as rows (how sweeps batch): row b is projected with its own strength."""
    prompts, spans = _prompts()
    batch = tiny_backend.encode(prompts)
    model = tiny_backend.model
    axis = _axis(model.config.hidden_size, 2)
    strengths = [0.0, 1.0, 2.0, 0.5, -1.0, 1.0][:len(prompts)]
    with torch.no_grad():
        plain = model(**batch, position_ids=_positions(batch), output_hidden_states=True).hidden_states[2]
    got = _edited_site(model, batch, edit_from_spec(_spec(layers=[2], axis=axis)), 2, tiny_backend, prompts, spans,
                       strengths=strengths)
    for b, s in enumerate(strengths):
        want = plain[b].clone()
        want[-1] = _projected(plain[b, -1], axis, s)
        torch.testing.assert_close(got[b], want, rtol=0, atol=1e-5)


def test_the_doc_kind_at_strength_zero_leaves_generations_byte_identical(project_kind, tiny_backend):
    prompts, spans = _prompts()
    cfg = GenerationConfig(max_new_tokens=10)
    plain = tiny_backend.generate(prompts, cfg)
    axis = _axis(tiny_backend.model.config.hidden_size, 3)
    for positions in ("last_input", "from_tool_return"):
        edit = edit_from_spec(_spec(layers=[1, 2, 3], axis=axis, strength=0.0, positions=positions))
        calls = []
        orig = edit.appliers

        def appliers(model, _orig=orig):
            return {s: (lambda h, r, c, _fn=fn: calls.append(len(r)) or _fn(h, r, c)) for s, fn in _orig(model).items()}
        edit.appliers = appliers
        got = tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
        assert calls                                               # the hooks ran
        assert [(g.text, g.token_ids, g.stop_reason) for g in got] == \
            [(g.text, g.token_ids, g.stop_reason) for g in plain]
