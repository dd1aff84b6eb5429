"""The hf decoding loop against ``model.generate``: shared-prefix prefill and row compaction change nothing."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from memtoc.backends.decode import MIN_SHARED_PREFIX, GreedyDecoder, common_prefix_length
from memtoc.backends.tokens import left_pad
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes


def _rows(backend, n: int) -> list[list[int]]:
    eps = build_episodes(load_benchmark("demo").questions[:n], formulations=("reference",),
                         conditions=("tool_wrong", "tool_right"))
    return [backend.tokenizer(backend.format_prompt(e.prompt), add_special_tokens=False)["input_ids"] for e in eps]


def _reference(model, rows, pad_id, eos_id, max_new):
    """``model.generate`` on the left-padded batch, cut at the first end-of-sequence of each row."""
    ids, mask = left_pad(rows, pad_id, torch.device("cpu"))
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             num_beams=1, pad_token_id=pad_id, eos_token_id=eos_id,
                             temperature=None, top_p=None, top_k=None)
    res = []
    for row in out[:, ids.shape[1]:].tolist():
        res.append(row[:row.index(eos_id)] if eos_id in row else row)
    return res


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2   # each row keeps one own token
    assert common_prefix_length([[7], [7, 8]]) == 0
    assert common_prefix_length([]) == 0


@pytest.mark.parametrize("fast", [True, False])
def test_decoder_equals_model_generate(tiny_backend, fast):
    rows = _rows(tiny_backend, 4)
    assert common_prefix_length(rows) >= MIN_SHARED_PREFIX     # the shared-prefix pass is exercised
    assert len({len(r) for r in rows}) > 1                     # and the suffixes are padded
    model, pad = tiny_backend.model, tiny_backend.tokenizer.pad_token_id
    free = _reference(model, rows, pad, eos_id=-1 % len(tiny_backend.tokenizer), max_new=10)
    # Make rows stop at different steps: end-of-sequence = a token some (not all) rows produce early.
    counts = Counter(t for r in free for t in r[1:6])
    eos = next(t for t, _ in counts.most_common() if 0 < sum(t in r for r in free) < len(free))
    ref = _reference(model, rows, pad, eos, max_new=10)
    assert len({len(r) for r in ref}) > 1                      # rows really finish at different steps
    dec = GreedyDecoder(model, pad_id=pad, eos_ids={eos})
    got = dec.decode(rows, 10, fast=fast)
    assert [d.ids for d in got] == ref
    assert [d.stop for d in got] == ["eos" if len(r) < 10 else "max_tokens" for r in ref]


def test_shared_prefix_is_computed_once(tiny_backend):
    rows = _rows(tiny_backend, 3)
    widths: list[int] = []
    emb = tiny_backend.model.get_input_embeddings()
    h = emb.register_forward_hook(lambda m, a, o: widths.append(tuple(o.shape[:2])))
    try:
        dec = GreedyDecoder(tiny_backend.model, pad_id=tiny_backend.tokenizer.pad_token_id, eos_ids=set())
        got = dec.decode(rows, 20, is_done=lambda ids: len(ids) >= 2, fast=True)
    finally:
        h.remove()
    shared = common_prefix_length(rows)
    assert all(d.stop == "final_line" and len(d.ids) == 2 for d in got)
    # prefix once as a batch of one, then the padded suffixes, then one decoding step; then all rows are done
    assert widths == [(1, shared), (len(rows), max(len(r) for r in rows) - shared), (len(rows), 1)]


def test_is_done_stops_each_row_separately(tiny_backend):
    rows = _rows(tiny_backend, 3)
    dec = GreedyDecoder(tiny_backend.model, pad_id=tiny_backend.tokenizer.pad_token_id, eos_ids=set())
    full = dec.decode(rows, 8, fast=True)
    limits = {tuple(full[i].ids[:2 + i]): i for i in range(len(rows))}
    widths: list[int] = []
    h = tiny_backend.model.get_input_embeddings().register_forward_hook(lambda m, a, o: widths.append(o.shape[0]))
    try:
        got = dec.decode(rows, 8, is_done=lambda ids: tuple(ids) in limits, fast=True)
    finally:
        h.remove()
    assert [d.ids for d in got] == [full[i].ids[:2 + i] for i in range(len(rows))]
    assert widths[2:] == sorted(widths[2:], reverse=True) and widths[-1] < len(rows)   # rows were dropped


@pytest.mark.parametrize("positions", ["from_tool_return", "last_input"])
def test_compaction_under_an_edit_equals_the_static_batch(tiny_backend, positions):
    """Rows leave the batch at different steps; the edit follows them (select_rows) and every token equals the
    static batch's, where all rows stay to the end. The edit itself changes the output."""
    from steering.kinds.direction import DirectionEdit

    eps = build_episodes(load_benchmark("demo").questions[:3], formulations=("reference",),
                         conditions=("tool_wrong", "no_tool"))
    prompts = [e.prompt for e in eps]
    spans = [e.tool_output_span if e.with_tool_prompt is not None else None for e in eps]
    rows = [tiny_backend.tokenizer(tiny_backend.format_prompt(p), add_special_tokens=False)["input_ids"]
            for p in prompts]
    d = int(tiny_backend.model.config.hidden_size)
    vec = torch.randn(d, generator=torch.Generator().manual_seed(1))
    vec = vec / vec.norm()
    edit = DirectionEdit.build(name="r", layers=[1, 2], vectors={1: vec, 2: vec.clone()}, scale={1: 1.0, 2: 1.0},
                               positions=positions, strength=30.0)
    dec = GreedyDecoder(tiny_backend.model, pad_id=tiny_backend.tokenizer.pad_token_id, eos_ids=set())
    stop = lambda ids: len(ids) >= 2 + ids[0] % 7           # noqa: E731 - rows stop after 2..8 tokens
    batch = dict(zip(("input_ids", "attention_mask"), left_pad(rows, tiny_backend.tokenizer.pad_token_id,
                                                                torch.device("cpu"))))
    kept = []
    with edit.bind(prompts, spans).attach(tiny_backend, batch) as bound:
        def follow(keep):
            kept.append(list(keep))
            bound.select_rows(keep)
        got = dec.decode(rows, 12, is_done=stop, share_prefix=False, compact=True, on_compact=follow)
    with edit.bind(prompts, spans).attach(tiny_backend, batch):
        ref = dec.decode(rows, 12, is_done=stop, fast=False)
    plain = dec.decode(rows, 12, is_done=stop, fast=False)
    assert kept, "no row left the batch early; the test needs rows of different lengths"
    assert [g.ids for g in got] == [r.ids for r in ref]
    assert [g.ids for g in got] != [p.ids for p in plain]


