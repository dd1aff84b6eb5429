"""Tokenization of (prompt, completion) examples with labels on the completion only.

The prompt is tokenized exactly as evaluation tokenizes it (templated text without added special tokens), the
completion separately without special tokens, then the tokenizer's EOS id is appended so the model learns to stop
after the FINAL line; tokenizing the parts separately keeps the boundary exact.

Batches are LEFT padded with position ids from the attention mask, as in evaluation, so every row's completion
ends at the last column and only the last ``max completion + 1`` logits are needed (``logits_to_keep``). Labels
are -100 on padding and prompt tokens, decided by the row length, never by comparing ids with ``pad_token_id``:
many models pad with the EOS id, and the completion's own EOS must keep its label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from memtoc.backends.chat import encode_formatted
from memtoc.core.errors import MemtocError

IGNORE_INDEX = -100


@dataclass(frozen=True)
class EncodedExample:
    """Token ids of one formatted prompt and one completion (EOS included when the tokenizer has one)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def encode_example(tokenizer: Any, prompt: str, completion: str, *, chat: bool, add_eos: bool = True,
                   max_length: int | None = None) -> EncodedExample:
    """Encode an already formatted prompt and its completion text; refuses (never truncates) an overlong one.

    Truncating would silently change what the model conditions on (the tool output or the question), so a
    too-long example is an error that names its length.
    """
    prompt_ids = encode_formatted(tokenizer, [prompt], chat=chat)[0]
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if add_eos and tokenizer.eos_token_id is not None:
        completion_ids.append(int(tokenizer.eos_token_id))
    if not completion_ids:
        raise MemtocError(f"completion {completion!r} encodes to no tokens")
    ex = EncodedExample(tuple(prompt_ids), tuple(completion_ids))
    if max_length is not None and ex.length > max_length:
        raise MemtocError(f"training example of {ex.length} tokens exceeds --max-length {max_length} "
                          f"(prompt {len(prompt_ids)}, completion {len(completion_ids)}); raise --max-length")
    return ex


def collate(examples: Sequence[EncodedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded batch: ``input_ids``, ``attention_mask``, ``position_ids``, ``labels`` and ``n_keep``.

    ``labels[i, t]`` is the token id where t is a completion position of row i, else -100 (prompt and
    padding). ``n_keep`` (a 0-d tensor) is the number of trailing positions whose logits the losses need.
    """
    if not examples:
        raise ValueError("collate needs at least one example")
    width = max(e.length for e in examples)
    n = len(examples)
    input_ids = torch.full((n, width), int(pad_id), dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        row = list(e.prompt_ids) + list(e.completion_ids)
        start = width - len(row)
        input_ids[i, start:] = torch.tensor(row, dtype=torch.long)
        attention[i, start:] = 1
        labels[i, width - len(e.completion_ids):] = torch.tensor(e.completion_ids, dtype=torch.long)
    position_ids = (attention.cumsum(-1) - 1).masked_fill(attention == 0, 1)
    n_keep = max(len(e.completion_ids) for e in examples) + 1
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids, "labels": labels,
            "n_keep": torch.tensor(min(n_keep, width))}
