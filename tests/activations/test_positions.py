"""Position selectors: offsets -> token indices, checked by decoding the selected tokens of padded batches."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from activations.positions import (PositionSelector, PositionSpecError, char_span_to_tokens, layout_backend_batch,
                                   parse_positions, user_span_in_text)
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episode, build_episodes
from memtoc.core.errors import MemtocError
from memtoc.bench.prompts import dump_json
from memtoc.core.vocab import FORMULATIONS
from memtoc.bench.questions import load_release_episodes


def _batches(items, size):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _check_tool_spans(backend, episodes, batch_size):
    """For every tool episode: the tool_span tokens, read from the padded batch tensor, decode to the output."""
    checked = 0
    # Shuffle lengths together so every batch pads some rows.
    for batch_eps in _batches(episodes, batch_size):
        prompts = [e.prompt for e in batch_eps]
        spans = [e.tool_output_span if e.with_tool_prompt is not None else None for e in batch_eps]
        batch = backend.encode(prompts)
        ids = batch["input_ids"].cpu().numpy()
        mask = batch["attention_mask"].cpu().numpy()
        layouts = layout_backend_batch(backend, prompts, batch, spans)
        sel = PositionSelector.parse("tool_span,last_input,all,from_tool_return")
        for r, (ep, lay) in enumerate(zip(batch_eps, layouts)):
            width = ids.shape[1]
            n_real = int(mask[r].sum())
            assert lay.n_pad == width - n_real
            last = lay.columns(lay.select("last_input"))
            assert last.tolist() == [width - 1]                      # left padding: last column of every row
            assert lay.columns(lay.select("all")).tolist() == list(range(width - n_real, width))
            tool = lay.select("tool_span")
            if ep.tool_output is None:
                assert tool.size == 0 and lay.select("from_tool_return").size == 0
                continue
            cols = lay.columns(tool)
            assert np.all(mask[r, cols] == 1)
            expected = dump_json(ep.tool_output)                      # independent of the recorded span
            decoded = backend.tokenizer.decode(ids[r, cols].tolist())
            # The first token may carry the separating space of "Tool output: " (byte-level BPE ' {"').
            lead = decoded[: len(decoded) - len(expected)]
            assert decoded.endswith(expected) and lead in ("", " "), (ep.episode_id, decoded, expected)
            # Minimal: dropping either boundary token loses part of the output.
            assert expected not in backend.tokenizer.decode(ids[r, cols[1:]].tolist())
            assert expected not in backend.tokenizer.decode(ids[r, cols[:-1]].tolist())
            ftr = lay.select("from_tool_return")
            assert ftr[0] == tool[0] and ftr[-1] == lay.n_prompt - 1 and np.all(np.diff(ftr) == 1)
            # Selector order: kinds as given, each ascending.
            kinds = [k for k, _ in sel.per_row(lay)]
            assert kinds == ["tool_span", "last_input", "all", "from_tool_return"]
            checked += 1
    return checked


def test_tool_span_decodes_to_tool_output_for_every_demo_episode(tiny_backend):
    bench = load_benchmark("demo")
    eps = build_episodes(bench.questions, formulations=FORMULATIONS)
    # Interleave long and short prompts so each batch is padded.
    eps = sorted(eps, key=lambda e: len(e.prompt))
    eps = [e for pair in zip(eps[::2], eps[1::2][::-1]) for e in pair]
    n_tool = sum(e.tool_output is not None for e in eps)
    assert _check_tool_spans(tiny_backend, eps, batch_size=16) == n_tool > 500


@pytest.mark.parametrize("frame,intervention", [("passage", "none"), ("tool-no-schema", "warn")])
def test_tool_span_other_frames(tiny_backend, frame, intervention):
    qs = load_benchmark("demo").questions[:6]
    eps = build_episodes(qs, conditions=("tool_wrong", "tool_error", "no_tool"), frame=frame,
                         intervention=intervention)
    assert _check_tool_spans(tiny_backend, eps, batch_size=5) == 6 * 2 * len(FORMULATIONS)


def test_token_indices_do_not_depend_on_padding(tiny_backend):
    eps = build_episodes(load_benchmark("demo").questions[:3], conditions=("tool_wrong", "tool_error"))
    prompts = [e.prompt for e in eps]
    spans = [e.tool_output_span for e in eps]
    sel = PositionSelector.parse("tool_span,last_input")
    batched = layout_backend_batch(tiny_backend, prompts, tiny_backend.encode(prompts), spans)
    assert len({lay.n_pad for lay in batched}) > 1
    for p, sp, lay in zip(prompts, spans, batched):
        alone = layout_backend_batch(tiny_backend, [p], tiny_backend.encode([p]), [sp])[0]
        assert alone.n_pad == 0
        for (k1, a), (k2, b) in zip(sel.per_row(alone), sel.per_row(lay)):
            assert k1 == k2 and a.tolist() == b.tolist()
            assert alone.token_ids[a].tolist() == lay.token_ids[b].tolist()


def _release_sample_episodes(shared):
    out = []
    for formulation in FORMULATIONS:
        rel = load_release_episodes(shared / f"sample_{formulation}_episodes.json")
        for rec in rel.episodes:
            qid = f"{rec['instance_id']}.{rec['hop_idx']}"
            q = replace(rel.questions[qid], tool_schema=rec["tool_schema"])
            ep = build_episode(q, rec["condition"], formulation, frame="tool", closed_book="permissive")
            assert ep.with_tool_prompt == rec["prompts"]["with_tool"]   # the real release prompt
            out.append(ep)
    return out


@pytest.mark.shared_data
def test_tool_span_on_release_samples_tiny_tokenizer(tiny_backend, shared_memtoc):
    eps = _release_sample_episodes(shared_memtoc)
    assert len(eps) == 10 + 2 + 2   # the release samples: 10 reference, 2 per paraphrase
    assert _check_tool_spans(tiny_backend, eps, batch_size=7) == sum(e.tool_output is not None for e in eps) > 0


@pytest.mark.real_model
@pytest.mark.shared_data
def test_tool_span_on_release_samples_default_tokenizer(default_backend, shared_memtoc):
    """The real SmolLM2 tokenizer and chat template (with its system prompt) on the MemToC release prompts."""
    eps = _release_sample_episodes(shared_memtoc)
    n = _check_tool_spans(default_backend, eps, batch_size=7)
    assert n == sum(e.tool_output is not None for e in eps) > 0
    demo = build_episodes(load_benchmark("demo").questions[:10], conditions=("tool_wrong", "tool_error"))
    assert _check_tool_spans(default_backend, demo, batch_size=8) == 20 * len(FORMULATIONS)


# -- unit tests of the helpers ---------------------------------------------------------------------------

def test_char_span_to_tokens_overlap_rule():
    offsets = np.array([[0, 0], [0, 5], [5, 9], [9, 12], [12, 12], [12, 20]])
    assert char_span_to_tokens(offsets, 5, 12) == (2, 4)        # exact boundaries
    assert char_span_to_tokens(offsets, 6, 12) == (2, 4)        # straddling first token is kept
    assert char_span_to_tokens(offsets, 5, 13) == (2, 6)        # zero-width token inside, straddling last
    assert char_span_to_tokens(offsets, 0, 1) == (1, 2)         # zero-width special token never selected
    with pytest.raises(PositionSpecError):
        char_span_to_tokens(offsets, 20, 25)
    with pytest.raises(PositionSpecError):
        char_span_to_tokens(offsets, 7, 7)


def test_user_span_is_shifted_into_the_template():
    user = 'Tool output: {"result": "x"}\nQ?\n'
    span = (13, 28)
    text = "<s>system\nhi</s><s>user\n" + user + "</s><s>assistant\n"
    a, b = user_span_in_text(text, user, span)
    assert text[a:b] == '{"result": "x"}'
    stripped = "<s>user\n" + user.strip() + "</s>"               # a template that trims the message
    a, b = user_span_in_text(stripped, user, span)
    assert stripped[a:b] == '{"result": "x"}'
    with pytest.raises(PositionSpecError):
        user_span_in_text("something else", user, span)


@pytest.mark.parametrize("spec", ["", " , ", []])
def test_empty_position_selection_is_refused(spec):
    with pytest.raises(MemtocError, match="empty position selection"):
        parse_positions(spec)


def test_unknown_position_kind_is_refused():
    with pytest.raises(PositionSpecError, match="unknown position kind 'last'"):
        PositionSelector.parse("last_input,last")
    assert parse_positions("all, last_input,all") == ("all", "last_input")


def test_batch_that_does_not_match_the_prompts_is_refused(tiny_backend):
    batch = tiny_backend.encode(["one prompt", "another prompt"])
    with pytest.raises(PositionSpecError, match="differ"):
        layout_backend_batch(tiny_backend, ["another prompt", "one prompt"], batch)
