"""Forward hooks on the residual stream: the one hook layer that capture and steering edits share.

Sites use the ``output_hidden_states`` numbering: site 0 = the hidden state entering block 0 (the embedding
output), site ``s >= 1`` = the output of decoder block ``s - 1``. The last site is the raw block output
(``hidden_states[L]`` of transformers is the final-normed one; apply the model's final norm to compare).

Site 0 is read with a forward *pre*-hook on block 0 rather than a hook on the embedding module, so it is the
residual stream exactly as block 0 receives it on every architecture (models that scale or normalise the
embeddings inside the base model's forward included). Blocks are hooked with plain ``register_forward_hook``;
their output may be a tensor (transformers 5.x) or a tuple whose first element is the hidden state (older
versions); both are accepted. Hooks are always removed in ``finally``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import re

import numpy as np
import torch
from torch import nn

from activations.positions import PositionSelector, RowLayout, Selection, layout_backend_batch
from activations import ActivationStoreError


class LayerSpecError(ActivationStoreError):
    """A layer (site) selection that does not exist in the model."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The ``nn.ModuleList`` of decoder blocks of a causal LM (found generically)."""
    candidates: list[Any] = []
    get_decoder = getattr(model, "get_decoder", None)
    if callable(get_decoder):
        try:
            candidates.append(get_decoder())
        except (AttributeError, NotImplementedError, TypeError):
            pass
    for name in ("model", "transformer", "gpt_neox", "decoder"):
        candidates.append(getattr(model, name, None))
    candidates.append(model)
    for cand in candidates:
        if cand is None:
            continue
        for attr in ("layers", "h", "blocks"):
            mods = getattr(cand, attr, None)
            if isinstance(mods, nn.ModuleList) and len(mods) > 0:
                return mods
    raise LayerSpecError(f"cannot find the decoder blocks of {type(model).__name__} (no layers/h/blocks ModuleList)")


def n_sites(model: nn.Module) -> int:
    """Number of residual sites: the embedding output plus one per block."""
    return len(decoder_layers(model)) + 1


_LAYER_ITEM = re.compile(r"^(?:(?P<last>last)|(?P<lo>-?\d+)(?:-(?P<hi>-?\d+))?)$")


def parse_layers(spec: str | Sequence[int] | None, n_sites_: int) -> tuple[int, ...]:
    """``all`` | ``last`` | comma list of site indices and inclusive ranges ``a-b`` -> sorted unique sites.

    Sites are ``output_hidden_states`` indices: 0 = embedding output, ``s`` = output of block ``s - 1``,
    valid range 0..``n_sites_ - 1``.
    """
    last = n_sites_ - 1
    if spec is None or (isinstance(spec, str) and spec.strip() == "all"):
        return tuple(range(n_sites_))
    items = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    out: set[int] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        m = _LAYER_ITEM.match(item)
        if m is None:
            raise LayerSpecError(f"bad layer {item!r}: use all, last, N or N-M (site indices 0..{last})")
        if m.group("last"):
            lo = hi = last
        else:
            lo = int(m.group("lo"))
            hi = int(m.group("hi")) if m.group("hi") is not None else lo
        if lo > hi:
            raise LayerSpecError(f"bad layer range {item!r}: start after end")
        if lo < 0 or hi > last:
            raise LayerSpecError(f"unknown layer {item!r}: this model has sites 0..{last} (0 = embedding output, "
                                 f"s = output of block s-1; {last} blocks)")
        out.update(range(lo, hi + 1))
    if not out:
        raise LayerSpecError("empty layer selection")
    return tuple(sorted(out))


def _hidden_of(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    hs = getattr(output, "hidden_states", None) or getattr(output, "last_hidden_state", None)
    if isinstance(hs, torch.Tensor):
        return hs
    raise TypeError(f"cannot find the hidden state in a block output of type {type(output).__name__}")


def replace_hidden(output: Any, new: torch.Tensor) -> Any:
    """The block output with its hidden state replaced, in the container type the block returned."""
    if isinstance(output, torch.Tensor):
        return new
    if isinstance(output, tuple):
        return (new, *output[1:])
    if isinstance(output, list):
        return [new, *output[1:]]
    raise TypeError(f"cannot replace the hidden state in a block output of type {type(output).__name__}")


@contextmanager
def hook_sites(model: nn.Module, sites: Sequence[int],
               fn: Callable[[int, torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """Call ``fn(site, hidden)`` with the residual stream ``[batch, seq, d]`` of every site during forwards.

    A tensor ``fn`` returns replaces the hidden state (lenses use this); ``None`` leaves it as it was, so a
    reader simply returns nothing. Site 0 is a forward pre-hook on block 0 (what block 0 receives), site
    ``s >= 1`` a forward hook on block ``s - 1``. Hooks are removed on exit, also when the forward raises.
    """
    layers = decoder_layers(model)
    n = len(layers) + 1
    handles = []
    try:
        for site in sites:
            if not 0 <= site < n:
                raise LayerSpecError(f"unknown layer {site}: this model has sites 0..{n - 1}")
            if site == 0:
                def pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
                    new = fn(0, args[0] if args else kwargs["hidden_states"])
                    if new is None:
                        return None
                    if args:
                        return (new, *args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": new}
                handles.append(layers[0].register_forward_pre_hook(pre, with_kwargs=True))
            else:
                def post(module: nn.Module, args: tuple, output: Any, _s: int = site) -> Any:
                    new = fn(_s, _hidden_of(output))
                    return None if new is None else replace_hidden(output, new)
                handles.append(layers[site - 1].register_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()


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
        rows = torch.as_tensor(self.selection.row, dtype=torch.long)
        cols = torch.as_tensor(self.selection.column, dtype=torch.long)
        with capture_sites(backend.model, self.sites, rows, cols, to_host=self.to_host) as values:
            self.values = values
            yield self
        missing = [s for s in self.sites if s not in self.values]
        if missing:
            raise ActivationStoreError(f"capture hooks did not fire for sites {missing}; was a forward run?")

    def as_numpy(self, site: int) -> np.ndarray:
        return self.values[site].float().numpy()
