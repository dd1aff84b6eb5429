"""Position selectors over a left-padded batch, shared by activation capture and steering edits.

Indices come as ``token_index`` (the position in the row's own unpadded tokens, what the store records) or
``column`` (``n_pad + token_index``, what a hook indexes). Kinds:

- ``last_input``: the final prompt token (where generation starts);
- ``tool_span``: every token whose character range overlaps the serialized tool output, found through the
  tokenizer's offset mapping (the first may also carry characters just before the output);
- ``from_tool_return``: every prompt token from the first ``tool_span`` token to the end of the prompt;
- ``all``: every prompt token;
- ``generated``: tokens appended after the prompt (a generation's ``token_ids``, read teacher-forced).

Episodes without a tool output select no ``tool_span`` / ``from_tool_return`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from activations import ActivationStoreError
from memtoc.backends.chat import add_special_tokens
from memtoc.backends.tokens import TokenBatch
from memtoc.core.vocab import POSITION_KINDS


class PositionSpecError(ActivationStoreError):
    """A position selection that cannot be applied (unknown kind, empty list, span that does not map)."""


def parse_positions(spec: str | Sequence[str]) -> tuple[str, ...]:
    """A comma list (or sequence) of position kinds, validated, duplicates dropped, order kept."""
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if str(s).strip()]
    if not items:
        raise PositionSpecError(f"empty position selection; choose one or more of {', '.join(POSITION_KINDS)}")
    for kind in items:
        if kind not in POSITION_KINDS:
            raise PositionSpecError(f"unknown position kind {kind!r}; choose from {', '.join(POSITION_KINDS)}")
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class RowLayout:
    """One row of a left-padded batch: its templated text, token ids and character offsets."""

    text: str                              # the exact string the model is conditioned on (templated prompt)
    n_pad: int                             # left-padding columns before the first real token
    token_ids: np.ndarray                  # real tokens: prompt tokens, then any appended continuation
    offsets: np.ndarray                    # [n_prompt, 2] character offsets of the prompt tokens in ``text``
    tool_span: tuple[int, int] | None      # character span of the tool output in ``text`` (None: no tool)

    @property
    def n_prompt(self) -> int:
        return int(self.offsets.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def tool_token_span(self) -> tuple[int, int] | None:
        """``(first, stop)`` token indices of the tool output, or None when the row has no tool output."""
        if self.tool_span is None:
            return None
        return char_span_to_tokens(self.offsets, *self.tool_span)

    def select(self, kind: str) -> np.ndarray:
        """Token indices (into the unpadded row) of one position kind, ascending."""
        if kind == "last_input":
            return np.array([self.n_prompt - 1], dtype=np.int64)
        if kind == "all":
            return np.arange(self.n_prompt, dtype=np.int64)
        if kind == "generated":
            return np.arange(self.n_prompt, self.n_tokens, dtype=np.int64)
        if kind in ("tool_span", "from_tool_return"):
            span = self.tool_token_span()
            if span is None:
                return np.zeros(0, dtype=np.int64)
            stop = span[1] if kind == "tool_span" else self.n_prompt
            return np.arange(span[0], stop, dtype=np.int64)
        raise PositionSpecError(f"unknown position kind {kind!r}; choose from {', '.join(POSITION_KINDS)}")

    def columns(self, token_index: np.ndarray) -> np.ndarray:
        """Batch columns of token indices (left padding shifts every index by ``n_pad``)."""
        return np.asarray(token_index, dtype=np.int64) + self.n_pad


def char_span_to_tokens(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """Tokens whose character range ``[s, e)`` overlaps ``[start, end)``, as ``(first, stop)``.

    Zero-width tokens (offsets ``(k, k)``) never overlap. Raises when no token overlaps the span.
    """
    offsets = np.asarray(offsets).reshape(-1, 2)
    s, e = offsets[:, 0], offsets[:, 1]
    hit = np.flatnonzero((s < end) & (e > start) & (e > s))
    if end <= start or hit.size == 0:
        raise PositionSpecError(f"no token covers the character span [{start}, {end})")
    first, last = int(hit[0]), int(hit[-1])
    return first, last + 1


def user_span_in_text(text: str, user_prompt: str, span: tuple[int, int]) -> tuple[int, int]:
    """Map a character span within the user prompt into the templated string that contains it verbatim."""
    at = text.find(user_prompt)
    if at < 0:
        # Some chat templates strip the message; the span is still valid if the stripped prompt is verbatim.
        stripped = user_prompt.strip()
        lead = len(user_prompt) - len(user_prompt.lstrip())
        at2 = text.find(stripped) if stripped else -1
        if at2 < 0 or not (lead <= span[0] and span[1] <= lead + len(stripped)):
            raise PositionSpecError("the templated prompt does not contain the user prompt verbatim, so the tool "
                                    "output span cannot be located")
        at = at2 - lead
    start, end = span[0] + at, span[1] + at
    if text[start:end] != user_prompt[span[0]:span[1]]:
        raise PositionSpecError("the tool output span does not map onto the templated prompt")
    return start, end


def layout_batch(tokenizer: Any, texts: Sequence[str], input_ids: Any, attention_mask: Any, *,
                 add_special_tokens: bool, tool_spans: Sequence[tuple[int, int] | None] | None = None
                 ) -> list[RowLayout]:
    """Row layouts of a left-padded batch of ``texts`` (already templated); spans are within ``texts``.

    The offsets come from tokenizing each text with ``return_offsets_mapping=True``; the resulting ids must
    be a prefix of the batch row's real tokens (anything after them is an appended continuation).
    """
    ids = np.asarray(input_ids.detach().cpu() if hasattr(input_ids, "detach") else input_ids)
    mask = np.asarray(attention_mask.detach().cpu() if hasattr(attention_mask, "detach") else attention_mask)
    if ids.shape[0] != len(texts):
        raise PositionSpecError(f"batch has {ids.shape[0]} rows but {len(texts)} prompts were given")
    spans = list(tool_spans) if tool_spans is not None else [None] * len(texts)
    enc = tokenizer(list(texts), return_offsets_mapping=True, add_special_tokens=add_special_tokens)
    rows = []
    for i, text in enumerate(texts):
        m = mask[i].astype(bool)
        n_pad = int((~m).sum())
        if m[n_pad:].size and not m[n_pad:].all():
            raise PositionSpecError(f"row {i} is not left-padded (padding after the first real token)")
        real = ids[i, n_pad:].astype(np.int64)
        prompt_ids = np.asarray(enc["input_ids"][i], dtype=np.int64)
        if real.shape[0] < prompt_ids.shape[0] or not np.array_equal(real[:prompt_ids.shape[0]], prompt_ids):
            raise PositionSpecError(f"row {i}: the batch's token ids differ from the tokenization with offsets; "
                                    "was the batch built from these prompts by the same tokenizer?")
        offsets = np.asarray(enc["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
        rows.append(RowLayout(text=text, n_pad=n_pad, token_ids=real, offsets=offsets, tool_span=spans[i]))
    return rows


def layout_token_batch(batch: TokenBatch, tool_spans: Sequence[tuple[int, int] | None] | None = None
                       ) -> list[RowLayout]:
    """Row layouts read straight from a :class:`TokenBatch` (ids and offsets of its one tokenization)."""
    spans = list(tool_spans) if tool_spans is not None else [None] * len(batch.texts)
    mask = np.asarray(batch.attention_mask.detach().cpu())
    rows = []
    for i, text in enumerate(batch.texts):
        n_pad = int(mask.shape[1] - len(batch.rows[i]))
        if not mask[i, n_pad:].all() or mask[i, :n_pad].any():
            raise PositionSpecError(f"row {i} is not left-padded (padding after the first real token)")
        rows.append(RowLayout(text=text, n_pad=n_pad, token_ids=np.asarray(batch.rows[i], dtype=np.int64),
                              offsets=batch.offsets[i], tool_span=spans[i]))
    return rows


def layout_backend_batch(backend: Any, prompts: Sequence[Any], batch: Mapping[str, Any],
                         tool_spans: Sequence[tuple[int, int] | None] | None = None) -> list[RowLayout]:
    """Row layouts for a batch built by ``backend.encode(prompts)`` (or ``backend.forward``).

    ``tool_spans`` are character spans within the user prompts, shifted into the templated strings. A
    :class:`TokenBatch` carries its own offsets; any other mapping of ``input_ids`` / ``attention_mask`` is laid
    out by tokenizing the formatted prompts once more.
    """
    texts = [backend.format_prompt(p) for p in prompts]
    text_spans = None
    if tool_spans is not None:
        if len(tool_spans) != len(prompts):
            raise PositionSpecError(f"{len(tool_spans)} tool spans for {len(prompts)} prompts")
        text_spans = [None if sp is None else user_span_in_text(t, p, tuple(sp))
                      for t, p, sp in zip(texts, prompts, tool_spans)]
    if isinstance(batch, TokenBatch):
        if list(batch.texts) != texts:
            raise PositionSpecError("the batch's prompts differ from the prompts given; was it encoded "
                                    "from these prompts by this backend?")
        return layout_token_batch(batch, text_spans)
    return layout_batch(backend.tokenizer, texts, batch["input_ids"], batch["attention_mask"],
                        add_special_tokens=add_special_tokens(backend.chat), tool_spans=text_spans)


@dataclass(frozen=True)
class Selection:
    """Selected (row, position) pairs of a batch, flattened: row-major, then kind order, then token order."""

    row: np.ndarray          # batch row of each entry
    column: np.ndarray       # padded batch column (what a hook indexes)
    token_index: np.ndarray  # index in the row's unpadded token sequence
    kind: np.ndarray         # position kind (str) of each entry
    token_id: np.ndarray     # token id at that position

    def __len__(self) -> int:
        return int(self.row.shape[0])


@dataclass(frozen=True)
class PositionSelector:
    """A set of position kinds; ``select(layouts)`` gives the flattened selection of a batch."""

    kinds: tuple[str, ...]

    @classmethod
    def parse(cls, spec: str | Sequence[str]) -> "PositionSelector":
        return cls(parse_positions(spec))

    def __post_init__(self) -> None:
        parse_positions(self.kinds)

    @property
    def needs_generation(self) -> bool:
        return "generated" in self.kinds

    def per_row(self, layout: RowLayout) -> list[tuple[str, np.ndarray]]:
        return [(kind, layout.select(kind)) for kind in self.kinds]

    def select(self, layouts: Sequence[RowLayout]) -> Selection:
        rows, cols, tok, kinds, ids = [], [], [], [], []
        for r, lay in enumerate(layouts):
            for kind, idx in self.per_row(lay):
                rows.append(np.full(idx.shape, r, dtype=np.int64))
                cols.append(lay.columns(idx))
                tok.append(idx)
                kinds.append(np.full(idx.shape, kind, dtype=object))
                ids.append(lay.token_ids[idx])
        def cat(xs: list[np.ndarray], dt: Any) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(0, dtype=dt)

        return Selection(row=cat(rows, np.int64), column=cat(cols, np.int64), token_index=cat(tok, np.int64),
                         kind=cat(kinds, object), token_id=cat(ids, np.int64))
