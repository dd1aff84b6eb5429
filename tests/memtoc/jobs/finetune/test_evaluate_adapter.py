"""``memtoc evaluate --adapter``: the adapter applies to the whole model and its hash joins the run identity."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.core.errors import MemtocError, RunStoreError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.evaluation import load_backend
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.adapter import adapter_sha256, apply_adapter
from memtoc.jobs.finetune.lora import LoraSettings, lora_config
from memtoc.runs.runstore import iter_jsonl
from memtoc.core.config import ModelSpec

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def random_adapter(tiny_backend, tmp_path_factory):
    """A peft LoRA adapter with random (non-zero) B, so the adapted model visibly differs from the base."""
    from peft import get_peft_model

    torch.manual_seed(3)
    model = copy.deepcopy(tiny_backend.model)
    cfg = lora_config(model, LoraSettings())
    cfg.init_lora_weights = False
    pm = get_peft_model(model, cfg)
    out = tmp_path_factory.mktemp("adapter")
    pm.save_pretrained(str(out))
    return out


def _cfg(model_dir, out, **kw):
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_right,tool_wrong", limit=2, batch_size=4, max_new_tokens=8, device="cpu",
                dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def test_apply_adapter_merges_into_a_plain_model(tiny_backend, random_adapter):
    model = apply_adapter(copy.deepcopy(tiny_backend.model), random_adapter)
    assert type(model) is type(tiny_backend.model)
    assert not any("lora" in n for n, _ in model.named_modules())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[q], tiny_backend.model.state_dict()[q])
    mlp = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(model.state_dict()[mlp], tiny_backend.model.state_dict()[mlp])


def test_evaluate_with_adapter_records_its_hash_and_re_elicits_closed_book(tiny_backend, tiny_model_dir,
                                                                           random_adapter, tmp_path):
    base = evaluate(_cfg(tiny_model_dir, tmp_path / "base"), backend=tiny_backend, log=lambda s: None)
    base_info = json.loads((base.store.root / "run.json").read_text())
    assert "adapter_sha256" not in base_info["identity"]     # runs without an adapter keep their old identity
    rc = main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "demo", "--limit", "2",
               "--conditions", "tool_right,tool_wrong", "--max-new-tokens", "8", "--device", "cpu",
               "--dtype", "float32", "--no-progress", "--adapter", str(random_adapter),
               "--out", str(tmp_path / "adapted")])
    assert rc == 0
    info = json.loads((tmp_path / "adapted" / "run.json").read_text())
    assert info["identity"]["adapter_sha256"] == adapter_sha256(random_adapter)
    assert len(info["identity"]["adapter_sha256"]) == 64
    assert info["config"]["adapter"] == str(random_adapter) and info["status"] == "complete"
    assert info["identity"]["weights_sha256"] == base_info["identity"]["weights_sha256"]
    cb_base = {r["key"]: r["response"] for r in iter_jsonl(tmp_path / "base" / "closed_book.jsonl")}
    cb_adapted = {r["key"]: r["response"] for r in iter_jsonl(tmp_path / "adapted" / "closed_book.jsonl")}
    assert set(cb_base) == set(cb_adapted) and cb_base != cb_adapted   # the closed-book pass is adapted too
    # an adapted run cannot be resumed into the base run's directory
    with pytest.raises(RunStoreError, match="adapter_sha256"):
        evaluate(_cfg(tiny_model_dir, tmp_path / "base", adapter=str(random_adapter)), backend=tiny_backend,
                 log=lambda s: None)


def test_adapter_errors(tmp_path):
    with pytest.raises(MemtocError, match="adapter views"):
        load_backend(EvaluationConfig(model_spec=ModelSpec(backend="vllm", adapter=str(tmp_path))))
    with pytest.raises(MemtocError, match="not an adapter directory"):
        adapter_sha256(tmp_path)
