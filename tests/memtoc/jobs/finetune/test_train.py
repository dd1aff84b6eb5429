"""The training loop on the tiny model: only LoRA weights move, the loss falls, resume equals uninterrupted."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from memtoc.core.runtime import GenerationConfig
from memtoc.backends.hf import HFBackend
from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import MemtocError
from memtoc.core.adapter import adapter_sha256, read_adapter_meta
from memtoc.jobs.finetune.data import build_pairs, make_pair_set
from memtoc.jobs.finetune.lora import LoraSettings, find_target_modules, lora_config
from memtoc.jobs.finetune.train import TrainConfig, encode_pairs, step_loss, train_adapter

torch.set_num_threads(1)
QUIET = lambda s: None  # noqa: E731


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    """A private copy of the tiny model (training injects and removes LoRA layers in place)."""
    return HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def pair_set(backend):
    return make_pair_set(build_pairs(load_benchmark("demo").fold("A")[:2], backend.format_prompt))


def test_target_modules_are_found_by_suffix(backend):
    assert find_target_modules(backend.model) == ["q_proj", "k_proj", "v_proj", "o_proj"]

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (torch.nn.Linear(4, 4) for _ in range(3))
            self.dense = torch.nn.Linear(4, 4)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attn()
            self.mlp = torch.nn.Module()
            self.mlp.dense = torch.nn.Linear(4, 4)
            self.mlp.o_proj = torch.nn.Linear(4, 4)   # an MLP "o_proj" must not be taken for attention

    assert find_target_modules(Block()) == ["query", "key", "value", "dense"]
    no_attn = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(MemtocError, match="kind 'q'"):
        find_target_modules(no_attn)


def test_a_step_changes_only_lora_weights_and_the_loss_falls(backend, pair_set):
    from peft import get_peft_model

    torch.manual_seed(0)
    model = copy.deepcopy(backend.model)
    pm = get_peft_model(model, lora_config(model, LoraSettings()))
    before = {n: p.detach().clone() for n, p in pm.named_parameters()}
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    cfg = TrainConfig(objective="sft", lr=5e-3, batch_size=4)
    examples = encode_pairs(pair_set, backend.tokenizer, chat=True, objective="sft", max_length=2048)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        losses.append(step_loss(pm, examples, cfg, backend.tokenizer.pad_token_id, torch.device("cpu"))["loss"])
        opt.step()
    changed = {n for n, p in pm.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed == set(trainable)
    assert losses[-1] < losses[0] - 0.5, losses


def test_dpo_starts_at_log2_and_its_loss_falls(backend, pair_set, tmp_path):
    res = train_adapter(pair_set, backend, tmp_path / "dpo", TrainConfig(objective="dpo", lr=5e-3, epochs=6,
                                                                         batch_size=4), log=QUIET)
    losses = [l["loss"] for l in res.losses]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-5)   # B = 0: policy equals the reference
    assert losses[-1] < 0.6 and res.losses[-1]["reward_accuracy"] == 1.0


def test_training_leaves_the_base_model_unchanged(backend, pair_set, tmp_path):
    state = {k: v.clone() for k, v in backend.model.state_dict().items()}
    prompts = [pair_set.pairs[0].user_prompt]
    gen = backend.generate(prompts, GenerationConfig(max_new_tokens=8))[0].text
    train_adapter(pair_set, backend, tmp_path / "a", TrainConfig(objective="sft", lr=1e-2, epochs=2), log=QUIET)
    after = backend.model.state_dict()
    assert set(after) == set(state) and all(torch.equal(after[k], state[k]) for k in state)
    assert not any("lora" in n for n, _ in backend.model.named_modules())
    assert backend.generate(prompts, GenerationConfig(max_new_tokens=8))[0].text == gen


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_resume_equals_uninterrupted(backend, pair_set, tmp_path, objective):
    cfg = TrainConfig(objective=objective, lr=1e-3, epochs=2, batch_size=2, save_every=1)   # 4 steps
    full = train_adapter(pair_set, backend, tmp_path / "full", cfg, log=QUIET)
    assert full.completed and full.steps_done == 4
    part = train_adapter(pair_set, backend, tmp_path / "resumed", cfg, stop_after=2, log=QUIET)
    assert not part.completed and part.steps_done == 2
    assert (tmp_path / "resumed" / "checkpoint" / "state.json").exists()
    assert not (tmp_path / "resumed" / "adapter_model.safetensors").exists()
    rest = train_adapter(pair_set, backend, tmp_path / "resumed", cfg, log=QUIET)
    assert rest.completed and rest.resumed_from == 2 and rest.steps_done == 4
    a = load_file(str(tmp_path / "full" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert any(a[k].abs().sum() > 0 for k in a if "lora_B" in k)          # B started at zero: it moved
    assert full.adapter_sha256 == rest.adapter_sha256 == adapter_sha256(tmp_path / "resumed")
    assert [l["loss"] for l in full.losses] == [l["loss"] for l in rest.losses]
    assert not (tmp_path / "resumed" / "checkpoint").exists()


def test_adapter_files_metadata_and_rerun(backend, pair_set, tmp_path):
    out = tmp_path / "sft"
    cfg = TrainConfig(objective="sft", lr=1e-3)
    res = train_adapter(pair_set, backend, out, cfg, log=QUIET)
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    peft_cfg = json.loads((out / "adapter_config.json").read_text())
    assert peft_cfg["r"] == 16 and peft_cfg["lora_alpha"] == 32
    assert sorted(peft_cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    meta = read_adapter_meta(out)
    assert meta["data"]["sha256"] == pair_set.sha256 == meta["identity"]["data_sha256"]
    assert meta["adapter_sha256"] == adapter_sha256(out) == res.adapter_sha256
    assert meta["train_config"]["lr"] == 1e-3 and meta["train_config"]["beta"] == 0.1
    assert meta["train_question_ids"] == [q.id for q in load_benchmark("demo").fold("A")[:2]]
    again = train_adapter(pair_set, backend, out, cfg, log=QUIET)
    assert again.completed and again.adapter_sha256 == res.adapter_sha256
    with pytest.raises(MemtocError, match="other settings"):
        train_adapter(pair_set, backend, out, TrainConfig(objective="sft", lr=2e-3), log=QUIET)


def test_paper_defaults():
    cfg = TrainConfig()
    assert (cfg.lora.r, cfg.lora.alpha, cfg.lora.targets, cfg.lr, cfg.epochs, cfg.beta) == \
        (16, 32, ("q", "k", "v", "o"), 1e-5, 1, 0.1)
    assert cfg.matched("dpo").identity() | {"objective": "sft"} == cfg.identity()
