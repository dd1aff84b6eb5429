"""Backend capabilities as types, the one factory, TokenBatch offsets, adapter views, and the one registrar."""

from __future__ import annotations

import ast
import copy
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from memtoc.backends import hooks as core_hooks
from memtoc.backends.base import InspectableBackend, TextBackend
from memtoc.core.backend_kinds import BACKEND_NAMES, INSPECT_CAPABILITIES, backend_kind
from memtoc.core.runtime import GenerationConfig, ModelSpec
from memtoc.backends.factory import load_backend
from memtoc.backends.hf import HFBackend
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from memtoc.core.errors import MemtocError

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("memtoc", "activations", "probes", "steering", "benchmarks", "experiments")


def _sources():
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            yield path, path.relative_to(REPO).as_posix()


def _names_backend(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "backend") or \
        (isinstance(node, ast.Attribute) and node.attr == "backend")


# -- source rules --------------------------------------------------------------------------------------------------

def test_no_hasattr_on_backends_and_no_backend_model_outside_backends():
    bad = []
    for path, rel in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"
                    and node.args and _names_backend(node.args[0])):
                bad.append(f"{rel}:{node.lineno}: hasattr(backend, ...)")
            # bench_anchors hands the backend's own module to the anchors (TransformerLens, nnsight): the same weights
            if (isinstance(node, ast.Attribute) and node.attr == "model" and _names_backend(node.value)
                    and not rel.startswith("memtoc/backends/") and rel != "benchmarks/bench_anchors.py"):
                bad.append(f"{rel}:{node.lineno}: backend.model")
    assert not bad, "\n".join(bad)


def test_only_the_registrar_registers_torch_hooks():
    users = set()
    for path, rel in _sources():
        text = path.read_text(encoding="utf-8")
        if "register_forward_hook(" in text or "register_forward_pre_hook(" in text:
            users.add(rel)
    # gpu_checks' stream reader is the device check's independent reference (plain PyTorch pre-hooks, as tests use);
    # bench_anchors' plain-transformers anchor is a forward hook by definition (what a researcher writes instead)
    assert users == {"memtoc/backends/hooks.py", "benchmarks/gpu_checks.py", "benchmarks/bench_anchors.py"}


def test_backends_are_built_by_the_factory_only():
    users = set()
    for path, rel in _sources():
        text = path.read_text(encoding="utf-8")
        if "HFBackend.load(" in text or "VLLMBackend.load(" in text or re.search(r"(?<!class )VLLMBackend\(", text):
            users.add(rel)
    assert users == {"memtoc/backends/factory.py"}
    assert set(BACKEND_NAMES) == {"hf", "vllm", "openai"}


# -- capability types and the factory ------------------------------------------------------------------------------

