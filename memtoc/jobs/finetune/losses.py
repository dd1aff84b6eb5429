"""The two training objectives, written out rather than borrowed from trl.

Why not trl: it would be one more heavy dependency (with its own pinned transformers range) for what is, here,
about ten lines; and the masking has to match :mod:`memtoc.jobs.finetune.tokens` exactly (left padding, EOS as
padding id, completion-only labels), which is easier to guarantee — and to test token by token — when the
loss is ours.

All functions take logits for the LAST ``k`` positions of a left-padded batch (``logits_to_keep=k``) together
with the full ``labels``; positions are aligned from the right.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from memtoc.jobs.finetune.tokens import IGNORE_INDEX


def _aligned(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token logits and their target ids: logits[:, j] predicts labels at the following position."""
    k = logits.shape[1]
    tail = labels[:, labels.shape[1] - k:]
    return logits[:, :-1].float(), tail[:, 1:]


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log p(label) and the mask of labelled positions (both ``[batch, k-1]``)."""
    lg, tgt = _aligned(logits, labels)
    mask = tgt != IGNORE_INDEX
    safe = tgt.masked_fill(~mask, 0)
    lp = torch.log_softmax(lg, dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return lp * mask, mask


def sequence_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over completion tokens of log p(token | prefix), one value per row (the DPO sequence score)."""
    lp, _ = token_logprobs(logits, labels)
    return lp.sum(-1)


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over completion tokens and the token count (divide the sum by the batch's total).

    Returning the sum lets gradient accumulation over micro-batches give the same token mean as one batch.
    """
    lp, mask = token_logprobs(logits, labels)
    return -lp.sum(), mask.sum()


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-pair DPO loss ``-log σ(β((πc − rc) − (πr − rr)))`` (Rafailov et al. 2023) and the implied rewards.

    Inputs are sequence log-probs (:func:`sequence_logprobs`) of the chosen and rejected completions under the
    policy and the frozen reference. Returns the per-pair losses (the caller averages) and diagnostics.
    """
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    losses = -F.logsigmoid(chosen_reward - rejected_reward)
    stats = {"reward_chosen": chosen_reward.detach().mean().item(),
             "reward_rejected": rejected_reward.detach().mean().item(),
             "reward_accuracy": (chosen_reward > rejected_reward).float().mean().item()}
    return losses, stats
