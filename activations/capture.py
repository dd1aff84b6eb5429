"""Residual capture: the ``ResidualCapture`` option of ``Backend.forward``.

It says *what* is read (sites and positions of one batch, as a ``memtoc.backends.plans.CapturePlan``); the backend
says *how* (``backend.intervene``). Sites are ``memtoc.backends.parts``'s: the last one is the raw block output
(transformers' ``hidden_states[L]`` is final-normed).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import torch

from activations import ActivationStoreError
from activations.positions import PositionSelector, RowLayout, Selection, layout_backend_batch
from memtoc.backends.parts import SiteSpecError, parse_sites
from memtoc.backends.plans import CapturePlan


class LayerSpecError(ActivationStoreError, SiteSpecError):
    """A layer (site) selection that does not exist in the model."""


def parse_layers(spec: str | Sequence[int] | None, n_sites_: int) -> tuple[int, ...]:
    """``memtoc.backends.parts.parse_sites`` with this package's default: None = every site."""
    return parse_sites(spec, n_sites_, default=None, error=LayerSpecError)


class ResidualCapture:
    """Capture option of ``Backend.forward``: residual stream at ``sites`` and ``positions`` of one batch.

    Built per call with the batch's user prompts and their tool-output spans (within the user prompts; None for
    rows without a tool output). After the forward, ``selection`` says which (row, token) each captured row is
    and ``values[site]`` holds ``[n, d]`` host tensors in the model's dtype.
    """

    def __init__(self, sites: Sequence[int], positions: PositionSelector | str | Sequence[str], *,
                 prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None = None) -> None:
        self.sites = tuple(int(s) for s in sites)
        if not self.sites:
            raise LayerSpecError("empty layer selection")
        self.positions = positions if isinstance(positions, PositionSelector) else PositionSelector.parse(positions)
        self.prompts = list(prompts)
        self.tool_spans = None if tool_spans is None else list(tool_spans)
        self.layouts: list[RowLayout] = []
        self.selection: Selection | None = None
        self.values: dict[int, torch.Tensor] = {}

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["ResidualCapture"]:
        self.layouts = layout_backend_batch(backend, self.prompts, batch, self.tool_spans)
        self.selection = sel = self.positions.select(self.layouts)
        backend.site_info.check_sites(self.sites, LayerSpecError)
        plan = CapturePlan(self.sites, sel.row, sel.column, sel.token_index, [lay.n_tokens for lay in self.layouts])
        with backend.intervene(batch, plan):
            self.values = plan.values
            yield self
        self.values = plan.values
        missing = [s for s in self.sites if s not in self.values]
        if missing:
            raise ActivationStoreError(f"capture hooks did not fire for sites {missing}; was a forward run?")
