"""How the hf backend (a module tree) runs plans (``memtoc.backends.plans``) through the one registrar.

The registrar records each forward's KV-cache offset (``HookState.offset``), so position ``offset + i`` of a chunk
is an absolute column: a prompt column (``< T``) is edited when the row's ``PositionPlan`` selects it, a generated
one only for rows that edit generated tokens; cached, cache-free and teacher-forced forwards edit the same tokens.
The shared-prefix decoder (``memtoc.backends.decode``) prefills unedited tokens (``EditPlan.row_prefix_limits``) as
one pass (``HookState.prefix``, skipped; ``shift``), and follows dropped rows (``HookState.select_rows``).
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch
from torch import nn

from memtoc.backends import hooks as _hooks
from memtoc.backends.base import InterventionUnsupportedError
from memtoc.backends.device_ops import math_dtype
from memtoc.backends.parts import ModelParts, SiteSpecError, base_model as _base_model, residual_width
from memtoc.backends.plans import Applier, CapturePlan, EditPlan, EditRows, HookPlan, PositionPlan, RowApplier


def column_applier(fn: RowApplier, strength: float | None = None) -> Applier:
    """A row applier as an hf chunk hook (gather ``hidden[rows, cols]``, apply, write back into a copy): at one
    ``strength`` for the batch, or (None) at the ``strengths`` ``[B]`` of the current rows (strengths as rows)."""
    def apply(h: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
              strengths: torch.Tensor | None = None) -> torch.Tensor:
        if strengths is None:
            s = torch.full((rows.numel(),), float(strength), dtype=torch.float64, device=rows.device)
            where = EditRows(rows=rows, cols=cols, strength=s, scalar=float(strength))
        else:
            where = EditRows(rows=rows, cols=cols, strength=strengths[rows])
        new = fn(h[rows, cols], where)
        h = h.clone()
        h[rows, cols] = new.to(h.dtype)
        return h
    return apply


@dataclass
class HookState(_hooks.HookState):
    """The registrar's state (cache offset, remaining rows) plus the current plan, which follows the rows."""

    plan: PositionPlan | None = None
    #: columns the decoder prefills before any edited token (shared prefix; 0 = none): those passes edit nothing
    prefix: int = 0
    #: how far right of its column in the plain left-padded batch each edited column sits (grouped prefill)
    shift: int = 0

    def use_prefix(self, n: int, shift: int = 0) -> None:
        """The decoder prefills ``n`` unedited columns first; edited columns sit ``shift`` right of their place."""
        self.prefix, self.shift = int(n), int(shift)

    def select_rows(self, rows: Sequence[int]) -> None:
        """Follow a batch that was reduced to ``rows`` of the current one (decoding with row compaction)."""
        self.plan = self.plan.subset(rows)
        super().select_rows(rows)


@contextmanager
def edit_hooks(model: nn.Module, appliers: Mapping[int, Applier], plan: PositionPlan) -> Iterator[HookState]:
    """Register the edit hooks of ``appliers`` (site -> function) for ``plan``; yields the :class:`HookState`.
    Nothing is registered when the plan selects no position (a ``tool_span`` edit on a batch without tool output)."""
    state = HookState(plan=plan)
    if plan.empty or not appliers:
        yield state
        return

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


def edit_appliers(model: nn.Module, plan: EditPlan) -> tuple[dict[int, Applier], PositionPlan]:
    """The hooks' appliers and positions: per-row strengths through ``row_appliers``, one through ``appliers``."""
    edit, positions, st = plan.edit, plan.positions, plan.strengths
    if st is not None and len(set(st)) > 1:                          # strengths as rows of this batch
        if not edit.has_row_appliers:
            raise InterventionUnsupportedError(
                f"a {edit.kind!r} edit has no row appliers, so it runs one strength per batch")
        positions = positions.with_strengths(st)
        if positions.empty:
            return {}, positions
        return {s: column_applier(fn)
                for s, fn in edit.row_appliers(model_width(model), *model_device_dtype(model)).items()}, positions
    if st and st[0] != edit.strength:
        edit = edit.with_strength(st[0])
    return ({} if positions.empty else edit.appliers(model)), positions


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The first parameter's device, and its dtype where math runs in it (float32 for float8 storage)."""
    p = next(model.parameters())
    return p.device, math_dtype(p.dtype)


def model_width(model: nn.Module) -> int | None:
    """The residual width, or None for a module with no decoder stack (a kind that needs the width refuses it)."""
    try:
        return residual_width(model)
    except SiteSpecError:
        return None


