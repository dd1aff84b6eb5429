"""LoRA training for the SFT and DPO arms in one plain, resumable loop (peft + transformers, no trl).

Why a loop of our own: DPO's loss is ten lines (:mod:`memtoc.jobs.finetune.losses`); trl would add a heavy
dependency with its own version pins, and its collators decide padding and masking for us. Here masking is the
evaluator's (left padding, chat-template prompts, completion-only labels, EOS kept even when it is the padding
id) and is tested token by token.

- SFT: masked cross-entropy on the preferred completion, averaged over the batch's completion tokens.
- DPO: ``-log σ(β((πc − rc) − (πr − rr)))`` under the policy (base + LoRA) and the frozen reference: the same
  model with the adapter switched off (``PeftModel.disable_adapter()``), so no second copy of the weights is held.

Matched SFT and DPO runs share everything but ``objective`` (paper defaults: r=16 on q/k/v/o, alpha 32, lr 1e-5,
1 epoch, β 0.1). Every ``save_every`` steps the LoRA weights, optimizer, step, data order, losses and RNG state
go to ``OUT/checkpoint`` (through a temporary folder and a rename); a re-run resumes there, and a checkpoint of
other settings or data is refused. ``OUT/memtoc_adapter.json`` is written last: its presence means complete.
"""

from __future__ import annotations

import inspect
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from memtoc.backends.factory import require_inspectable
from memtoc.core.errors import MemtocError
from memtoc.core.fileio import sha256_json, write_json_atomic
from memtoc.core.adapter import META_FILE, adapter_sha256
from memtoc.jobs.finetune.data import PairSet
from memtoc.jobs.finetune.lora import lora_config
from memtoc.jobs.finetune.losses import dpo_loss, sequence_logprobs, sft_loss
from memtoc.jobs.finetune.tokens import EncodedExample, collate, encode_example
from memtoc.jobs.finetune.train_config import TrainConfig, lr_at

ADAPTER_SCHEMA = "memtoc-adapter-v1"
CHECKPOINT_DIR = "checkpoint"


@dataclass
class TrainResult:
    path: Path
    completed: bool
    steps_done: int
    total_steps: int
    losses: list[dict[str, Any]]
    resumed_from: int
    adapter_sha256: str | None
    meta: dict[str, Any]


