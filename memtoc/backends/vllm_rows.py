"""Token rows inside vLLM: which request and position every row of a forward is, and the site hooks that use it.

vLLM runs all scheduled requests as one flattened ``[n_tokens, d]`` tensor (prefills, decoding rows and chunked
prefills side by side). The runner's batch metadata says which rows are whose: ``query_start_loc`` (row offsets
per request of this step) and ``seq_lens`` (tokens in context after it), in the order of the runner's input
batch (which may reorder requests). Row ``j`` of request ``r`` is the token at absolute position
``seq_lens[r] - (qsl[r + 1] - qsl[r]) + (j - qsl[r])``; :func:`token_rows` computes that once per forward.

vLLM's Llama-family decoder layers return ``(hidden_states, residual)`` and defer the residual add into the
next layer's fused add-norm, so the stream after a block is ``hidden_states + residual``. A replacement at site
``s >= 1`` writes the new stream into ``residual`` and zero into ``hidden_states`` for the touched rows, so the
next block's add gives it exactly (no ``new - residual`` round-off).

The hooks live inside vLLM's workers (reached through ``memtoc.backends.vllm_worker``); each worker keeps one
:class:`Dispatcher`, which installs the hooks of every open session through the one registrar. A request
belongs to a session by a tag in its ``SamplingParams.extra_args`` (:data:`TAG`), so no request id has to be
known before the engine runs it.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

import torch
from torch import nn

from memtoc.backends.device_ops import math_dtype
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
    """What capture and edits give :meth:`TokenRowBackend.token_hooks`; pickled to every worker.

    In the worker, per forward: ``select(rows)`` gives the flattened rows it touches (None: none) and
    ``apply(site, x, rows, idx)`` returns the new stream of those rows (edits) or None (readers); ``collect()``
    goes back when the session closes. A hook with ``reads_only = True`` runs on tensor rank 0 only and may stage
    device copies (``staged``, finished by ``flush()``). In the caller, ``absorb(results, fed)`` takes every
    worker's ``(rank info, collect())`` and the tokens fed back per row, and raises when its hooks missed rows.
    """

    def select(self, rows: TokenRows) -> torch.Tensor | None: ...

    def apply(self, site: int, x: torch.Tensor, rows: TokenRows, idx: torch.Tensor) -> torch.Tensor | None: ...

    def collect(self) -> Any: ...

    def absorb(self, results: Sequence[tuple[dict, Any]], fed: Sequence[int]) -> None: ...


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how a hook's error travels back to the caller."""
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__


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


def _stream_of(output: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], torch.Tensor):
        return output[0], output[1]
    if isinstance(output, torch.Tensor):
        return output, None
    raise TypeError(f"unexpected vllm decoder layer output {type(output).__name__}")


#: Key of ``SamplingParams.extra_args`` that marks a hooked request: ``{"s": [session ids], "r": bound row}``.
TAG = "memtoc"


def request_tag(extra_args: Mapping[str, Any] | None) -> tuple[tuple[str, ...], int] | None:
    """The sessions a request belongs to and its bound row, from its ``SamplingParams.extra_args`` (None: untreated)."""
    tag = (extra_args or {}).get(TAG)
    if not tag:
        return None
    return tuple(str(s) for s in tag["s"]), int(tag["r"])


class RunnerV2Error(MemtocError):
    """vLLM's V2 model runner is active: it keeps no input batch between steps, so hooks cannot read the order."""


V2_REFUSAL = ("capture and edits inside vllm need its V1 model runner, but this engine runs the V2 runner "
              "(VLLM_USE_V2_MODEL_RUNNER=1, or unset with Triton present); set VLLM_USE_V2_MODEL_RUNNER=0 before "
              "the engine is built (memtoc's vllm backend does unless you set it)")


def check_runner(runner: Any) -> None:
    """Refuse a runner whose request order cannot be read: the V2 GPU/CPU runner (``vllm/v1/worker/gpu``) has no
    ``input_batch`` (its batch is a local of each step) and no ``requests`` map of cached request states."""
    if not hasattr(runner, "input_batch") or not hasattr(runner, "requests"):
        raise RunnerV2Error(V2_REFUSAL)


@dataclass
class _Active:
    """One hook's share of the forward in progress."""

    sid: str
    hook: Any
    sites: frozenset[int]
    rows: TokenRows
    idx: torch.Tensor                    # selected flattened rows (host)
    dev: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    def on(self, device: torch.device) -> torch.Tensor:
        got = self.dev.get(device)
        if got is None:
            got = self.dev[device] = self.idx.to(device, non_blocking=True)
        return got


