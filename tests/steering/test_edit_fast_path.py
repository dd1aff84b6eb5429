"""Edited decoding on the fast path (shared-prefix prefill up to the first edited token, row compaction) and
strengths as rows of one batch: both give exactly the records of the reference paths.

References, computed here with the code path edited calls had before: ``share_edited_prefix = False`` (a full
left-padded prefill under the edit, rows still compacted), each strength run alone, and one prompt at a time.
"""

from __future__ import annotations

import pytest
import torch

from memtoc.core.runtime import GenerationConfig
from memtoc.backends.decode import MIN_SHARED_PREFIX
from memtoc.backends.plans import EditPlan
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from steering import DirectionEdit, SAEClampEdit
from steering.edits import Edit
from steering.kinds.function import FunctionEdit

POSITIONS = ("last_input", "tool_span", "from_tool_return")
SITES = [1, 2]


def _episodes(n_questions=3, conditions=("tool_wrong", "tool_right", "tool_error")):
    eps = build_episodes(load_benchmark("demo").questions[:n_questions], formulations=("reference",),
                         conditions=conditions)
    return [e.prompt for e in eps], [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]


def _unit(d, seed):
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def _random_sae(d, seed):
    from sae_lens import StandardSAE, StandardSAEConfig

    torch.manual_seed(seed)
    sae = StandardSAE(StandardSAEConfig(d_in=d, d_sae=2 * d))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.3)
    return sae.eval()


def scale_up(site, hidden, positions):
    """A function edit: push the stream along itself."""
    return hidden * 1.5


def _edit(kind, positions, d, strength):
    if kind == "direction":
        return DirectionEdit.build(name="fast", layers=SITES, vectors={s: _unit(d, s) for s in SITES},
                                   scale={s: 3.0 + s for s in SITES}, positions=positions, strength=strength)
    if kind == "sae_clamp":
        feats = {str(s): {"remove": [0, 1, 2, 3], "remove_targets": [0.5, 1.0, 1.5, 2.0], "add": [4, 5, 6, 7],
                          "add_targets": [2.0, 3.0, 4.0, 5.0]} for s in SITES}
        spec = {"schema_version": "memtoc-edit-v1", "name": "fast-clamp", "kind": "sae_clamp", "layers": SITES,
                "positions": positions, "strength": strength, "sae": {str(s): {"path": "in-memory"} for s in SITES},
                "features": feats, "steer_toward": "memory", "force": True}
        return SAEClampEdit(spec, saes={s: _random_sae(d, s) for s in SITES})
    return FunctionEdit.build(scale_up, layers=SITES, positions=positions, strength=strength)


def _view(rows):
    return [(g.text, g.token_ids, g.stop_reason, g.n_prompt_tokens, g.n_new_tokens) for g in rows]


def _generate(backend, prompts, cfg, bound, *, share):
    from memtoc.backends.hf_plans import HookState

    prefixes = []
    orig = HookState.use_prefix

    def spy(self, n, *shift):
        prefixes.append(n if not shift else (n, *shift))
        orig(self, n, *shift)
    HookState.use_prefix = spy
    backend.share_edited_prefix = share
    try:
        return _view(backend.generate(prompts, cfg, edit=bound)), prefixes
    finally:
        HookState.use_prefix = orig
        backend.share_edited_prefix = True


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("kind", ["direction", "sae_clamp", "function"])
def test_fast_path_records_equal_the_full_prefill(tiny_backend, kind, positions):
    prompts, spans = _episodes()
    cfg = GenerationConfig(max_new_tokens=10, stop_at_final_line=False)
    d = int(tiny_backend.model.config.hidden_size)
    strength = {"direction": 12.0, "sae_clamp": 3.0, "function": 2.0}[kind]
    edit = _edit(kind, positions, d, strength)
    fast, shared = _generate(tiny_backend, prompts, cfg, edit.bind(prompts, spans), share=True)
    ref, unshared = _generate(tiny_backend, prompts, cfg, edit.bind(prompts, spans), share=False)
    assert fast == ref
    assert unshared == []
    if kind == "function":
        assert shared == []           # the callable sees chunk columns: never a shared prefix
    else:
        assert shared and shared[0] >= MIN_SHARED_PREFIX   # the shared-prefix prefill really ran under the edit
    plain = _view(tiny_backend.generate(prompts, cfg))
    assert fast != plain              # and the edit changes the output


@pytest.mark.parametrize("positions", POSITIONS)
def test_fast_path_equals_one_prompt_at_a_time(tiny_backend, positions):
    prompts, spans = _episodes(2)
    cfg = GenerationConfig(max_new_tokens=8, stop_at_final_line=False)
    edit = _edit("direction", positions, int(tiny_backend.model.config.hidden_size), 12.0)
    fast = _view(tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, spans)))
    alone = [_view(tiny_backend.generate([p], cfg, edit=edit.bind([p], [s])))[0] for p, s in zip(prompts, spans)]
    assert fast == alone


