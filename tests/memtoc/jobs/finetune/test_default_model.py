"""The one real-model check: on SmolLM2 (which pads with its EOS id) the training tokens match evaluation's."""

from __future__ import annotations

import pytest
import torch

from memtoc.bench.benchmark import load_benchmark
from memtoc.jobs.finetune.data import build_pairs
from memtoc.jobs.finetune.lora import find_target_modules
from memtoc.jobs.finetune.losses import sequence_logprobs
from memtoc.jobs.finetune.tokens import IGNORE_INDEX, collate, encode_example
from memtoc.jobs.finetune.train import forward_tail_logits


@pytest.mark.real_model
def test_default_model_tokens_masks_and_logprobs(default_backend):
    torch.set_num_threads(1)
    b = default_backend
    tok = b.tokenizer
    assert tok.pad_token_id == tok.eos_token_id            # the case the position-based masking exists for
    assert find_target_modules(b.model) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    p = build_pairs(load_benchmark("demo").questions[:1], b.format_prompt)[0]
    ex = encode_example(tok, p.prompt, p.chosen, chat=b.chat)
    enc = b.encode([p.user_prompt])
    assert enc["input_ids"][0].tolist() == list(ex.prompt_ids)          # the evaluator's prompt tokens
    assert tok.decode(list(ex.completion_ids)) == p.chosen + tok.eos_token
    short = encode_example(tok, p.prompt, "FINAL: x", chat=b.chat)
    batch = collate([ex, short], pad_id=tok.pad_token_id)
    assert batch["labels"][0, -1] == tok.eos_token_id and batch["labels"][1, -1] == tok.eos_token_id
    assert (batch["labels"][0] != IGNORE_INDEX).sum() == len(ex.completion_ids)
    with torch.no_grad():
        got = sequence_logprobs(forward_tail_logits(b.model, batch, b.device), batch["labels"].to(b.device))
        ids = torch.tensor([list(ex.prompt_ids) + list(ex.completion_ids)], device=b.device)
        logp = torch.log_softmax(b.model(input_ids=ids).logits[0].double(), -1)
        n = len(ex.prompt_ids)
        manual = sum(float(logp[t - 1, ids[0, t]]) for t in range(n, ids.shape[1]))
    assert float(got[0]) == pytest.approx(manual, abs=2e-3)
