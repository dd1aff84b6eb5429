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
from memtoc.backends import hooks as _hooks
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
            if "capture" not in backend.capabilities:
                raise ActivationStoreError(f"the {backend.name!r} backend captures nothing here: capture needs its "
                                           "engine in this process with one worker")
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

    Rows may arrive over several forwards (chunked prefill) and a recomputed row (a preempted request) lands in
    the same slot again; :meth:`check` refuses a capture where any selected position never arrived (a prefix the
    engine took from its cache), so no row is silently dropped or duplicated.
    """

    def __init__(self, layouts: Sequence[RowLayout], selection: Selection, sites: Sequence[int], d_model: int,
                 dtype: torch.dtype) -> None:
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
        self.values = {int(s): torch.zeros((uniq.numel(), d_model), dtype=dtype) for s in sites}
        self.filled = {int(s): torch.zeros(uniq.numel(), dtype=torch.bool) for s in sites}
        self._slots = torch.zeros(0, dtype=torch.long)

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
        self.values[site][self._slots] = x.detach().to("cpu", self.values[site].dtype)
        self.filled[site][self._slots] = True
        return None

    def result(self) -> dict[int, torch.Tensor]:
        """``site -> [n_selected, d]`` in the selection's order, once every selected position arrived."""
        self.check()
        return {site: v[self.inverse] for site, v in self.values.items()}

    def check(self) -> None:
        for site, f in self.filled.items():
            if not bool(f.all()):
                raise ActivationStoreError(
                    f"vllm computed {int(f.sum())} of {f.numel()} selected tokens at site {site}; the others never "
                    "reached the hooks (a prefix served from the engine's cache?): capture needs prefix caching off")
