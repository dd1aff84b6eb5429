"""What an intervention does, whatever the backend: the plans ``HookedBackend.intervene`` runs.

An edit or a capture says *what* (sites, positions of a batch, the kind's ``row_appliers`` with a strength per row,
or states to read); each backend says *how*: hf with hooks on its module tree (``memtoc.backends.hf_plans``), vllm
with token-row hooks in its workers (``memtoc.backends.vllm_plans``). Site 0 = embedding output, site ``s`` =
output of block ``s - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

#: ``fn(hidden [B, S, d], rows [n], cols [n][, strengths=[B] float64]) -> new hidden``: the hf hook form of a
#: :data:`RowApplier` (``memtoc.backends.hf_plans.column_applier``).
Applier = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class EditRows:
    """Where a row applier acts, one entry per edited position.

    ``rows``: the position's row in the bound batch (hf: the row of the forward chunk); ``cols``: hf, its column
    within the forward chunk; vllm, its absolute token index in the row's sequence. ``strength`` (float64
    ``[k]``) is the edit's strength at that row, so one pass can carry several strengths; ``scalar`` is that
    strength as a float when every entry shares it (the kinds then compute exactly as with one strength).
    """

    rows: torch.Tensor
    cols: torch.Tensor
    strength: torch.Tensor
    scalar: float | None = None


#: ``fn(x [k, d], where) -> x' [k, d]``: the one applier interface of every edit kind (``Edit.row_appliers``).
RowApplier = Callable[[torch.Tensor, EditRows], torch.Tensor]


@dataclass
class PositionPlan:
    """The columns of one left-padded batch that an edit touches.

    ``prompt_mask[b, c]``: column ``c < T`` of row ``b`` is edited on any pass that computes it;
    ``generated_rows[b]``: every column ``>= T`` of row ``b`` (generated tokens) is edited.
    """

    prompt_mask: np.ndarray          # [B, T] bool
    generated_rows: np.ndarray       # [B] bool
    #: [B] left padding of each row (None: unknown; then no prefix is shared)
    n_pad: np.ndarray | None = None
    #: [B] float64 strength of each row (None: the edit's own strength for every row)
    row_strength: np.ndarray | None = None
    _dev: dict = field(default_factory=dict, repr=False)

    @property
    def width(self) -> int:
        return int(self.prompt_mask.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.prompt_mask.shape[0])

    @property
    def empty(self) -> bool:
        return not self.prompt_mask.any() and not self.generated_rows.any()

    def subset(self, rows: Sequence[int]) -> "PositionPlan":
        """The plan of a batch reduced to ``rows`` (in that order), e.g. after finished rows left the batch;
        columns keep their absolute numbering (the KV cache keeps every column)."""
        idx = np.asarray(list(rows), dtype=np.int64)
        return PositionPlan(prompt_mask=self.prompt_mask[idx], generated_rows=self.generated_rows[idx],
                            n_pad=None if self.n_pad is None else self.n_pad[idx],
                            row_strength=None if self.row_strength is None else self.row_strength[idx])

    def with_strengths(self, strengths: Sequence[float]) -> "PositionPlan":
        """The same positions with one strength per row (strengths as rows of one batch)."""
        st = np.asarray([float(x) for x in strengths], dtype=np.float64)
        if st.shape != (self.batch_size,):
            raise ValueError(f"{st.size} row strengths for a batch of {self.batch_size} rows")
        return PositionPlan(prompt_mask=self.prompt_mask, generated_rows=self.generated_rows, n_pad=self.n_pad,
                            row_strength=st)

    def row_prefix_limits(self) -> list[int]:
        """Each row's leading tokens that no edit touches (all 0 when the padding is unknown): rows repeating one
        prompt may share its prefill up to there (the decoder's grouped prefill)."""
        if self.n_pad is None:
            return [0] * self.batch_size
        out = []
        for b in range(self.batch_size):
            cols = np.flatnonzero(self.prompt_mask[b])
            out.append(max(int(cols[0]) - int(self.n_pad[b]), 0) if cols.size else self.width)
        return out

    @classmethod
    def from_layouts(cls, layouts: Sequence[Any], positions: str, width: int) -> "PositionPlan":
        """``positions``: last_input | tool_span | from_tool_return. Rows without a tool output get no tool edits.

        ``width`` is the batch's column count; tokens after a row's prompt (a continuation appended for a
        teacher-forced forward) count as generated tokens.
        """
        B = len(layouts)
        mask = np.zeros((B, width), dtype=bool)
        gen = np.zeros(B, dtype=bool)
        for r, lay in enumerate(layouts):
            if positions in ("last_input", "tool_span"):
                mask[r, lay.columns(lay.select(positions))] = True
            elif positions == "from_tool_return":
                span = lay.tool_token_span()
                if span is not None:
                    mask[r, lay.n_pad + span[0]:] = True     # prompt tokens from the tool output + continuation
                    gen[r] = True
            else:
                raise ValueError(f"unknown edit positions {positions!r}")
        return cls(prompt_mask=mask, generated_rows=gen, n_pad=np.asarray([lay.n_pad for lay in layouts],
                                                                          dtype=np.int64))

    def _device_state(self, device: torch.device) -> dict[str, torch.Tensor]:
        st = self._dev.get(device)
        if st is None:
            rows, cols = np.nonzero(self.prompt_mask)
            st = {
                "mask": torch.as_tensor(self.prompt_mask, device=device),
                "gen": torch.as_tensor(self.generated_rows, device=device),
                "prompt_rows": torch.as_tensor(rows, dtype=torch.long, device=device),
                "prompt_cols": torch.as_tensor(cols, dtype=torch.long, device=device),
                "gen_rows": torch.as_tensor(np.flatnonzero(self.generated_rows), dtype=torch.long, device=device),
            }
            if self.row_strength is not None:
                st["strength"] = torch.as_tensor(self.row_strength, dtype=torch.float64, device=device)
            self._dev[device] = st
        return st

    def chunk_index(self, offset: int, length: int, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rows, cols)`` to edit in a chunk covering absolute columns ``offset .. offset + length``; None if none.

        The two common chunks (the whole prompt, and one generated token) use precomputed index tensors, so a
        decoding step costs no host-device synchronisation.
        """
        T = self.width
        st = self._device_state(device)
        if offset == 0 and length == T:
            if st["prompt_rows"].numel() == 0:
                return None
            return st["prompt_rows"], st["prompt_cols"]
        if offset >= T:
            rows = st["gen_rows"]
            if rows.numel() == 0:
                return None
            if length == 1:
                return rows, torch.zeros_like(rows)
            r = rows.repeat_interleave(length)
            c = torch.arange(length, device=device).repeat(rows.numel())
            return r, c
        # General chunk (generation without a cache recomputes prompt + generated columns from 0).
        cols = torch.arange(offset, offset + length, device=device)
        in_prompt = cols < T
        m = torch.zeros((self.batch_size, length), dtype=torch.bool, device=device)
        m[:, in_prompt] = st["mask"][:, cols[in_prompt]]
        m[:, ~in_prompt] = st["gen"][:, None]
        rows, c = torch.nonzero(m, as_tuple=True)
        if rows.numel() == 0:
            return None
        return rows, c


@dataclass
class EditPlan:
    """``edit`` (its kind's ``row_appliers``, ``layers``, ``strength``, ...) on the columns it touches of one batch,
    with a strength per row (None: the edit's own)."""

    edit: Any
    positions: PositionPlan
    strengths: list[float] | None = None

    def row_prefix_limits(self) -> list[int]:
        """Each row's leading tokens no edit touches: the decoder may prefill them once (0 for a kind whose
        appliers must see the prompt pass from column 0, ``prefix_sharing = False``)."""
        p = self.positions
        return p.row_prefix_limits() if self.edit.prefix_sharing else [0] * p.batch_size


@dataclass
class CapturePlan:
    """Residual states to read at ``sites``: ``n`` positions, each as its row, its column in the left-padded batch
    and its index among its row's ``n_tokens``. The backend fills ``values[site]`` (``[n, d]``; on the host with
    ``to_host``) by the time ``intervene`` exits. ``hooks`` (``memtoc.backends.hooks.Hook``, with ``eager``
    attention): extra readers on the module tree (the detached lens's factors); a backend without one refuses."""

    sites: tuple[int, ...]
    rows: np.ndarray
    columns: np.ndarray
    token_index: np.ndarray
    n_tokens: Sequence[int]
    to_host: bool = True
    hooks: Sequence[Any] = ()
    eager: bool = False
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def last_position(cls, sites: Sequence[int], batch: Any, **kwargs: Any) -> "CapturePlan":
        """Every row's last token (the last column of a left-padded batch)."""
        ids = batch["input_ids"]
        B, T = int(ids.shape[0]), int(ids.shape[1])
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        n = [T] * B if mask is None else [int(x) for x in mask.sum(-1).tolist()]
        return cls(tuple(sites), np.arange(B), np.full(B, T - 1), np.asarray(n) - 1, n, **kwargs)


@dataclass
class HookPlan:
    """``fn(site or name, value)`` at residual ``sites`` or named hook points (``memtoc.backends.parts.hook_point``); a
    tensor it returns replaces the value (patching, lens fitting, forward-mode lenses; module trees only)."""

    fn: Callable[[Any, torch.Tensor], Any]
    sites: Sequence[int] = ()
    names: Sequence[str] = ()
