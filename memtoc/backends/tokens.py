"""``TokenBatch``: formatted prompts tokenized once, left padded, with every token's character offsets.

A capture or an edit needs to know which tokens cover which characters of the formatted prompt (the tool output
span, say). The offsets come from the same tokenizer call that produced the ids, so nothing downstream
re-tokenizes: ``activations.positions`` reads them from the batch.

A ``TokenBatch`` is also a read-only mapping of its tensors (``input_ids``, ``attention_mask``), so it can be
passed as ``model(**batch)`` and indexed as ``batch["input_ids"]`` like the dict it replaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from memtoc.backends.chat import add_special_tokens


def left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``rows`` left-padded to the longest."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r):] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


@dataclass(frozen=True, eq=False)
class TokenBatch(Mapping[str, torch.Tensor]):
    """One left-padded batch of formatted prompts (optionally with appended continuation tokens).

    ``offsets[i]`` is ``[n_prompt_i, 2]``: the character range of each prompt token of row ``i`` within
    ``texts[i]`` (tokens appended after the prompt have no characters). ``rows[i]`` holds the row's real token
    ids (prompt, then continuation).
    """

    texts: tuple[str, ...]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    offsets: tuple[np.ndarray, ...]
    n_prompt: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...] = field(repr=False)
    pad_id: int = 0

    # -- mapping view of the tensors ------------------------------------------------------------------------
    def __getitem__(self, key: str) -> torch.Tensor:
        if key == "input_ids":
            return self.input_ids
        if key == "attention_mask":
            return self.attention_mask
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("input_ids", "attention_mask"))

    def __len__(self) -> int:
        return 2

    @property
    def n_pad(self) -> tuple[int, ...]:
        width = int(self.input_ids.shape[1])
        return tuple(width - len(r) for r in self.rows)

    def to(self, device: torch.device | str) -> "TokenBatch":
        return replace(self, input_ids=self.input_ids.to(device), attention_mask=self.attention_mask.to(device))

    def with_continuations(self, continuations: Sequence[Sequence[int]]) -> "TokenBatch":
        """Each row's prompt tokens followed by its continuation ids, re-padded (left); offsets are kept."""
        if len(continuations) != len(self.rows):
            raise ValueError(f"{len(continuations)} continuations for {len(self.rows)} prompts")
        rows = tuple(tuple(r[:n]) + tuple(int(t) for t in c)
                     for r, n, c in zip(self.rows, self.n_prompt, continuations))
        ids, mask = left_pad(rows, self.pad_id, self.input_ids.device)
        return replace(self, input_ids=ids, attention_mask=mask, rows=rows)


def encode_texts(tokenizer: Any, texts: Sequence[str], *, chat: bool, device: torch.device | str = "cpu"
                 ) -> TokenBatch:
    """Tokenize formatted ``texts`` once (ids + offsets), the one way every backend tokenizes prompts."""
    texts = tuple(texts)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    if not texts:
        empty = torch.zeros((0, 0), dtype=torch.long, device=device)
        return TokenBatch(texts, empty, empty.clone(), (), (), (), pad_id)
    enc = tokenizer(list(texts), add_special_tokens=add_special_tokens(chat), return_offsets_mapping=True)
    rows = tuple(tuple(int(t) for t in ids) for ids in enc["input_ids"])
    offsets = tuple(np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in enc["offset_mapping"])
    ids, mask = left_pad(rows, pad_id, device)
    return TokenBatch(texts=texts, input_ids=ids, attention_mask=mask, offsets=offsets,
                      n_prompt=tuple(len(r) for r in rows), rows=rows, pad_id=pad_id)
