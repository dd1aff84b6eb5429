"""Token rows inside vLLM: which request and position every row of a forward is, and the site hooks that use it.

vLLM runs all scheduled requests as one flattened ``[n_tokens, d]`` tensor: a prefill of prompts of 5 and 7
tokens is 12 rows, a decoding step is one row per running request, and with chunked prefill a long prompt may
arrive over several steps beside other requests' decoding rows. The engine's own batch metadata says which rows
are whose: in the forward context, ``attn_metadata`` (a dict keyed by layer name) carries ``query_start_loc``
(row offsets per request of this step) and ``seq_lens`` (tokens in context after it), in the order of the model
runner's input batch (``input_batch.req_ids``; the runner may reorder requests, so the order of submission is
never assumed). Row ``j`` of request ``r`` is then the token at absolute position
``seq_lens[r] - (qsl[r + 1] - qsl[r]) + (j - qsl[r])``. :func:`token_rows` computes that once per forward.

The residual stream of vLLM's Llama-family blocks: a decoder layer returns ``(hidden_states, residual)`` and the
residual add is deferred into the next layer's fused add-norm, so the stream after block ``i`` is
``hidden_states + residual`` (:data:`RESIDUAL_CONVENTIONS`). Site 0 is what block 0 receives (its
``hidden_states`` argument, the embedding output). A replacement at site ``s >= 1`` writes the new stream into
``residual`` and zero into ``hidden_states`` for the touched rows, so the next block's add gives the new stream
exactly (no ``new - residual`` round-off); untouched rows keep both tensors as they were.

Hooks are installed through the one registrar (``memtoc.backends.hooks.register``). They only work where the
model lives in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker: tensor and pipeline parallel 1)
and runs eagerly (``enforce_eager=True``: a compiled or CUDA-graph-captured forward would not call Python hooks).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import torch
from torch import nn

from memtoc.backends.hooks import Hook, register
from memtoc.backends.parts import SiteSpecError
from memtoc.core.errors import MemtocError

#: ``config.model_type`` -> how the residual stream is read from a vLLM decoder layer's output.
RESIDUAL_CONVENTIONS: dict[str, str] = {t: "hidden+residual" for t in
                                        ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")}


@dataclass(frozen=True)
class TokenRows:
    """Every row of one flattened forward: its request row in the bound call (-1: not ours, or padding) and its
    absolute token position within that request's sequence."""

    request: torch.Tensor      # [n] long
    position: torch.Tensor     # [n] long

    @property
    def n(self) -> int:
        return int(self.request.shape[0])


class TokenHook(Protocol):
    """What capture and edits give :meth:`TokenRowBackend.token_hooks`.

    ``select(rows)`` is asked once per forward: the flattened row indices this intervention touches (None: none);
    ``apply(site, x, rows, idx)`` gets the stream ``x`` ``[k, d]`` of those rows at ``site`` and returns the new
    stream of those rows (edits) or None (readers).
    """

    def select(self, rows: TokenRows) -> torch.Tensor | None: ...

    def apply(self, site: int, x: torch.Tensor, rows: TokenRows, idx: torch.Tensor) -> torch.Tensor | None: ...


def _metadata(attn_metadata: Any) -> Any:
    """One layer's metadata (all layers of a KV-cache group share the request layout) from vLLM's forward context."""
    md = attn_metadata
    if isinstance(md, (list, tuple)):          # micro-batched forwards: not used with the settings of this backend
        if len(md) != 1:
            raise MemtocError("capture/edits inside vllm need one micro-batch per forward (no DBO / ubatching)")
        md = md[0]
    if isinstance(md, Mapping):
        for v in md.values():
            if hasattr(v, "query_start_loc") and hasattr(v, "seq_lens"):
                return v
        raise MemtocError("vllm attention metadata has no query_start_loc / seq_lens")
    return md


def token_rows(n_tokens: int, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
               request_rows: Sequence[int]) -> TokenRows:
    """Request row and absolute position of each of ``n_tokens`` flattened rows (rows past the last request's
    tokens are padding: request -1). ``request_rows[r]`` is the bound row of the runner's ``r``-th request."""
    qsl = query_start_loc.to("cpu", torch.long)
    seq = seq_lens.to("cpu", torch.long)
    n_req = len(request_rows)
    counts = qsl[1:n_req + 1] - qsl[:n_req]
    start = seq[:n_req] - counts                               # first position computed in this step
    req = torch.full((n_tokens,), -1, dtype=torch.long)
    pos = torch.zeros(n_tokens, dtype=torch.long)
    if n_req:
        owner = torch.repeat_interleave(torch.arange(n_req), counts)
        local = torch.arange(owner.numel()) - qsl[:n_req][owner]
        k = min(owner.numel(), n_tokens)
        rows = torch.as_tensor(list(request_rows), dtype=torch.long)
        req[:k] = rows[owner[:k]]
        pos[:k] = (start[owner] + local)[:k]
    return TokenRows(request=req, position=pos)