def test_prefix_stops_at_the_first_edited_token(tiny_backend):
    """A tool_span edit inside the shared prefix cuts the shared prefix at the tool output's first token."""
    prompts, spans = _episodes(2, conditions=("tool_wrong", "tool_right"))
    edit = _edit("direction", "tool_span", int(tiny_backend.model.config.hidden_size), 1.0)
    bound = edit.bind(prompts, spans)
    batch = tiny_backend.encode(prompts)
    with bound.attach(tiny_backend, batch):
        limit = min(EditPlan(bound.edit, bound.plan).row_prefix_limits())
        plan = bound.plan
    first = min(int(plan.prompt_mask[b].nonzero()[0][0]) - int(plan.n_pad[b]) for b in range(plan.batch_size))
    assert limit == first
    assert not plan.prompt_mask[:, :0].any()


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("kind", ["direction", "sae_clamp", "function"])
def test_strengths_as_rows_equal_each_strength_alone(tiny_backend, kind, positions):
    prompts, spans = _episodes()
    cfg = GenerationConfig(max_new_tokens=8, stop_at_final_line=False)
    edit = _edit(kind, positions, int(tiny_backend.model.config.hidden_size), 1.0)
    strengths = {"direction": [0.0, 4.0, -6.0, 12.0], "sae_clamp": [0.0, 1.0, 3.0], "function": [0.0, 1.0, 2.5]}[kind]
    alone = {s: _view(tiny_backend.generate(prompts, cfg, edit=edit.with_strength(s).bind(prompts, spans)))
             for s in strengths}
    rows_p = [p for _ in strengths for p in prompts]
    rows_s = [s for s in strengths for _ in prompts]
    rows_t = [t for _ in strengths for t in spans]
    joint, told = _generate(tiny_backend, rows_p, cfg, edit.bind(rows_p, rows_t, strengths=rows_s), share=True)
    if kind != "function":       # each prompt prefilled once up to its first edited token (the grouped prefill)
        assert told and isinstance(told[0], tuple) and told[0][0] > 0
    n = len(prompts)
    for i, s in enumerate(strengths):
        assert joint[i * n:(i + 1) * n] == alone[s], s
    assert len({tuple(v) for v in alone.values()}) > 1      # the strengths really differ
    assert alone[0.0] == _view(tiny_backend.generate(prompts, cfg))


def test_row_strengths_follow_row_compaction(tiny_backend):
    """Rows stop at different steps (an end-of-sequence token some rows produce early) and leave the batch; each
    remaining row keeps its own strength."""
    from collections import Counter

    prompts, spans = _episodes(2)
    cfg = GenerationConfig(max_new_tokens=10, stop_at_final_line=False)
    edit = _edit("direction", "from_tool_return", int(tiny_backend.model.config.hidden_size), 1.0)
    strengths = [2.0, 9.0]
    free = [g.token_ids for s in strengths
            for g in tiny_backend.generate(prompts, cfg, edit=edit.with_strength(s).bind(prompts, spans))]
    counts = Counter(t for r in free for t in r[1:6])
    eos = next(t for t, _ in counts.most_common() if 0 < sum(t in r for r in free) < len(free))
    gen_cfg = tiny_backend.model.generation_config
    old = gen_cfg.eos_token_id
    gen_cfg.eos_token_id = int(eos)
    try:
        rows_p, rows_s = prompts * 2, [s for s in strengths for _ in prompts]
        joint = _view(tiny_backend.generate(rows_p, cfg, edit=edit.bind(rows_p, spans * 2, strengths=rows_s)))
        alone = [r for s in strengths
                 for r in _view(tiny_backend.generate(prompts, cfg, edit=edit.with_strength(s).bind(prompts, spans)))]
    finally:
        gen_cfg.eos_token_id = old
    assert len({r[4] for r in joint}) > 1          # rows really left the batch at different steps
    assert joint == alone


def test_a_kind_without_row_appliers_runs_one_strength_per_batch(tiny_backend):
    from memtoc.backends.base import InterventionUnsupportedError

    class ColumnsOnly(DirectionEdit):
        """A kind that only overrides the column hook (the older kind interface)."""

        row_appliers = Edit.row_appliers

        def appliers(self, model):
            return {}

    prompts, spans = _episodes(1)
    base = _edit("direction", "last_input", int(tiny_backend.model.config.hidden_size), 1.0)
    edit = ColumnsOnly(base.spec, vectors=base.vectors)
    assert base.has_row_appliers and not edit.has_row_appliers
    cfg = GenerationConfig(max_new_tokens=2, stop_at_final_line=False)
    with pytest.raises(InterventionUnsupportedError, match="one strength per batch"):
        tiny_backend.generate(prompts * 2, cfg, edit=edit.bind(prompts * 2, spans * 2,
                                                               strengths=[1.0] * len(prompts) + [2.0] * len(prompts)))
