"""Edit hooks on the decoder blocks: which positions of which forward pass an edit touches.

One generate call runs the prompt forward (sequence length = padded prompt length ``T``) and then, with the
KV cache, one forward per generated token (sequence length 1). The hooks find the absolute column of every
position of a forward from the cache: a forward pre-hook on block 0 reads ``cache.get_seq_length()`` (0 on the
prompt pass and on every pass without a cache, where the whole sequence is recomputed). Position ``offset + i``
of a chunk is then

- a prompt column (``< T``): edited when the row's :class:`PositionPlan` selects it;
- a generated column (``>= T``): edited only for rows that edit generated tokens (``from_tool_return`` rows
  with a tool output).

So the edit is a function of the absolute column only, and generation with the cache, generation without the
cache and a teacher-forced forward over prompt + continuation edit exactly the same positions.

The shared-prefix decoder (``memtoc.backends.decode``) lays a row out as ``prefix, padding, suffix`` instead of
``padding, prefix, suffix``: every suffix token keeps its column and only the prefix tokens move. The plan is
therefore valid for both layouts as long as no row edits a prefix token, which the decoder guarantees by
sharing at most :meth:`PositionPlan.prefix_limit` tokens; the batch-of-one prefix pass itself is skipped
(``HookState.prefix``), and the suffix pass is an ordinary chunk at offset ``prefix``.

Per-row strengths (strengths as rows of one batch): a plan may carry ``row_strength`` (one strength per row,
following row compaction); the hooks then call every applier as ``fn(hidden, rows, cols, strengths=s)`` with
``s`` the float64 strength of each *current* batch row (``[B]``), and :func:`per_row_column_applier` hands the
kind's :data:`RowApplier` one strength per edited position (``EditRows.strength``) -- the same row-applier
interface the vLLM backend calls per request (:class:`PlanTokenHook`). Without ``row_strength`` appliers are
called as ``fn(hidden, rows, cols)`` at the edit's own strength.

Sites follow the activation store: site ``s >= 1`` is the output of block ``s - 1``, site 0 the input of
block 0. The hooks are installed by the one registrar (``memtoc.backends.hooks.site_hooks``), which also
records the cache offset of every forward and follows row compaction (its ``HookState``); this module only
decides, from the :class:`PositionPlan`, which positions of a forward the edit touches.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from activations.positions import RowLayout
from memtoc.backends import hooks as _hooks
from memtoc.backends.parts import n_sites

#: ``fn(hidden [B, S, d], rows [n], cols [n][, strengths=[B] float64]) -> new hidden`` (rows/cols index the
#: chunk; never empty): the hf hook form of a :data:`RowApplier` (:func:`column_applier`, one strength for the
#: batch; :func:`per_row_column_applier`, ``strengths`` = the strength of each current batch row, passed only for
#: plans with ``row_strength``).
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


#: ``fn(x [k, d], where) -> x' [k, d]``: the one applier interface of every edit kind (``Edit.row_appliers``), on
#: hf through :func:`column_applier`, on a token-row backend (vllm) through :class:`PlanTokenHook`.
RowApplier = Callable[[torch.Tensor, EditRows], torch.Tensor]


def column_applier(fn: RowApplier, strength: float) -> Applier:
    """A row applier as an hf chunk hook with one strength for the batch: gather ``hidden[rows, cols]``, apply,
    write back into a copy."""
    def apply(h: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        x = h[rows, cols]
        s = torch.full((rows.numel(),), float(strength), dtype=torch.float64, device=rows.device)
        new = fn(x, EditRows(rows=rows, cols=cols, strength=s, scalar=float(strength)))
        h = h.clone()
        h[rows, cols] = new.to(h.dtype)
        return h
    return apply


def per_row_column_applier(fn: RowApplier) -> Applier:
    """A row applier as an hf chunk hook with one strength per batch row (strengths as rows of one batch):
    ``strengths`` ``[B]`` (the current rows, following compaction) is gathered to one strength per position."""
    def apply(h: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, strengths: torch.Tensor) -> torch.Tensor:
        x = h[rows, cols]
        new = fn(x, EditRows(rows=rows, cols=cols, strength=strengths[rows]))
        h = h.clone()
        h[rows, cols] = new.to(h.dtype)
        return h
    return apply


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

    def prefix_limit(self) -> int:
        """How many leading tokens of every row no row edits: the most the decoder may prefill as one shared
        prefix (0 when the padding is unknown). A row edited only in generated tokens limits nothing."""
        return min(self.row_prefix_limits(), default=0)

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
    def from_layouts(cls, layouts: Sequence[RowLayout], positions: str, width: int) -> "PositionPlan":
        """``positions``: last_input | tool_span | from_tool_return. Rows without a tool output get no tool edits.

        ``width`` is the batch's column count; tokens after a row's prompt (a continuation appended for a
        teacher-forced forward) count as generated tokens.
        """
        B = len(layouts)
        mask = np.zeros((B, width), dtype=bool)
        gen = np.zeros(B, dtype=bool)
        for r, lay in enumerate(layouts):
            if positions == "last_input":
                mask[r, lay.columns(lay.select("last_input"))] = True
            elif positions == "tool_span":
                mask[r, lay.columns(lay.select("tool_span"))] = True
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
class HookState(_hooks.HookState):
    """The registrar's state (cache offset, remaining rows) plus the current plan, which follows the rows."""

    plan: PositionPlan | None = None
    #: columns the decoder prefills before any edited token (shared prefix; 0 = none): those passes edit nothing
    prefix: int = 0
    #: how far right of its column in the plain left-padded batch each edited column sits (grouped prefill)
    shift: int = 0

    def select_rows(self, rows: Sequence[int]) -> None:
        """Follow a batch that was reduced to ``rows`` of the current one (decoding with row compaction)."""
        self.plan = self.plan.subset(rows)
        super().select_rows(rows)


