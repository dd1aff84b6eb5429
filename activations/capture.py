"""Residual capture: the ``ResidualCapture`` option of ``Backend.forward`` and its site-gathering helper.

Sites and hooks are the core's (``memtoc.backends.parts`` numbers and parses sites, ``memtoc.backends.hooks`` is
the one registrar): site 0 = the hidden state entering block 0 (the embedding output), site ``s >= 1`` = the
output of decoder block ``s - 1``. The last site is the raw block output (``hidden_states[L]`` of transformers is
the final-normed one; apply the model's final norm to compare). Hooks are always removed in ``finally``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from activations import ActivationStoreError
from activations.positions import PositionSelector, RowLayout, Selection, layout_backend_batch
from memtoc.backends import device_ops, hooks as _hooks
from memtoc.backends.base import TokenRowBackend
from memtoc.backends.hooks import hidden_of as _hidden_of, replace_hidden  # noqa: F401  (old import names)
from memtoc.backends.parts import SiteSpecError, decoder_layers, n_sites, parse_sites  # noqa: F401


class LayerSpecError(ActivationStoreError, SiteSpecError):
    """A layer (site) selection that does not exist in the model."""


def parse_layers(spec: str | Sequence[int] | None, n_sites_: int) -> tuple[int, ...]:
    """``all`` | ``last`` | comma list of site indices and inclusive ranges ``a-b`` -> sorted unique sites.

    The core parser (``memtoc.backends.parts.parse_sites``) with this package's default: None = every site.
    """
    return parse_sites(spec, n_sites_, default=None, error=LayerSpecError)


@contextmanager
def hook_sites(model: nn.Module, sites: Sequence[int],
               fn: Callable[[int, torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """``fn(site, hidden)`` at every site during forwards, through the core registrar
    (``memtoc.backends.hooks.site_hooks``); an unknown site raises :class:`LayerSpecError`."""
    with _hooks.site_hooks(model, sites, fn, error=LayerSpecError):
        yield


@contextmanager
def capture_sites(model: nn.Module, sites: Sequence[int], rows: torch.Tensor, columns: torch.Tensor, *,
                  to_host: bool = True) -> Iterator[dict[int, torch.Tensor]]:
    """Gather ``hidden[rows, columns]`` (``[n, d]``) at each site; moved to host memory as soon as computed.

    Yields the dict that the hooks fill (site -> tensor); only the selected positions are kept, so peak
    memory is bounded by the selection, never by the full ``[batch, seq, d]`` activations of every layer.
    """
    out: dict[int, torch.Tensor] = {}
    dev_cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def fn(site: int, hidden: torch.Tensor) -> None:
        idx = dev_cache.get(hidden.device)
        if idx is None:
            idx = dev_cache[hidden.device] = (rows.to(hidden.device), columns.to(hidden.device))
        sel = hidden.detach()[idx[0], idx[1]]
        out[site] = sel.to("cpu") if to_host else sel

    with hook_sites(model, sites, fn):
        yield out


class ResidualCapture:
    """Capture option of ``Backend.forward``: residual stream at ``sites`` and ``positions`` of one batch.

    Built per call with the batch's user prompts and their tool-output spans (character spans within the
    user prompts, ``Episode.tool_output_span``; None for rows without a tool output). After the forward,
    ``selection`` says which (row, token) each captured row is and ``values[site]`` holds ``[n, d]`` tensors
    on the host, in the model's dtype.
    """

    def __init__(self, sites: Sequence[int], positions: PositionSelector | str | Sequence[str], *,
                 prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None = None,
                 to_host: bool = True) -> None:
        self.sites = tuple(int(s) for s in sites)
        if not self.sites:
            raise LayerSpecError("empty layer selection")
        self.positions = positions if isinstance(positions, PositionSelector) else PositionSelector.parse(positions)
        self.prompts = list(prompts)
        self.tool_spans = None if tool_spans is None else list(tool_spans)
        self.to_host = to_host
        self.layouts: list[RowLayout] = []
        self.selection: Selection | None = None
        self.values: dict[int, torch.Tensor] = {}

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["ResidualCapture"]:
        self.layouts = layout_backend_batch(backend, self.prompts, batch, self.tool_spans)
        self.selection = self.positions.select(self.layouts)
        if isinstance(backend, TokenRowBackend):       # vllm: the same selection, read from flattened token rows
            info = backend.site_info
            hook = TokenCapture(self.layouts, self.selection, self.sites, info.d_model, getattr(torch, info.dtype))
            with backend.token_hooks(self.sites, hook):
                yield self
            self.values = hook.result()
            return
        rows = torch.as_tensor(self.selection.row, dtype=torch.long)
        cols = torch.as_tensor(self.selection.column, dtype=torch.long)
        with capture_sites(backend.parts.model, self.sites, rows, cols, to_host=self.to_host) as values:
            self.values = values
            yield self
        missing = [s for s in self.sites if s not in self.values]
        if missing:
            raise ActivationStoreError(f"capture hooks did not fire for sites {missing}; was a forward run?")

    def as_numpy(self, site: int) -> np.ndarray:
        return self.values[site].float().numpy()


class TokenCapture:
    """Capture on a token-row backend (vllm; ``memtoc.backends.vllm_rows.TokenHook``): every flattened row of a
    forward whose (request row, token index) is in the selection is copied into its slot of ``values[site]``.

    It runs inside vLLM's worker (tensor rank 0; each pipeline stage fills the sites it owns): on a GPU the rows
    go into a pinned host buffer per site with a non-blocking copy, scattered into ``values`` after the next
    forward's one device sync (:meth:`flush`); ``stage=True`` takes that path on the CPU too (tests), ``False``
    never stages, None (default) stages where the rows are on an accelerator. Rows may arrive over several
    forwards (chunked prefill) and a recomputed row (a preempted request) lands in the same slot again;
    :meth:`check` refuses a capture where any selected position never arrived, so no row is silently dropped or
    duplicated.
    """

    reads_only = True

    def __init__(self, layouts: Sequence[RowLayout], selection: Selection, sites: Sequence[int], d_model: int,
                 dtype: torch.dtype, *, stage: bool | None = None) -> None:
        n_tok = torch.as_tensor([lay.n_tokens for lay in layouts], dtype=torch.long)
        self.n_tok = n_tok
        self.base = torch.cumsum(n_tok, 0) - n_tok
        total = int(n_tok.sum())
        self.slot = torch.full((max(total, 1),), -1, dtype=torch.long)
        # A token selected by several kinds (last_input is also in all) is read once, then copied per entry.
        flat = self.base[torch.as_tensor(selection.row, dtype=torch.long)] + torch.as_tensor(
            selection.token_index, dtype=torch.long)
        uniq, self.inverse = torch.unique(flat, return_inverse=True)
        self.slot[uniq] = torch.arange(uniq.numel())
        self.sites = tuple(int(s) for s in sites)
        self.n_slots, self.d_model, self.dtype = int(uniq.numel()), int(d_model), dtype
        self.values: dict[int, torch.Tensor] = {}
        self.filled: dict[int, torch.Tensor] = {}
        self._slots = torch.zeros(0, dtype=torch.long)
        self.staged: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self._pinned: dict[int, torch.Tensor] = {}
        self._copied: Any = None              # event recorded after the last staged copies
        self.stage = stage                    # None: stage where the rows are on an accelerator

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(values={}, filled={}, staged=[], _pinned={}, _copied=None)   # made where the hook runs
        return state

    def _buffers(self, site: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The host buffers of ``site``, always normal tensors: vLLM runs forwards under ``torch.inference_mode()``
        and the rows are scattered later by an RPC outside it, where an inference tensor cannot be written."""
        if site not in self.values:
            with torch.inference_mode(False):
                self.values[site] = torch.zeros((self.n_slots, self.d_model), dtype=self.dtype)
                self.filled[site] = torch.zeros(self.n_slots, dtype=torch.bool)
        return self.values[site], self.filled[site]

    def prepare(self, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate every site's buffers where the hook runs, when the session opens (outside any forward)."""
        for site in self.sites:
            self._buffers(site)

    def select(self, rows: Any) -> torch.Tensor | None:
        r = rows.request
        rr = r.clamp(min=0)
        ok = (r >= 0) & (rows.position >= 0) & (rows.position < self.n_tok[rr])
        flat = (self.base[rr] + rows.position).clamp(min=0, max=self.slot.numel() - 1)
        sl = torch.where(ok, self.slot[flat], torch.full_like(flat, -1))
        idx = torch.nonzero(sl >= 0).flatten()
        self._slots = sl[idx]
        return idx if idx.numel() else None

    def apply(self, site: int, x: torch.Tensor, rows: Any, idx: torch.Tensor) -> None:
        values, filled = self._buffers(site)
        stage = device_ops.is_accelerator(x.device) if self.stage is None else self.stage
        if not stage:
            values[self._slots] = x.detach().to(values.dtype)
            filled[self._slots] = True
            return None
        k = int(x.shape[0])
        buf = self._pinned.get(site)
        if buf is None or buf.shape[0] < k or buf.dtype != x.dtype:
            n = max(k, 2 * (0 if buf is None else buf.shape[0]))
            with torch.inference_mode(False):
                buf = self._pinned[site] = device_ops.host_buffer((n, x.shape[1]), x.dtype, x.device)
        buf[:k].copy_(x.detach(), non_blocking=True)
        self.staged.append((site, self._slots, buf[:k]))
        self._copied = device_ops.copy_event(x.device)    # after this forward's copies, on the stream that made them
        return None

    def flush(self) -> None:
        """Scatter the rows staged by the previous forward, after waiting for its copies (one sync per forward)."""
        staged, self.staged = self.staged, []        # dropped even when the scatter raises: never scattered twice
        if staged and getattr(self, "_copied", None) is not None:
            self._copied.synchronize()
            self._copied = None
        for site, slots, rows in staged:
            values, filled = self._buffers(site)
            values[slots] = rows.to(values.dtype)
            filled[slots] = True

    def collect(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        self.flush()
        return {s: (self.values[s], self.filled[s]) for s in self.values if bool(self.filled[s].any())}

    def absorb(self, results: Sequence[tuple[dict, Any]], fed: Sequence[int]) -> None:
        """Merge the sites every rank filled (pipeline stages own disjoint sites)."""
        for _, got in results:
            for site, (v, f) in (got or {}).items():
                values, filled = self._buffers(int(site))
                values[f] = v[f].to(values.dtype)
                filled |= f
        for s in self.sites:
            self._buffers(s)
        self.check()

    def result(self) -> dict[int, torch.Tensor]:
        """``site -> [n_selected, d]`` in the selection's order, once every selected position arrived."""
        self.check()
        return {site: self.values[site][self.inverse] for site in self.sites}

    def check(self) -> None:
        for site in self.sites:
            f = self._buffers(site)[1]
            if not bool(f.all()):
                raise ActivationStoreError(
                    f"vllm computed {int(f.sum())} of {f.numel()} selected tokens at site {site}; the others never "
                    "reached the hooks (a compiled forward, or a prefix served from the engine's cache?)")
