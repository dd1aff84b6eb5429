"""The researcher API: the evaluator's prompt tokens in ``mt.trace`` (one BOS), clean/corrupt condition pairs, the
answer token and ``mt.patch_edit``. References are independent: the tokenizer called by hand and forward hooks
registered on the transformers model itself."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

import memtoc as mt
from memtoc.api.tracing import TraceError

REPO = Path(__file__).resolve().parents[3]


def _manual_patch(model, clean_ids, corrupt_ids, site, memory_id, tool_id) -> tuple[float, float]:
    """(patched, corrupt) ``log p(memory) - log p(tool)`` at the last position, with hooks on ``model.layers``: the
    clean run's output of block ``site - 1`` at its last position written over the corrupt run's."""
    block = model.model.layers[site - 1]
    kept = {}

    def hidden(out):
        return out[0] if isinstance(out, tuple) else out

    def grab(mod, inp, out):
        kept["h"] = hidden(out)[0, -1].clone()

    def put(mod, inp, out):
        h = hidden(out).clone()
        h[0, -1] = kept["h"]
        return (h, *out[1:]) if isinstance(out, tuple) else h

    def metric(logits):
        lp = logits[0, -1].float().log_softmax(-1)
        return float(lp[memory_id] - lp[tool_id])

    with torch.no_grad():
        handle = block.register_forward_hook(grab)
        model(torch.tensor([clean_ids]))
        handle.remove()
        corrupt = metric(model(torch.tensor([corrupt_ids])).logits)
        handle = block.register_forward_hook(put)
        patched = metric(model(torch.tensor([corrupt_ids])).logits)
        handle.remove()
    return patched, corrupt


def test_patch_edit_equals_a_forward_hook_on_the_transformers_model(tiny_backend) -> None:
    tok = tiny_backend.tokenizer
    clean_ids = tok("The capital of France is FINAL:")["input_ids"]
    corrupt_ids = tok("The capital of Spain is FINAL:")["input_ids"]
    memory_id, tool_id = tok("Paris")["input_ids"][0], tok("Madrid")["input_ids"][0]
    assert memory_id != tool_id
    pair = mt.ConditionPair("q", "reference", ("tool_right", "tool_wrong"), clean_ids, corrupt_ids, "Paris",
                            "Madrid", memory_id, tool_id)
    for site in (1, 2, 3):
        clean = mt.trace(tiny_backend, pair.clean, sites=[site], positions="last")
        corrupt = mt.trace(tiny_backend, pair.corrupt, sites=[site], positions="last")
        patched = mt.trace(tiny_backend, pair.corrupt, sites=[site], positions="last",
                           edit=mt.patch_edit(clean, site=site))
        ref_patched, ref_corrupt = _manual_patch(tiny_backend.model, clean_ids, corrupt_ids, site, memory_id, tool_id)
        assert float(pair.metric(corrupt)) == pytest.approx(ref_corrupt, abs=1e-5)
        assert float(pair.metric(patched)) == pytest.approx(ref_patched, abs=1e-5)
        assert abs(ref_patched - ref_corrupt) > 1e-4           # the patch changes the metric: the check can fail
        # the patched site now holds the clean value at the last position
        assert torch.allclose(patched[f"blocks.{site - 1}.hook_resid_post"], clean[f"blocks.{site - 1}.hook_resid_post"])
    with pytest.raises(TraceError, match="last position"):
        mt.patch_edit(mt.trace(tiny_backend, pair.clean, sites=[1], positions=0), site=1)


def _bos_model(tiny_model_dir: Path, root: Path) -> Path:
    """The tiny model whose tokenizer prepends its BOS to every text, as Llama's does (its chat template writes
    the same token at the start of every message, the first one included)."""
    from tokenizers import Tokenizer, processors

    shutil.copytree(tiny_model_dir, root)
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    bos = tok.token_to_id("<|im_start|>")
    tok.post_processor = processors.TemplateProcessing(single="<|im_start|> $A", pair="<|im_start|> $A $B",
                                                       special_tokens=[("<|im_start|>", bos)])
    tok.save(str(root / "tokenizer.json"))
    return root


def test_trace_of_the_evaluators_prompt_runs_its_ids_with_one_bos(tiny_model_dir, tmp_path) -> None:
    from memtoc.backends.hf import HFBackend
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    backend = HFBackend.load(str(_bos_model(tiny_model_dir, tmp_path / "bos")), device="cpu", dtype="float32")
    tok = backend.tokenizer
    bos = tok.bos_token_id
    ep = build_episodes(load_benchmark("demo").questions[:1], formulations=("reference",),
                        conditions=("tool_wrong",))[0]
    text = backend.format_prompt(ep.prompt)
    assert text.startswith(tok.bos_token) and tok(text)["input_ids"][:2] == [bos, bos]   # the trap is there
    expected = mt.prompt_tokens(backend, ep.prompt)
    assert expected == tok(text, add_special_tokens=False)["input_ids"]
    t = mt.trace(backend, [text, "Hello there"], sites=[1], positions="last")
    assert t.tokens[0] == expected and t.tokens[0][0] == bos and t.tokens[0][1] != bos     # one BOS, not two
    assert t.tokens[1] == tok("Hello there")["input_ids"] and t.tokens[1][0] == bos    # raw text keeps its BOS
    by_ids = mt.trace(backend, [expected], sites=[1], positions="last")
    assert torch.equal(by_ids["blocks.0.hook_resid_post"][0], t["blocks.0.hook_resid_post"][0])


def test_answer_token_is_the_token_after_the_answer_prefix(tiny_backend) -> None:
    tok = tiny_backend.tokenizer
    prompt = "What is the capital of France?"
    formatted = tiny_backend.format_prompt(prompt)
    head = tok(formatted + "FINAL:", add_special_tokens=False)["input_ids"]
    joint = tok(formatted + "FINAL: Paris", add_special_tokens=False)["input_ids"]
    assert joint[:len(head)] == head
    first = next(t for t in joint[len(head):] if tok.decode([t]).strip())   # the first token holding a letter of it
    assert tok.decode([first]).strip() and "Paris".startswith(tok.decode([first]).strip())
    assert mt.answer_token(tiny_backend, prompt, "Paris").token_id == first


def test_condition_pairs_refuse_a_bad_pair(tmp_path) -> None:
    with pytest.raises(TraceError, match="tool_right:nothing"):
        mt.condition_pairs(tmp_path, model=None, pair="tool_right:nothing")


def _doc_block() -> str:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M) if "mt.patch_edit" in b]
    assert len(blocks) == 1
    lines = [ln for ln in blocks[0].splitlines() if ln.strip()]
    assert len(lines) <= 8, "the patching experiment is documented in at most 8 lines"
    return blocks[0]


@pytest.mark.real_model
def test_the_documented_patching_experiment_runs_and_equals_hooks(tmp_path, monkeypatch, default_model) -> None:
    import runpy
    import tempfile


    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    snippet = tmp_path / "patching.py"
    snippet.write_text(_doc_block(), encoding="utf-8")
    scope = runpy.run_path(str(snippet))                   # the documented block itself
    model, pair, effect = scope["model"], scope["pair"], scope["effect"]
    assert pair.conditions == ("tool_right", "tool_wrong") and pair.clean != pair.corrupt
    assert model.tokenizer.decode(pair.clean).endswith("FINAL:")
    patched, corrupt = _manual_patch(model.model, pair.clean, pair.corrupt, 15, pair.memory_id, pair.tool_id)
    assert float(effect) == pytest.approx(patched - corrupt, abs=1e-4)
    assert float(pair.metric(scope["corrupt"])) == pytest.approx(corrupt, abs=1e-4)


def test_patch_edit_refuses_a_site_or_source_it_cannot_write(tiny_backend) -> None:
    """A site that is no site number or was not traced, and a source whose rows match neither one prompt nor
    every prompt, are one TraceError each; one row patches every prompt, n rows patch n prompts row by row."""
    two = mt.trace(tiny_backend, ["a b", "c d"], sites=[2], positions="last")
    one = mt.trace(tiny_backend, ["a b"], sites=[2], positions="last")
    with pytest.raises(TraceError, match="site must be a site number, got 1.5"):
        mt.patch_edit(one, site=1.5)
    with pytest.raises(TraceError, match=r"site 1 \(blocks.0.hook_resid_post\) was not traced; traced: "
                                         r"blocks.1.hook_resid_post"):
        mt.patch_edit(one, site=1)
    with pytest.raises(TraceError, match="the source trace has 2 rows"):
        mt.trace(tiny_backend, ["x", "y", "z"], sites=[2], positions="last", edit=mt.patch_edit(two, site=2))
    three = mt.trace(tiny_backend, ["x", "y", "z"], sites=[2], positions="last", edit=mt.patch_edit(one, site=2))
    assert all(torch.equal(r, one["blocks.1.hook_resid_post"][0, -1]) for r in three["blocks.1.hook_resid_post"][:, -1])
    pair = mt.trace(tiny_backend, ["x", "y"], sites=[2], positions="last", edit=mt.patch_edit(two, site=2))
    assert torch.equal(pair["blocks.1.hook_resid_post"][:, -1], two["blocks.1.hook_resid_post"][:, -1])