@contextmanager
def edit_hooks(model: nn.Module, appliers: Mapping[int, Applier], plan: PositionPlan) -> Iterator[HookState]:
    """Register the edit hooks of ``appliers`` (site -> function) for ``plan`` through the one registrar.

    Yields the :class:`HookState`; a decoder that drops finished rows calls its ``select_rows``. Nothing is
    registered when the plan selects no position at all (e.g. a ``tool_span`` edit on a batch without tool
    outputs).
    """
    state = HookState(plan=plan)
    if plan.empty or not appliers:
        yield state
        return
    n = n_sites(model)
    bad = [s for s in appliers if not 0 <= s < n]
    if bad:
        from steering.spec import EditSpecError

        raise EditSpecError(f"site(s) {bad} do not exist: this model has sites 0..{n - 1} (0 = embedding "
                            f"output, s = output of block s-1)", field="layers")

    def apply(site: int, hidden: torch.Tensor) -> torch.Tensor | None:
        B, S = hidden.shape[0], hidden.shape[1]
        current = state.plan
        if state.prefix and state.offset < state.prefix:
            if state.offset + S > state.prefix:
                raise RuntimeError(f"a forward of columns {state.offset}..{state.offset + S} crosses the end of the "
                                   f"{state.prefix} unedited prefix columns")
            return None                   # the shared prefix: no row edits these tokens (prefix_limit)
        if B != current.batch_size:
            raise RuntimeError(f"edit bound to a batch of {current.batch_size} rows got a forward of {B} rows")
        idx = current.chunk_index(state.offset - state.shift, S, hidden.device)
        if idx is None:
            return None
        if current.row_strength is not None:
            return appliers[site](hidden, *idx, strengths=current._device_state(hidden.device)["strength"])
        return appliers[site](hidden, *idx)

    with _hooks.site_hooks(model, sorted(appliers), apply, state=state):
        yield state