def test_factory_builds_an_inspectable_hf_backend(tiny_model_dir):
    b = load_backend(ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"))
    assert isinstance(b, HFBackend) and isinstance(b, InspectableBackend) and isinstance(b, TextBackend)
    assert b.capabilities == INSPECT_CAPABILITIES == backend_kind("hf").capabilities and b.adapter is None
    assert b.parts.n_layers == 3 and b.parts.d_model == 32 and b.parts.n_sites == 4
    with pytest.raises(MemtocError, match="--backend must be one of hf, vllm, openai, not 'nope'"):
        ModelSpec(model=str(tiny_model_dir), backend="nope")       # refused when the spec is built
    with pytest.raises(MemtocError, match=r"adapter views \(--backend hf\); the vllm backend has none"):
        load_backend(ModelSpec(model=str(tiny_model_dir), backend="vllm", adapter="x"))


def test_a_plain_string_is_a_one_message_conversation(tiny_backend):
    prompts = ["What is the capital of France?", "Name a prime number."]
    convs = [[{"role": "user", "content": p}] for p in prompts]
    cfg = GenerationConfig(max_new_tokens=6)
    assert [tiny_backend.format_prompt(c) for c in convs] == [tiny_backend.format_prompt(p) for p in prompts]
    assert tiny_backend.generate(convs, cfg) == tiny_backend.generate(prompts, cfg)
    multi = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
    want = tiny_backend.tokenizer.apply_chat_template(multi, tokenize=False, add_generation_prompt=True)
    assert tiny_backend.format_prompt(multi) == want
    (a,) = tiny_backend.generate([multi], cfg)
    (b,) = tiny_backend.generate_formatted([want], cfg)
    assert a == b
    # a preformatted view takes strings as the exact conditioning text
    assert tiny_backend.preformatted().format_prompt(want) == want


# -- TokenBatch --------------------------------------------------------------------------------------------------

def test_token_batch_offsets_are_the_tokenizers_own(tiny_backend):
    eps = build_episodes(load_benchmark("demo").questions[:3], formulations=("reference",))
    prompts = [e.prompt for e in eps[:5]] + ["short"]
    batch = tiny_backend.encode(prompts)
    tok = tiny_backend.tokenizer
    width = batch["input_ids"].shape[1]
    for i, p in enumerate(prompts):
        text = tiny_backend.format_prompt(p)
        assert batch.texts[i] == text
        alone = tok(text, add_special_tokens=False, return_offsets_mapping=True)   # chat template: no specials
        n = len(alone["input_ids"])
        assert batch.n_prompt[i] == n and batch.n_pad[i] == width - n
        assert batch["input_ids"][i, width - n:].tolist() == alone["input_ids"]
        assert batch["attention_mask"][i].tolist() == [0] * (width - n) + [1] * n
        np.testing.assert_array_equal(batch.offsets[i], np.asarray(alone["offset_mapping"]).reshape(-1, 2))
        # independent of the tokenizer's bookkeeping: each token decodes to the characters its offsets cover
        for tid, (s, e) in zip(alone["input_ids"], batch.offsets[i]):
            if e > s:
                assert tok.decode([tid]) == text[s:e]
    # the mapping view keeps ``model(**batch)`` working
    assert set(batch) == {"input_ids", "attention_mask"}
    logits = tiny_backend.parts.model(**batch).logits
    assert logits.shape[:2] == batch["input_ids"].shape


def test_layouts_come_from_the_batch_without_retokenizing(tiny_backend, monkeypatch):
    from activations.positions import layout_backend_batch, layout_batch

    eps = [e for e in build_episodes(load_benchmark("demo").questions[:2], formulations=("reference",))
           if e.with_tool_prompt is not None][:3]
    prompts, spans = [e.prompt for e in eps], [e.tool_output_span for e in eps]
    batch = tiny_backend.encode(prompts)
    ref = layout_batch(tiny_backend.tokenizer, list(batch.texts), batch["input_ids"], batch["attention_mask"],
                       add_special_tokens=False,
                       tool_spans=[l.tool_span for l in layout_backend_batch(tiny_backend, prompts, dict(batch),
                                                                             spans)])
    calls = []
    real = type(tiny_backend.tokenizer).__call__
    monkeypatch.setattr(type(tiny_backend.tokenizer), "__call__",
                        lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    got = layout_backend_batch(tiny_backend, prompts, batch, spans)
    assert calls == []
    for g, r in zip(got, ref):
        assert g.n_pad == r.n_pad and g.tool_span == r.tool_span and g.tool_token_span() == r.tool_token_span()
        np.testing.assert_array_equal(g.token_ids, r.token_ids)
        np.testing.assert_array_equal(g.offsets, r.offsets)


# -- adapter views -----------------------------------------------------------------------------------------------

def _params_sha(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def lora_dir(tiny_backend, tmp_path_factory):
    from peft import get_peft_model

    from memtoc.jobs.finetune.lora import LoraSettings, lora_config

    torch.manual_seed(5)
    model = copy.deepcopy(tiny_backend.model)
    cfg = lora_config(model, LoraSettings())
    cfg.init_lora_weights = False
    out = tmp_path_factory.mktemp("lora")
    get_peft_model(model, cfg).save_pretrained(str(out))
    return out


def test_adapter_view_never_mutates_the_shared_model(tiny_backend, tiny_model_dir, lora_dir):
    from memtoc.core.adapter import apply_adapter

    before = _params_sha(tiny_backend.model)
    flags = [p.requires_grad for p in tiny_backend.model.parameters()]
    prompts = ["What is the capital of France?", "Name a prime number."]
    cfg = GenerationConfig(max_new_tokens=8)
    plain = tiny_backend.generate(prompts, cfg)
    view = tiny_backend.with_adapter(lora_dir)
    assert isinstance(view, InspectableBackend) and view.adapter == str(lora_dir)
    got = view.forward(prompts)["last_logits"]
    gens = view.generate(prompts, cfg)
    assert _params_sha(tiny_backend.model) == before                     # bit-identical shared weights
    assert [p.requires_grad for p in tiny_backend.model.parameters()] == flags
    assert tiny_backend.generate(prompts, cfg) == plain
    # the same outputs as the previous `evaluate --adapter` route: a freshly loaded model, merged in place
    today = HFBackend(apply_adapter(HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32").model,
                                    lora_dir), tiny_backend.tokenizer, chat=tiny_backend.chat)
    # Logits agree to float rounding only: weights at other addresses (alignment) can make BLAS pick another
    # summation order, which showed up when other tests ran first in the same process.
    torch.testing.assert_close(got, today.forward(prompts)["last_logits"], atol=1e-5, rtol=1e-5)
    assert gens == today.generate(prompts, cfg)
    # and as crossfit's previous route (merged into a deep copy): the same answers
    merged = HFBackend(apply_adapter(copy.deepcopy(tiny_backend.model), lora_dir), tiny_backend.tokenizer,
                       chat=tiny_backend.chat)
    torch.testing.assert_close(got, merged.forward(prompts)["last_logits"], atol=1e-5, rtol=1e-5)
    assert gens == merged.generate(prompts, cfg)
    assert not torch.equal(got, tiny_backend.forward(prompts)["last_logits"])  # the adapter does something
    # untargeted weights are shared (no copy), targeted ones are the view's own
    base_sd, view_sd = tiny_backend.model.state_dict(), view.parts.model.state_dict()
    assert view_sd["model.layers.0.mlp.up_proj.weight"].data_ptr() == base_sd["model.layers.0.mlp.up_proj.weight"].data_ptr()
    assert view_sd["model.layers.0.self_attn.q_proj.weight"].data_ptr() != \
        base_sd["model.layers.0.self_attn.q_proj.weight"].data_ptr()


def test_factory_applies_the_adapter_as_a_view(tiny_model_dir, lora_dir, tiny_backend):
    b = load_backend(ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32", adapter=str(lora_dir)))
    assert b.adapter == str(lora_dir)
    torch.testing.assert_close(b.forward(["Hi"])["last_logits"],
                               tiny_backend.with_adapter(lora_dir).forward(["Hi"])["last_logits"], atol=1e-5, rtol=1e-5)


def test_trainable_copy_trains_without_touching_the_shared_model(tiny_backend):
    from peft import get_peft_model

    from memtoc.jobs.finetune.lora import LoraSettings, lora_config

    before = _params_sha(tiny_backend.model)
    base = tiny_backend.trainable_copy()
    assert not any(p.requires_grad for p in base.parameters())
    pm = get_peft_model(base, lora_config(base, LoraSettings()))
    opt = torch.optim.SGD([p for p in pm.parameters() if p.requires_grad], lr=1.0)
    ids = tiny_backend.encode(["Hi there"])["input_ids"]
    for _ in range(2):
        opt.zero_grad()
        pm(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    assert any("lora" in n for n, _ in pm.named_parameters())
    assert not any("lora" in n for n, _ in tiny_backend.model.named_modules())
    assert _params_sha(tiny_backend.model) == before


# -- the one registrar ---------------------------------------------------------------------------------------------

def test_capture_edit_and_lens_hooks_all_go_through_the_registrar(tiny_backend, monkeypatch):
    from activations.capture import ResidualCapture
    from probes.lens import LensCapture
    from steering import DirectionEdit

    calls: list[list[str]] = []
    real = core_hooks.register

    def spy(hooks):
        calls.append([type(h.module).__name__ for h in hooks])
        return real(hooks)

    monkeypatch.setattr(core_hooks, "register", spy)
    prompts = ["What is the capital of France?"]
    d = tiny_backend.parts.d_model

    tiny_backend.forward(prompts, capture=ResidualCapture([0, 2], "last_input", prompts=prompts))
    assert len(calls) == 1 and calls[0] == ["LlamaDecoderLayer", "LlamaDecoderLayer"]

    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: torch.ones(d) / d ** 0.5}, scale={1: 1.0},
                               strength=2.0)
    calls.clear()
    tiny_backend.generate(prompts, GenerationConfig(max_new_tokens=3), edit=edit.bind(prompts))
    assert len(calls) == 1 and len(calls[0]) == 2        # the cache-offset tracker and the site-1 edit hook

    calls.clear()
    tiny_backend.forward(prompts, capture=LensCapture(tiny_backend.parts, [1, 3], detached=True))
    site_calls = [c for c in calls if all(n == "LlamaDecoderLayer" for n in c)]
    sub_calls = [c for c in calls if "LlamaAttention" in c]
    assert len(site_calls) == 1 and len(sub_calls) == 1      # residual sites + the table's sub-block hooks


def test_registrar_tracks_the_cache_offset_and_row_compaction(tiny_backend):
    from memtoc.backends.hooks import HookState, site_hooks

    seen = []
    state = HookState()
    with site_hooks(tiny_backend.parts.model, [1], lambda s, h: seen.append((state.offset, h.shape[1])), state=state):
        tiny_backend.generate(["Name a prime number."], GenerationConfig(max_new_tokens=4, stop_at_final_line=False))
    n_prompt = seen[0][1]
    assert seen[0] == (0, n_prompt)
    assert [o for o, _ in seen[1:]] == list(range(n_prompt, n_prompt + len(seen) - 1))
    state.select_rows([0, 2, 3])
    state.select_rows([1, 2])
    assert state.rows == (2, 3)
    with pytest.raises(MemtocError, match="unknown layer 9"):
        with site_hooks(tiny_backend.parts.model, [9], lambda s, h: None):
            pass