@contextmanager
def capture_sites(model: nn.Module, sites: Sequence[int], rows: torch.Tensor, columns: torch.Tensor, *,
                  to_host: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Gather ``hidden[rows, columns]`` (``[n, d]``) at each site, moved to host memory as soon as computed, so peak
    memory is bounded by the selection; yields the dict the hooks fill (site -> tensor)."""
    out: dict[int, torch.Tensor] = {}
    dev_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def fn(site: int, hidden: torch.Tensor) -> None:
        idx = dev_cache.get(hidden.device)
        if idx is None:
            idx = dev_cache[hidden.device] = (rows.to(hidden.device), columns.to(hidden.device))
        sel = hidden.detach()[idx[0], idx[1]]
        out[site] = sel.to("cpu") if to_host else sel

    with _hooks.site_hooks(model, sites, fn):
        yield out


@contextmanager
def intervene(model: nn.Module, batch: Mapping[str, torch.Tensor], plan: Any) -> Iterator[HookState | None]:
    """``plan`` on ``model`` for the forwards inside; an edit yields its :class:`HookState` (prefix, compaction)."""
    if isinstance(plan, EditPlan):
        appliers, positions = edit_appliers(model, plan)
        with edit_hooks(model, appliers, positions) as state:
            yield state
        return
    if isinstance(plan, HookPlan):
        with ExitStack() as stack:
            if plan.sites:
                stack.enter_context(_hooks.site_hooks(model, sorted(set(plan.sites)), plan.fn))
            if plan.names:
                stack.enter_context(_hooks.named_hooks(model, plan.names, plan.fn))
            yield None
        return
    if not isinstance(plan, CapturePlan):
        raise TypeError(f"not an intervention plan: {type(plan).__name__}")
    rows = torch.as_tensor(plan.rows, dtype=torch.long)
    cols = torch.as_tensor(plan.columns, dtype=torch.long)
    with ExitStack() as stack:
        plan.values = stack.enter_context(capture_sites(model, plan.sites, rows, cols, to_host=plan.to_host))
        if plan.eager:
            stack.enter_context(_hooks.eager_attention(model, True))
        if plan.hooks:
            stack.enter_context(_hooks.register(plan.hooks))
        yield None


class TreeParts(ModelParts):
    """Parts of a model whose module tree is at hand, which also run plans on its forwards and gradients through it."""

    def forward(self, *, decoder_only: bool = False, **inputs: Any) -> Any:
        """The model's forward on ``inputs`` (no KV cache, no inference mode); ``decoder_only``: without the head."""
        return (_base_model(self.model) if decoder_only else self.model)(**inputs, use_cache=False)

    @property
    def cache_kw(self) -> str | None:
        """The KV-cache keyword of the model's forward (transformers >= 5.2x: ``cache``, before: ``past_key_values``);
        None where the forward takes none (a TransformerLens model)."""
        try:
            params = inspect.signature(self.model.forward).parameters
        except (TypeError, ValueError):
            return None
        return next((kw for kw in ("cache", "past_key_values") if kw in params), None)

    def forward_cached(self, past: Any = None, **inputs: Any) -> tuple[Any, Any]:
        """The model's forward with a KV cache (``past``: the cache of the columns before ``inputs``'; None: none);
        returns the output and the cache after it. Only where :attr:`cache_kw` is not None."""
        kw = self.cache_kw
        if kw is None:
            raise InterventionUnsupportedError(f"{self.architecture}'s forward takes no KV cache")
        out = self.model(**inputs, use_cache=True, **{kw: past})
        cache = getattr(out, "cache", None)
        return out, cache if cache is not None else getattr(out, "past_key_values", None)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of token ids ``[B, S]``."""
        return self.model.get_input_embeddings()(ids)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """``requires_grad_(False)`` on every weight for the duration (gradients reach activations, never weights)."""
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        try:
            for p, _ in flags:
                p.requires_grad_(False)
            yield
        finally:
            for p, f in flags:
                p.requires_grad_(f)

    def eager(self) -> Any:
        """Eager attention for the duration (attention probabilities, forward-mode AD); the previous kernel after."""
        return _hooks.eager_attention(self.model)

    def intervene(self, batch: Any, plan: Any) -> Any:
        """A plan on this model's own forwards (what ``HFBackend.intervene`` runs; a bare model needs no backend)."""
        return intervene(self.model, batch, plan)