def test_backend_generate_with_edit_compacts_and_matches_static(tiny_backend):
    from steering.kinds.direction import DirectionEdit

    eps = build_episodes(load_benchmark("demo").questions[:3], formulations=("reference",), conditions=("tool_wrong",))
    prompts = [e.prompt for e in eps]
    d = int(tiny_backend.model.config.hidden_size)
    vec = torch.randn(d, generator=torch.Generator().manual_seed(2))
    vec = vec / vec.norm()
    edit = DirectionEdit.build(name="r", layers=[2], vectors={2: vec}, scale={2: 1.0}, positions="from_tool_return",
                               strength=20.0)
    from memtoc.core.runtime import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=8)
    bound = edit.bind(prompts, [e.tool_output_span for e in eps])
    fast = tiny_backend.generate(prompts, cfg, edit=bound)
    tiny_backend.fast_decoding = False
    try:
        static = tiny_backend.generate(prompts, cfg, edit=edit.bind(prompts, [e.tool_output_span for e in eps]))
    finally:
        tiny_backend.fast_decoding = True
    assert fast == static


def test_repeated_prompts_prefill_each_prompt_once(tiny_backend):
    """Rows repeating a prompt (a sweep's strengths as rows) share the prompt's prefill up to its own limit: the
    common prefix once, each distinct prompt's tokens up to its limit once, then every row's suffix; the
    continuation equals ``model.generate`` on the plain batch, and the layout's shift is reported."""
    prompts = _rows(tiny_backend, 3)
    n = len(prompts)
    rows = prompts * 3                                        # three "strengths" of each prompt
    limits = [len(r) - 5 - i for i, r in enumerate(prompts)] * 3
    model, pad = tiny_backend.model, tiny_backend.tokenizer.pad_token_id
    widths: list[tuple[int, int]] = []
    told: list[tuple[int, ...]] = []
    h = model.get_input_embeddings().register_forward_hook(lambda m, a, o: widths.append(tuple(o.shape[:2])))
    try:
        got = GreedyDecoder(model, pad_id=pad, eos_ids=set()).decode(
            rows, 6, fast=True, row_prefix_limits=limits, on_prefix=lambda *a: told.append(a))
    finally:
        h.remove()
    assert [d.ids for d in got] == _reference(model, rows, pad, eos_id=-1 % len(tiny_backend.tokenizer), max_new=6)
    shared = common_prefix_length(prompts)
    own = limits[:n]
    width = shared + max(o - shared for o in own)
    suffix = max(len(r) - o for r, o in zip(prompts, own))
    assert widths[:3] == [(1, shared), (n, width - shared), (3 * n, suffix)]
    assert told == [(width, width + suffix - max(len(r) for r in prompts))]


def test_distinct_prompts_keep_the_one_shared_prefix(tiny_backend):
    """Without a repeated prompt the row limits change nothing: one shared prefix, then the suffixes."""
    rows = _rows(tiny_backend, 3)
    dec = GreedyDecoder(tiny_backend.model, pad_id=tiny_backend.tokenizer.pad_token_id, eos_ids=set())
    told: list[tuple[int, ...]] = []
    dec.decode(rows, 2, fast=True, row_prefix_limits=[len(r) - 1 for r in rows],
               on_prefix=lambda *a: told.append(a))
    assert told == [(common_prefix_length(rows),)]