class Dispatcher:
    """The hooks of one worker: sessions (each a list of ``(sites, TokenHook)``, applied in the order opened, so an
    edit opened before a capture is read edited) installed at the union of their sites on the blocks this worker
    owns (pipeline parallel).

    Per forward, a pre-hook on the first owned block reads the runner's request order and each request's tag,
    then the row layout from the runner's host-side copies, so no device tensor is read back. Requests without a
    tag of an open session are never touched.
    """

    def __init__(self, model: nn.Module, model_type: str, runner: Any) -> None:
        if RESIDUAL_CONVENTIONS.get(model_type) != "hidden+residual":
            raise MemtocError(f"capture/edits inside vllm know the residual stream of "
                              f"{', '.join(RESIDUAL_CONVENTIONS)} models; {model_type!r} is not among them "
                              "(memtoc/backends/vllm_rows.py)")
        check_runner(runner)
        self.model, self.runner = model, runner
        inner = model.model
        self.layers = inner.layers
        self.n_sites = len(self.layers) + 1
        self.start = int(getattr(inner, "start_layer", 0))
        self.end = int(getattr(inner, "end_layer", len(self.layers)))
        self.sessions: dict[str, list[tuple[frozenset[int], Any]]] = {}
        self.active: list[_Active] = []
        self._tags: dict[str, tuple[tuple[str, ...], int] | None] = {}
        self.errors: dict[str, str] = {}         # session -> what a hook raised inside a forward
        self._stack = ExitStack()

    # -- sessions ------------------------------------------------------------------------------------------------
    def owns(self, site: int) -> bool:
        """Site 0 lives on the stage of block 0; site ``s >= 1`` on the stage of block ``s - 1``."""
        block = 0 if site == 0 else site - 1
        return self.start <= block < self.end

    def open(self, sid: str, hooks: Sequence[tuple[Sequence[int], Any]]) -> None:
        for sites, _ in hooks:
            bad = [s for s in sites if not 0 <= int(s) < self.n_sites]
            if bad:
                raise SiteSpecError(f"unknown layer {bad[0]}: this model has sites 0..{self.n_sites - 1} "
                                    "(0 = embedding output, s = output of block s-1)")
        p = next(self.model.parameters(), None)
        for _, h in hooks:
            prepare = getattr(h, "prepare", None)
            if prepare is not None and p is not None:
                prepare(p.device, math_dtype(p.dtype))
        self.sessions[sid] = [(frozenset(int(s) for s in sites), h) for sites, h in hooks]
        self._install()

    def close(self, sid: str) -> tuple[list[Any], str | None]:
        """Remove a session: its hooks (what they gathered, staged copies flushed) in the order opened, and the
        error a hook raised inside a forward or while flushing (None when none did). The session is removed and
        the hooks uninstalled whatever the flush raised."""
        try:
            self._flush()
        finally:
            hooks = self.sessions.pop(sid, [])
            error = self.errors.pop(sid, None)
            self._tags = {k: v for k, v in self._tags.items() if v is None or sid not in v[0]}
            self._install()
        return [h for _, h in hooks], error

    def _install(self) -> None:
        self._stack.close()
        self._stack = ExitStack()
        self.active = []
        sites = sorted({s for hooks in self.sessions.values() for ss, _ in hooks for s in ss if self.owns(s)})
        if not self.sessions:
            return
        first = self.layers[self.start]
        hooks = [Hook(first, "pre_kwargs", self._begin)]
        for site in sites:
            if site == 0:
                hooks.append(Hook(self.layers[0], "pre_kwargs", self._pre0))
            else:
                hooks.append(Hook(self.layers[site - 1], "forward", self._post(site)))
        self._stack.enter_context(register(hooks))

    # -- per forward ---------------------------------------------------------------------------------------------
    def _tag(self, rid: str) -> tuple[tuple[str, ...], int] | None:
        if rid not in self._tags:
            state = self.runner.requests.get(rid)
            params = getattr(state, "sampling_params", None)
            self._tags[rid] = request_tag(getattr(params, "extra_args", None))
        return self._tags[rid]

    def _layout(self, n_req: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``query_start_loc`` and ``seq_lens`` of this step from the runner's host copies (no device read)."""
        qsl = getattr(getattr(self.runner, "query_start_loc", None), "cpu", None)
        seq = getattr(self.runner, "optimistic_seq_lens_cpu", None)
        if isinstance(qsl, torch.Tensor) and isinstance(seq, torch.Tensor):
            return qsl[:n_req + 1], seq[:n_req]
        from vllm.forward_context import get_forward_context

        md = _metadata(get_forward_context().attn_metadata)
        return md.query_start_loc, md.seq_lens

    def _flush(self) -> None:
        """Finish the host copies staged by the previous forward (one host sync per step). A hook that raises is
        reported by its session when it closes, never into the engine's forward or another session."""
        for sid, hooks in self.sessions.items():
            for _, h in hooks:
                if getattr(h, "staged", None):
                    try:
                        h.flush()
                    except Exception as exc:     # noqa: BLE001 - reported when the session closes
                        self.errors.setdefault(sid, one_line(exc))

    def _begin(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.active = []
        self._flush()
        batch = self.runner.input_batch
        req_ids = list(batch.req_ids[:batch.num_reqs])
        tags = [self._tag(r) for r in req_ids]
        if not any(t is not None for t in tags):
            return
        positions = kwargs["positions"] if "positions" in kwargs else args[0]
        n_tok = int(positions.shape[-1])             # [n] (or [3, n] for multi-axis rotary positions)
        qsl, seq = self._layout(len(req_ids))
        for sid, hooks in self.sessions.items():
            rows_of = [t[1] if t is not None and sid in t[0] else -1 for t in tags]
            if all(r < 0 for r in rows_of):
                continue
            rows = token_rows(n_tok, qsl, seq, rows_of)
            for sites, hook in hooks:
                try:
                    idx = hook.select(rows)
                except Exception as exc:      # noqa: BLE001 - reported when the session closes
                    self.errors.setdefault(sid, one_line(exc))
                    break
                if idx is not None and idx.numel():
                    self.active.append(_Active(sid, hook, sites, rows, idx))

    def _at(self, site: int, read: Callable[[torch.Tensor], torch.Tensor],
            write: Callable[[torch.Tensor, torch.Tensor], None], device: torch.device) -> None:
        for a in list(self.active):
            if site not in a.sites:
                continue
            dev_idx = a.on(device)
            try:
                new = a.hook.apply(site, read(dev_idx), a.rows, a.idx)
            except Exception as exc:       # noqa: BLE001 - an edit's error must not kill the engine: the
                self.errors.setdefault(a.sid, one_line(exc))   # session reports it on close
                self.active = [b for b in self.active if b.sid != a.sid]
                continue
            if new is not None:
                write(dev_idx, new)

    def _pre0(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        if not self.active:
            return None
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        box = {"h": hidden}

        def write(i: torch.Tensor, new: torch.Tensor) -> None:
            if box["h"] is hidden:
                box["h"] = hidden.clone()
            box["h"][i] = new.to(hidden.dtype)

        self._at(0, lambda i: box["h"][i], write, hidden.device)
        if box["h"] is hidden:
            return None
        if len(args) > 1:
            return (args[0], box["h"], *args[2:]), kwargs
        return args, {**kwargs, "hidden_states": box["h"]}

    def _post(self, site: int) -> Callable[..., Any]:
        """Site ``s >= 1``: reads ``hidden + residual``; a replacement is written as ``(0, new)`` so the next
        block's fused add gives ``new`` exactly."""
        def post(module: nn.Module, args: tuple, output: Any) -> Any:
            if not self.active:
                return None
            try:
                hidden, residual = _stream_of(output)
            except TypeError as exc:          # reported by every session of this forward when it closes
                for a in self.active:
                    self.errors.setdefault(a.sid, str(exc))
                self.active = []
                return None
            box = {"h": hidden, "r": residual}

            def read(i: torch.Tensor) -> torch.Tensor:
                return box["h"][i] + box["r"][i] if box["r"] is not None else box["h"][i]

            def write(i: torch.Tensor, new: torch.Tensor) -> None:
                if box["h"] is hidden:
                    box["h"] = hidden.clone()
                    box["r"] = None if residual is None else residual.clone()
                if box["r"] is None:
                    box["h"][i] = new.to(hidden.dtype)
                else:
                    box["h"][i] = 0
                    box["r"][i] = new.to(residual.dtype)

            self._at(site, read, write, hidden.device)
            if box["h"] is hidden:
                return None
            return box["h"] if residual is None else (box["h"], box["r"])
        return post
