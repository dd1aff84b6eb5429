"""Completion-only label masking (token by token), sequence log-probs, SFT cross-entropy and the DPO loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from memtoc.backends.chat import encode_formatted
from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import MemtocError
from memtoc.jobs.finetune.data import build_pairs
from memtoc.jobs.finetune.losses import dpo_loss, sequence_logprobs, sft_loss
from memtoc.jobs.finetune.tokens import IGNORE_INDEX, EncodedExample, collate, encode_example
from memtoc.jobs.finetune.train import forward_tail_logits

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pairs(tiny_backend):
    return build_pairs(load_benchmark("demo").questions[:3], tiny_backend.format_prompt)


def test_encode_prompt_as_evaluation_and_completion_with_eos(pairs, tiny_backend):
    tok = tiny_backend.tokenizer
    p = pairs[0]
    ex = encode_example(tok, p.prompt, p.chosen, chat=True)
    assert list(ex.prompt_ids) == encode_formatted(tok, [p.prompt], chat=True)[0]
    # The evaluator's own batch encoding of the user prompt gives the same ids.
    enc = tiny_backend.encode([p.user_prompt])
    assert enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist() == list(ex.prompt_ids)
    assert ex.completion_ids[-1] == tok.eos_token_id
    assert tok.decode(list(ex.completion_ids[:-1])) == p.chosen
    with pytest.raises(MemtocError, match="exceeds --max-length"):
        encode_example(tok, p.prompt, p.chosen, chat=True, max_length=10)


def test_labels_are_masked_on_prompt_and_padding_token_by_token(pairs, tiny_backend):
    tok = tiny_backend.tokenizer
    exs = [encode_example(tok, p.prompt, c, chat=True) for p, c in
           [(pairs[0], pairs[0].chosen), (pairs[1], pairs[1].rejected), (pairs[4], pairs[4].chosen)]]
    assert len({e.length for e in exs}) > 1          # so there is padding to mask
    b = collate(exs, pad_id=tok.pad_token_id)
    width = max(e.length for e in exs)
    assert b["input_ids"].shape == b["labels"].shape == (3, width)
    for i, e in enumerate(exs):
        n_pad = width - e.length
        n_prompt = len(e.prompt_ids)
        for t in range(width):
            tok_id, lab = int(b["input_ids"][i, t]), int(b["labels"][i, t])
            if t < n_pad:                                  # left padding
                assert tok_id == tok.pad_token_id and int(b["attention_mask"][i, t]) == 0 and lab == IGNORE_INDEX
            elif t < n_pad + n_prompt:                     # prompt
                assert tok_id == e.prompt_ids[t - n_pad] and lab == IGNORE_INDEX
                assert int(b["attention_mask"][i, t]) == 1
            else:                                          # completion: labelled with its own id
                assert lab == tok_id == e.completion_ids[t - n_pad - n_prompt]
        real = b["attention_mask"][i].bool()
        assert b["position_ids"][i][real].tolist() == list(range(e.length))
    assert int(b["n_keep"]) == max(len(e.completion_ids) for e in exs) + 1


def test_eos_keeps_its_label_when_the_pad_id_is_the_eos_id():
    # The default SmolLM2 pads with its EOS id: padding must be decided by position, not by id.
    eos = 7
    exs = [EncodedExample((1, 2, 3), (4, eos)), EncodedExample((1, 2, 3, 5, 6), (4, 9, eos))]
    b = collate(exs, pad_id=eos)
    assert b["labels"].tolist() == [[-100, -100, -100, -100, -100, -100, 4, eos],
                                    [-100, -100, -100, -100, -100, 4, 9, eos]]
    assert b["input_ids"].tolist()[0] == [eos, eos, eos, 1, 2, 3, 4, eos]
    assert b["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8]


def test_dpo_loss_against_a_hand_computed_value():
    pc, pr = torch.tensor([-3.0, -10.0]), torch.tensor([-5.0, -4.0])
    rc, rr = torch.tensor([-4.0, -9.0]), torch.tensor([-4.5, -4.5])
    beta = 0.1
    losses, st = dpo_loss(pc, pr, rc, rr, beta)
    # row 0: margin = 0.1 * ((-3 + 4) - (-5 + 4.5)) = 0.15 ; row 1: 0.1 * ((-10 + 9) - (-4 + 4.5)) = -0.15
    expected = [math.log(1 + math.exp(-0.15)), math.log(1 + math.exp(0.15))]
    assert losses.tolist() == pytest.approx(expected, abs=1e-6)
    assert st["reward_accuracy"] == 0.5
    assert st["reward_chosen"] == pytest.approx((0.1 * 1 + 0.1 * -1) / 2)
    zero, _ = dpo_loss(pc, pr, pc, pr, beta)          # policy == reference: log 2
    assert zero.tolist() == pytest.approx([math.log(2)] * 2)


def test_sequence_logprob_matches_a_manual_computation_on_the_tiny_model(pairs, tiny_backend):
    tok, model = tiny_backend.tokenizer, tiny_backend.model
    exs = [encode_example(tok, pairs[0].prompt, pairs[0].chosen, chat=True),
           encode_example(tok, pairs[3].prompt, pairs[3].rejected, chat=True)]
    b = collate(exs, pad_id=tok.pad_token_id)
    with torch.no_grad():
        got = sequence_logprobs(forward_tail_logits(model, b, torch.device("cpu")), b["labels"])
        sft_sum, n_tok = sft_loss(forward_tail_logits(model, b, torch.device("cpu")), b["labels"])
        manual, ce_terms = [], []
        for e in exs:  # each row alone, unpadded, full logits, summed by hand
            ids = torch.tensor([list(e.prompt_ids) + list(e.completion_ids)])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            start = len(e.prompt_ids)
            terms = [float(logp[t - 1, ids[0, t]]) for t in range(start, ids.shape[1])]
            manual.append(sum(terms))
            ce_terms += terms
    assert got.tolist() == pytest.approx(manual, abs=1e-4)
    assert int(n_tok) == sum(len(e.completion_ids) for e in exs)
    assert float(sft_sum) == pytest.approx(-sum(ce_terms), abs=1e-3)
    # and equals torch's cross-entropy with ignore_index over the full padded batch
    with torch.no_grad():
        full = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     position_ids=b["position_ids"]).logits
    ce = F.cross_entropy(full[:, :-1].reshape(-1, full.shape[-1]), b["labels"][:, 1:].reshape(-1),
                         ignore_index=IGNORE_INDEX, reduction="sum")
    assert float(sft_sum) == pytest.approx(float(ce), abs=1e-3)
