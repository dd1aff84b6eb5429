"""The one hook registrar: capture, edits and lenses all install their PyTorch hooks through this module.

- :func:`register` is the only function of the toolkit that calls ``register_forward_hook`` /
  ``register_forward_pre_hook``; every handle it makes is removed on exit, also when the forward raises.
- :func:`site_hooks` hooks residual sites: ``fn(site, hidden)`` sees the stream ``[batch, seq, d]``; a tensor it
  returns replaces the hidden state. Site 0 is a forward *pre*-hook on block 0 (what block 0 receives on every
  architecture), site ``s >= 1`` a forward hook on block ``s - 1`` (a replacement goes back in the container
  type the block returned).
- Hooks that must know which columns and rows a cached forward covers (edits) pass a :class:`HookState`: the
  registrar records before every forward how many tokens the cache holds (``state.offset``), and a decoder
  that compacts the batch calls ``state.select_rows(keep)``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from memtoc.backends.parts import SiteSpecError, decoder_layers, hook_point

#: ``fn(site, hidden [B, S, d]) -> new hidden | None``
SiteFn = Callable[[int, torch.Tensor], "torch.Tensor | None"]
#: ``fn(name, value [B, S, d]) -> new value | None`` (``name``: a TransformerLens hook name)
NamedFn = Callable[[str, torch.Tensor], "torch.Tensor | None"]

#: Hook kinds :func:`register` knows: a forward hook, a forward pre-hook, a pre-hook that also gets kwargs.
HOOK_KINDS = ("forward", "pre", "pre_kwargs")


@dataclass(frozen=True)
class Hook:
    """One hook to install: ``module``, its kind (:data:`HOOK_KINDS`) and the function."""

    module: nn.Module
    kind: str
    fn: Callable[..., Any]


@contextmanager
def register(hooks: Sequence[Hook]) -> Iterator[None]:
    """Install ``hooks`` in order for the duration; every handle is removed in ``finally``."""
    handles = []
    try:
        for h in hooks:
            if h.kind == "forward":
                handles.append(h.module.register_forward_hook(h.fn))
            elif h.kind == "pre":
                handles.append(h.module.register_forward_pre_hook(h.fn))
            elif h.kind == "pre_kwargs":
                handles.append(h.module.register_forward_pre_hook(h.fn, with_kwargs=True))
            else:
                raise ValueError(f"unknown hook kind {h.kind!r}; choose from {', '.join(HOOK_KINDS)}")
        yield
    finally:
        for handle in handles:
            handle.remove()


# -- block outputs ---------------------------------------------------------------------------------------------

def hidden_of(output: Any) -> torch.Tensor:
    """The hidden state in a block output: a tensor (transformers 5) or the first element of a tuple/list."""
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


def _with_first_input(args: tuple, kwargs: dict, new: torch.Tensor) -> tuple[tuple, dict]:
    """A ``pre_kwargs`` hook's result replacing the module's first input (positional or ``hidden_states``)."""
    return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})


# -- forward state (KV-cache offset, row compaction) ---------------------------------------------------------------

def cache_length(args: tuple, kwargs: Mapping[str, Any]) -> int:
    """Tokens already in the KV cache when this forward starts (0 on the prompt pass and without a cache)."""
    for key in ("cache", "past_key_values", "past_key_value"):
        cache = kwargs.get(key)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    return 0


@dataclass
class HookState:
    """What site hooks read on every forward: the cache offset of the forward in progress and the rows of the
    originally bound batch that are still in the batch (None: all of them, in order)."""

    offset: int = 0
    rows: tuple[int, ...] | None = None

    def select_rows(self, keep: Sequence[int]) -> None:
        """The batch was reduced to ``keep`` (indices into the current batch), e.g. finished rows dropped."""
        keep = tuple(int(k) for k in keep)
        self.rows = keep if self.rows is None else tuple(self.rows[k] for k in keep)


# -- residual sites ---------------------------------------------------------------------------------------------

@contextmanager
def site_hooks(model: nn.Module, sites: Sequence[int], fn: SiteFn, *, state: HookState | None = None,
               error: type[Exception] = SiteSpecError) -> Iterator[HookState | None]:
    """Call ``fn(site, hidden)`` at every site in ``sites`` during forwards of ``model`` (module docstring).

    With ``state``, a block-0 pre-hook registered before the site hooks sets ``state.offset`` at the start of
    every forward. An unknown site raises ``error`` before anything is registered. Yields ``state``.
    """
    layers = decoder_layers(model)
    n = len(layers) + 1
    wanted = list(dict.fromkeys(int(s) for s in sites))
    bad = [s for s in wanted if not 0 <= s < n]
    if bad:
        raise error(f"unknown layer {bad[0]}: this model has sites 0..{n - 1} (0 = embedding output, "
                    "s = output of block s-1)")
    hooks: list[Hook] = []
    if state is not None:
        def track(module: nn.Module, args: tuple, kwargs: dict) -> None:
            state.offset = cache_length(args, kwargs)
        hooks.append(Hook(layers[0], "pre_kwargs", track))
    for site in wanted:
        if site == 0:
            def pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
                new = fn(0, args[0] if args else kwargs["hidden_states"])
                return None if new is None else _with_first_input(args, kwargs, new)
            hooks.append(Hook(layers[0], "pre_kwargs", pre))
        else:
            def post(module: nn.Module, args: tuple, output: Any, _s: int = site) -> Any:
                new = fn(_s, hidden_of(output))
                return None if new is None else replace_hidden(output, new)
            hooks.append(Hook(layers[site - 1], "forward", post))
    with register(hooks):
        yield state


# -- named hook points (TransformerLens names: resid, attention and MLP outputs) ------------------------------------

@contextmanager
def named_hooks(model: nn.Module, names: Sequence[str], fn: NamedFn) -> Iterator[None]:
    """Call ``fn(name, value)`` at every named hook point (``memtoc.backends.parts.hook_point``) during forwards.

    As in :func:`site_hooks`, a returned tensor replaces the value; every name is resolved before anything is
    registered. ``hook_z`` is seen as ``[B, S, H, d_head]``; ``hook_pattern`` (read only) switches the model to
    eager attention while hooked, since fused kernels never form the matrix.
    """
    points = [hook_point(model, n) for n in dict.fromkeys(names)]
    hooks: list[Hook] = []
    for p in points:
        if p.kind == "pre":
            def pre(module: nn.Module, args: tuple, kwargs: dict, _p: Any = p) -> Any:
                value = args[0] if args else kwargs["hidden_states"]
                shape = value.shape
                view = value.view(*shape[:-1], _p.heads, shape[-1] // _p.heads) if _p.heads else value
                new = fn(_p.name, view)
                return None if new is None else _with_first_input(args, kwargs, new.reshape(shape) if _p.heads else new)
            hooks.append(Hook(p.module, "pre_kwargs", pre))
        elif p.read == "weights":
            def weights(module: nn.Module, args: tuple, output: Any, _n: str = p.name) -> Any:
                w = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
                if w is None:
                    raise SiteSpecError(f"{_n}: the attention module returned no weights (eager attention is "
                                        "needed to read the pattern)")
                if fn(_n, w) is not None:
                    raise SiteSpecError(f"{_n} is read only: an attention pattern cannot be replaced after the "
                                        "fact; edit hook_z or the residual stream instead")
                return None
            hooks.append(Hook(p.module, "forward", weights))
        else:
            def post(module: nn.Module, args: tuple, output: Any, _n: str = p.name) -> Any:
                new = fn(_n, hidden_of(output))
                return None if new is None else replace_hidden(output, new)
            hooks.append(Hook(p.module, "forward", post))
    with eager_attention(model, any(p.read == "weights" for p in points)), register(hooks):
        yield


@contextmanager
def eager_attention(model: nn.Module, on: bool = True) -> Iterator[None]:
    """Eager attention for the duration (the attention weights exist only there); the previous kernel after."""
    config = getattr(model, "config", None)
    before = getattr(config, "_attn_implementation", None)
    if not on or before in (None, "eager") or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(before)