def _supports_logits_to_keep(model: Any) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def forward_tail_logits(model: Any, batch: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Logits of the last ``n_keep`` positions of a left-padded batch (only those the losses need)."""
    k = int(batch["n_keep"])
    kwargs: dict[str, Any] = {"input_ids": batch["input_ids"].to(device),
                              "attention_mask": batch["attention_mask"].to(device),
                              "position_ids": batch["position_ids"].to(device), "use_cache": False}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if _supports_logits_to_keep(base):
        kwargs["logits_to_keep"] = k
    return model(**kwargs).logits[:, -k:]


def encode_pairs(pair_set: PairSet, tokenizer: Any, *, chat: bool, objective: str,
                 max_length: int) -> list[tuple[EncodedExample, ...]]:
    """Per pair: (chosen,) for SFT, (chosen, rejected) for DPO."""
    out = []
    for p in pair_set.pairs:
        chosen = encode_example(tokenizer, p.prompt, p.chosen, chat=chat, max_length=max_length)
        if objective == "sft":
            out.append((chosen,))
        else:
            out.append((chosen, encode_example(tokenizer, p.prompt, p.rejected, chat=chat, max_length=max_length)))
    return out


def data_order(n: int, epochs: int, seed: int) -> list[list[int]]:
    """One seeded permutation per epoch (the same for matched SFT and DPO runs)."""
    return [torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + e)).tolist()
            for e in range(epochs)]


def _chunks(items: Sequence[Any], size: int | None) -> list[Sequence[Any]]:
    size = size or len(items)
    return [items[i:i + size] for i in range(0, len(items), size)]


def step_loss(model: Any, examples: Sequence[tuple[EncodedExample, ...]], cfg: TrainConfig, pad_id: int,
              device: torch.device, *, backward: bool = True) -> dict[str, float]:
    """Loss of one optimizer step's examples (micro-batched), with ``backward()`` called when asked."""
    if cfg.objective == "sft":
        total_tokens = sum(len(ex[0].completion_ids) for ex in examples)
        loss_sum = 0.0
        for micro in _chunks(examples, cfg.micro_batch_size):
            batch = collate([ex[0] for ex in micro], pad_id)
            s, _ = sft_loss(forward_tail_logits(model, batch, device), batch["labels"].to(device))
            part = s / total_tokens
            if backward:
                part.backward()
            loss_sum += float(part.detach())
        return {"loss": loss_sum}
    n_pairs = len(examples)
    loss_sum, rc, rr, acc = 0.0, 0.0, 0.0, 0.0
    for micro in _chunks(examples, cfg.micro_batch_size):
        m = len(micro)
        batch = collate([ex[0] for ex in micro] + [ex[1] for ex in micro], pad_id)
        labels = batch["labels"].to(device)
        policy = sequence_logprobs(forward_tail_logits(model, batch, device), labels)
        with torch.no_grad(), model.disable_adapter():
            ref = sequence_logprobs(forward_tail_logits(model, batch, device), labels)
        losses, st = dpo_loss(policy[:m], policy[m:], ref[:m], ref[m:], cfg.beta)
        part = losses.sum() / n_pairs
        if backward:
            part.backward()
        loss_sum += float(part.detach())
        rc += st["reward_chosen"] * m / n_pairs
        rr += st["reward_rejected"] * m / n_pairs
        acc += st["reward_accuracy"] * m / n_pairs
    return {"loss": loss_sum, "reward_chosen": rc, "reward_rejected": rr, "reward_accuracy": acc}


def _trainable(model: Any) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _save_checkpoint(root: Path, model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    tmp = root.with_name(root.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({n: p.detach().cpu().contiguous() for n, p in _trainable(model).items()}, str(tmp / "lora.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()}, tmp / "optimizer.pt")
    write_json_atomic(tmp / "state.json", state)
    old = root.with_name(root.name + ".old")
    if root.exists():
        if old.exists():
            shutil.rmtree(old)
        root.replace(old)
    tmp.replace(root)
    if old.exists():
        shutil.rmtree(old)


def _load_checkpoint(root: Path, model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors = load_file(str(root / "lora.safetensors"))
    params = _trainable(model)
    if set(tensors) != set(params):
        raise MemtocError(f"{root}: checkpoint parameters do not match the model's LoRA parameters")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(tensors[n].to(p.device, p.dtype))
    blob = torch.load(root / "optimizer.pt", weights_only=True)
    optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["rng"])
    return json.loads((root / "state.json").read_text(encoding="utf-8"))


def train_adapter(pair_set: PairSet, backend: Any, out: str | Path, cfg: TrainConfig, *,
                  extra_meta: dict[str, Any] | None = None, stop_after: int | None = None,
                  log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> TrainResult:
    """Train (or resume, or find finished) one adapter on ``pair_set`` into ``out``. LoRA layers go into the
    backend's ``trainable_copy()`` (sharing the weights read-only), never into the model it serves, so the base
    model stays unchanged. ``stop_after``: end after that many optimizer steps with a checkpoint (tests,
    time-boxed jobs); the next call resumes."""
    from peft import get_peft_model

    cfg.validate()
    if not pair_set.pairs:
        raise MemtocError("no training pairs")
    out = Path(out)
    provenance = backend.provenance()
    # what decides an adapter: settings, data hash, base weights and prompt formatting
    identity = {"schema": ADAPTER_SCHEMA, "train": cfg.identity(), "data_sha256": pair_set.sha256,
                "base_model": provenance.get("model"),
                "base_weights_sha256": (provenance.get("weights") or {}).get("sha256"),
                "chat_template_sha256": provenance.get("chat_template_sha256"), "dtype": provenance.get("dtype")}
    ident_hash = sha256_json(identity)
    meta_path = out / META_FILE
    if meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("identity_sha256") != ident_hash:
            raise MemtocError(f"{out} holds an adapter trained with other settings or data; use another --out")
        log(f"{out}: adapter already trained ({meta['steps']} steps); nothing to do")
        return TrainResult(path=out, completed=True, steps_done=meta["steps"], total_steps=meta["steps"],
                           losses=meta.get("losses", []), resumed_from=meta["steps"],
                           adapter_sha256=adapter_sha256(out), meta=meta)

    tokenizer = backend.tokenizer
    examples = encode_pairs(pair_set, tokenizer, chat=backend.chat, objective=cfg.objective,
                            max_length=cfg.max_length)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    order = data_order(len(examples), cfg.epochs, cfg.seed)
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    backend = require_inspectable(backend, "adapter training")
    device = backend.parts.device

    torch.manual_seed(cfg.seed)
    base = backend.trainable_copy()
    lcfg = lora_config(base, cfg.lora)
    with warnings.catch_warnings():  # peft asks the model an attribute transformers 5 renamed (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(base, lcfg)
    try:
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        model.train()
        optimizer = torch.optim.AdamW(list(_trainable(model).values()), lr=cfg.lr, weight_decay=cfg.weight_decay)
        ckpt = out / CHECKPOINT_DIR
        step, losses, resumed_from = 0, [], 0
        if ckpt.exists():
            state = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))
            if state.get("identity_sha256") != ident_hash:
                raise MemtocError(f"{ckpt} was made with other settings or data; delete it to start over")
            if state.get("data_order") != order:
                raise MemtocError(f"{ckpt}: stored data order differs from this run's (seed or data changed)")
            state = _load_checkpoint(ckpt, model, optimizer)
            step, losses, resumed_from = int(state["step"]), list(state["losses"]), int(state["step"])
            log(f"{out}: resuming {cfg.objective} at step {step}/{total}")
        out.mkdir(parents=True, exist_ok=True)
        end = total if stop_after is None else min(total, stop_after)
        t0 = time.time()
        while step < end:
            epoch, i = divmod(step, steps_per_epoch)
            idx = order[epoch][i * cfg.batch_size:(i + 1) * cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            st = step_loss(model, [examples[j] for j in idx], cfg, pad_id, device)
            for group in optimizer.param_groups:         # the schedule is a function of the step: resumable
                group["lr"] = lr_at(cfg.lr, cfg.lr_schedule, step, total)
            optimizer.step()
            step += 1
            losses.append({"step": step, "epoch": epoch, **{k: round(v, 6) for k, v in st.items()}})
            log(f"{cfg.objective} step {step}/{total} loss {st['loss']:.4f}")
            if step % cfg.save_every == 0 or step == end:
                _save_checkpoint(ckpt, model, optimizer, {"identity_sha256": ident_hash, "step": step,
                                                          "total_steps": total, "data_order": order,
                                                          "losses": losses})
        if step < total:
            log(f"{out}: stopped at step {step}/{total}; re-run to resume")
            return TrainResult(path=out, completed=False, steps_done=step, total_steps=total, losses=losses,
                               resumed_from=resumed_from, adapter_sha256=None, meta={})
        with warnings.catch_warnings():  # a GGUF source has no config.json beside it; peft says so, harmlessly
            warnings.filterwarnings("ignore", message="Could not find a config file")
            model.save_pretrained(str(out))
        digest = adapter_sha256(out)
        meta = {"schema_version": ADAPTER_SCHEMA, "identity": identity, "identity_sha256": ident_hash,
                "adapter_sha256": digest, "objective": cfg.objective, "train_config": cfg.to_dict(),
                "target_modules": sorted(lcfg.target_modules), "base": {k: provenance.get(k) for k in (
                    "model", "model_source", "model_path", "gguf_file", "weights", "architecture", "dtype",
                    "device", "chat_template_sha256")},
                "data": pair_set.meta, "train_question_ids": pair_set.question_ids,
                "train_instance_ids": sorted({p.instance_id for p in pair_set.pairs}),
                "n_examples": len(examples), "steps": total, "steps_per_epoch": steps_per_epoch,
                "resumed_from_step": resumed_from, "losses": losses,
                "seconds_this_session": round(time.time() - t0, 2), **(extra_meta or {})}
        write_json_atomic(meta_path, meta)
        shutil.rmtree(ckpt, ignore_errors=True)  # the finished adapter supersedes it
        log(f"{out}: {cfg.objective} adapter saved ({total} steps, sha256 {digest[:12]})")
        return TrainResult(path=out, completed=True, steps_done=total, total_steps=total, losses=losses,
                           resumed_from=resumed_from, adapter_sha256=digest, meta=meta)
    finally:
        model.eval()        # the copy and its LoRA layers go with ``model``; the served model was never touched