@dataclass
class ForwardState:
    """Set by the stack's pre-hook at every forward: the rows, and each hook's selection for them."""

    rows: TokenRows | None = None
    selected: dict[int, torch.Tensor | None] = field(default_factory=dict)


def _stream_of(output: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], torch.Tensor):
        return output[0], output[1]
    if isinstance(output, torch.Tensor):
        return output, None
    raise TypeError(f"unexpected vllm decoder layer output {type(output).__name__}")


@contextmanager
def install(model: nn.Module, model_type: str, sites: Sequence[int], hook: TokenHook,
            request_rows: Callable[[], list[int]]) -> Iterator[ForwardState]:
    """Install ``hook`` at ``sites`` of a vLLM model (``model.model.layers``) for the duration.

    ``request_rows()`` gives, at forward time, the bound row of each request of the runner's input batch in its
    order (-1 for requests of other calls).
    """
    from vllm.forward_context import get_forward_context

    if RESIDUAL_CONVENTIONS.get(model_type) != "hidden+residual":
        raise MemtocError(f"capture/edits inside vllm know the residual stream of {', '.join(RESIDUAL_CONVENTIONS)}"
                          f" models; {model_type!r} is not among them (memtoc/backends/vllm_rows.py)")
    layers = model.model.layers
    n = len(layers) + 1
    bad = [s for s in sites if not 0 <= int(s) < n]
    if bad:
        raise SiteSpecError(f"unknown layer {bad[0]}: this model has sites 0..{n - 1} (0 = embedding output, "
                            "s = output of block s-1)")
    state = ForwardState()

    def begin(module: nn.Module, args: tuple, kwargs: dict) -> None:
        md = _metadata(get_forward_context().attn_metadata)
        positions = kwargs["positions"] if "positions" in kwargs else args[0]
        n_tok = int(positions.shape[-1])             # [n] (or [3, n] for multi-axis rotary positions)
        state.rows = token_rows(n_tok, md.query_start_loc, md.seq_lens, request_rows())
        idx = hook.select(state.rows)
        state.selected = {0: None if idx is None or idx.numel() == 0 else idx}

    def at_site(site: int, stream_rows: Callable[[torch.Tensor], torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor] | None:
        idx = state.selected.get(0)
        if idx is None or state.rows is None:
            return None
        new = hook.apply(site, stream_rows(idx), state.rows, idx)
        return None if new is None else (idx, new)

    # On block 0, not on the decoder stack: vLLM's compile decorator calls the stack's forward directly, past
    # its hooks. Registered first, so it runs before site 0's hook.
    hooks = [Hook(layers[0], "pre_kwargs", begin)]
    for site in sorted(set(int(s) for s in sites)):
        if site == 0:
            def pre(module: nn.Module, args: tuple, kwargs: dict) -> Any:
                hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
                got = at_site(0, lambda i: hidden[i])
                if got is None:
                    return None
                idx, new = got
                hidden = hidden.clone()
                hidden[idx] = new.to(hidden.dtype)
                if len(args) > 1:
                    return (args[0], hidden, *args[2:]), kwargs
                return args, {**kwargs, "hidden_states": hidden}
            hooks.append(Hook(layers[0], "pre_kwargs", pre))
        else:
            hooks.append(Hook(layers[site - 1], "forward", _post_hook(site, at_site)))
    with register(hooks):
        yield state


def _post_hook(site: int, at_site: Callable[..., Any]) -> Callable[..., Any]:
    """The forward hook of site ``site >= 1``: reads ``hidden + residual`` of the selected rows, writes a
    replacement as ``(0, new)`` so the next block's fused add gives ``new`` exactly."""
    def post(module: nn.Module, args: tuple, output: Any) -> Any:
        hidden, residual = _stream_of(output)
        got = at_site(site, lambda i: hidden[i] + residual[i] if residual is not None else hidden[i])
        if got is None:
            return None
        idx, new = got
        if residual is None:
            hidden = hidden.clone()
            hidden[idx] = new.to(hidden.dtype)
            return hidden
        hidden, residual = hidden.clone(), residual.clone()
        hidden[idx] = 0
        residual[idx] = new.to(residual.dtype)
        return hidden, residual
    return post