class PlanTokenHook:
    """An edit on a token-row backend (vllm): which flattened rows of a forward the plan touches, and the applier.

    A row ``(request r, position p)`` is edited when column ``n_pad[r] + p`` is a prompt column the plan selects,
    or lies past the prompt and ``r`` edits generated tokens -- the same rule :meth:`PositionPlan.chunk_index`
    applies to hf's padded columns, so both backends edit the same tokens. Rows of strength 0 are never touched
    (a sweep's baseline equals the untreated run). Implements ``memtoc.backends.vllm_rows.TokenHook``: it is
    pickled into every vLLM worker (every tensor rank edits), builds the edit's row appliers there on the
    worker's device and dtype, and counts the rows it edited per request and site; :meth:`absorb` refuses a pass
    where any rank edited fewer rows than planned (a compiled forward, a cached prefix: never a silent no-op).
    """

    reads_only = False

    def __init__(self, plan: PositionPlan, edit: Any, strengths: Sequence[float], n_pad: Sequence[int],
                 width: int) -> None:
        self.edit, self.width = edit, int(width)
        self.sites = tuple(int(s) for s in edit.layers)
        self.mask = torch.as_tensor(plan.prompt_mask, dtype=torch.bool)
        self.gen = torch.as_tensor(plan.generated_rows, dtype=torch.bool)
        self.n_pad = torch.as_tensor(list(n_pad), dtype=torch.long)
        self.strength = torch.as_tensor(list(strengths), dtype=torch.float64)
        self.active = self.strength != 0
        self.counts: dict[str, dict[int, torch.Tensor]] = {"prompt": {}, "gen": {}}
        self._appliers: dict[int, RowApplier] | None = None
        self._prompt = torch.zeros(0, dtype=torch.bool)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_appliers": None}

    def prepare(self, device: torch.device, dtype: torch.dtype) -> None:
        """Build the row appliers where the hook runs (a width mismatch is refused when the session opens)."""
        self._appliers = self.edit.row_appliers(self.width, device, dtype)

    def select(self, rows: Any) -> torch.Tensor | None:
        r = rows.request
        ours = r >= 0
        rr = r.clamp(min=0)
        col = self.n_pad[rr] + rows.position
        T = self.mask.shape[1]
        hit = torch.where(col < T, self.mask[rr, col.clamp(min=0, max=max(T - 1, 0))], self.gen[rr])
        idx = torch.nonzero(ours & hit & self.active[rr]).flatten()
        self._prompt = (col < T)[idx]
        return idx if idx.numel() else None

    def _count(self, site: int, r: torch.Tensor) -> None:
        n = int(self.strength.numel())
        for kind, sel in (("prompt", self._prompt), ("gen", ~self._prompt)):
            add = torch.bincount(r[sel], minlength=n)
            have = self.counts[kind].get(site)
            self.counts[kind][site] = add if have is None else have + add

    def apply(self, site: int, x: torch.Tensor, rows: Any, idx: torch.Tensor) -> torch.Tensor | None:
        if self._appliers is None:
            self._appliers = self.edit.row_appliers(self.width, x.device, x.dtype)
        fn = self._appliers.get(site)
        if fn is None:
            return None
        r = rows.request[idx]
        self._count(site, r)
        s = self.strength[r]
        scalar = float(s[0]) if bool((s == s[0]).all()) else None
        dev = x.device
        return fn(x, EditRows(rows=r.to(dev), cols=rows.position[idx].to(dev), strength=s.to(dev), scalar=scalar))

    def collect(self) -> dict[str, dict[int, torch.Tensor]]:
        return self.counts

    def planned(self, fed: Sequence[int]) -> dict[str, torch.Tensor]:
        """Rows each request must have edited at every site: its selected prompt columns, and the generated
        tokens fed back to the model (``fed[r]``) when it edits generated tokens; zero at strength 0."""
        T = self.mask.shape[1]
        cols = torch.arange(T)
        prompt = (self.mask & (cols[None, :] >= self.n_pad[:, None])).sum(dim=1)
        if len(fed) != int(self.strength.numel()):        # no engine pass ran inside the session
            fed = [0] * int(self.strength.numel())
        gen = torch.as_tensor(list(fed), dtype=torch.long).clamp(min=0) * self.gen
        return {"prompt": prompt * self.active, "gen": gen * self.active}

    def absorb(self, results: Sequence[tuple[dict, Any]], fed: Sequence[int]) -> None:
        """Raise unless every rank that owns a site edited at least the planned rows of every request there."""
        from memtoc.backends.base import InterventionUnsupportedError

        want = self.planned(fed)
        for site in self.sites:
            owners = [(info, got) for info, got in results if site in info.get("owned", ())]
            if not owners:
                raise InterventionUnsupportedError(f"no vllm worker owns site {site} of this edit")
            for info, got in owners:
                for kind in ("prompt", "gen"):
                    n = (got or {}).get(kind, {}).get(site)
                    have = torch.zeros_like(want[kind]) if n is None else n.to(torch.long)
                    short = torch.nonzero(have < want[kind]).flatten()
                    if short.numel():
                        r = int(short[0])
                        raise InterventionUnsupportedError(
                            f"the edit's hooks ran on {int(have[r])} of {int(want[kind][r])} planned {kind} rows of "
                            f"request row {r} at site {site} (vllm worker tp{info.get('tp_rank')}/"
                            f"pp{info.get('pp_rank')}; {short.numel()} requests short): the engine ran those tokens "
                            "without the hooks (a compiled forward, or a prefix served from its cache)")
