"""Greedy decoding with the KV cache for the hf backend: shared-prefix prefill and row compaction.

``model.generate`` recomputes every row until the longest finishes and prefills every prompt in full, though
prompts share most of their text; on CPU both costs dominate an evaluation. This loop prefills the longest
common token prefix once, as a batch of one, and repeats its cache over the rows before prefilling the
left-padded suffixes (each row is ``prefix, padding, suffix``, positions following the mask, so every row sees
the tokens and positions it would alone), and drops finished rows from the batch and the cache at every step.

With an edit attached, the shared prefix stops before the first edited token (``prefix_limit``) and the edit's
column-addressed hooks are told the prefix length (``on_prefix``) and which rows remain (``on_compact``); every
suffix token keeps the column it has in the plain left-padded batch. Rows that repeat one prompt at several
strengths also share that prompt's unedited tokens (``row_prefix_limits``; ``on_prefix(n, shift)``). All paths
give the same greedy continuation as ``model.generate`` (``tests/memtoc/backends/test_decode.py``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from memtoc.backends.tokens import left_pad

#: A shared prefix shorter than this is not worth a separate pass.
MIN_SHARED_PREFIX = 8


@dataclass
class DecodeResult:
    """Generated ids of one row (end-of-sequence excluded) and why it stopped."""

    ids: list[int]
    stop: str          # "eos" | "final_line" | "max_tokens"


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by all rows, leaving every row at least one own token."""
    if not rows:
        return 0
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for k in range(max(n, 0)):
        t = first[k]
        if any(r[k] != t for r in rows[1:]):
            return k
    return max(n, 0)


def _positions(mask: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
    """Position ids following the attention mask (padding gets 1, as in ``model.generate``)."""
    return (start + mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


class RowSampler:
    """Temperature / nucleus sampling with one ``torch.Generator`` per row, seeded per row: ``sampler(logits,
    rows)`` picks each batch row's next token from the generator of its original row (``rows``), so a sample
    never depends on the rows beside it. Probabilities are computed in float32 on the CPU.
    """

    def __init__(self, seeds: Sequence[int], *, temperature: float, top_p: float = 1.0) -> None:
        if temperature <= 0:
            raise ValueError("RowSampler needs temperature > 0 (temperature 0 is greedy decoding)")
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def __call__(self, logits: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        probs = torch.softmax(logits.detach().float().cpu() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p >= self.top_p      # keep the smallest set reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        picks = [torch.multinomial(probs[b], 1, generator=self.generators[r]) for b, r in enumerate(rows)]
        return torch.cat(picks).to(logits.device)


def _check_rows_cache(cache: Any) -> None:
    if not (hasattr(cache, "batch_repeat_interleave") and hasattr(cache, "batch_select_indices")):
        raise RuntimeError(f"a {type(cache).__name__} cannot repeat or select rows: no grouped prefill with it")


class GreedyDecoder:
    """Greedy continuation of token rows with ``model``'s KV cache."""

    def __init__(self, model: Any, *, pad_id: int, eos_ids: set[int]) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_ids = set(eos_ids)
        params = inspect.signature(model.forward).parameters
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # transformers >= 5.2x names the cache argument ``cache``; older versions ``past_key_values``.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _step(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **{self._cache_kw: cache}, **self._logits_kw)
        new = getattr(out, "cache", None)
        return out.logits[:, -1], new if new is not None else out.past_key_values

    def _grouped_prefill(self, rows: Sequence[Sequence[int]], shared: int, limits: Sequence[int],
                         on_prefix: Callable[..., None] | None) -> tuple[torch.Tensor, Any, torch.Tensor] | None:
        """Prefill rows that repeat a prompt (one prompt at several edit strengths) with one pass per prompt.

        Three passes: the batch's common prefix once, each distinct prompt's unedited tokens after it once, then
        every row's edited suffix from its prompt's cache. Every suffix sits ``shift`` columns right of its
        column in the plain left-padded batch, which ``on_prefix(n, shift)`` tells the edit. Returns (last
        logits, cache, mask), or None when no prompt repeats or there is nothing worth sharing.
        """
        B = len(rows)
        index: dict[tuple[int, ...], int] = {}
        src = [index.setdefault(tuple(r), len(index)) for r in rows]
        U = len(index)
        if U == B:
            return None
        uniq = [list(r) for r in index]
        own = [len(u) - 1 for u in uniq]                       # every row keeps one token of its own to prefill
        for b, u in enumerate(src):
            own[u] = min(own[u], int(limits[b]))
        g = min(shared, min(own) - 1) if shared >= MIN_SHARED_PREFIX else 0
        g = g if g >= MIN_SHARED_PREFIX else 0
        saved = sum(own[u] - g for u in src) - sum(own[u] - g for u in range(U))
        if min(own) - g < 1 or saved < MIN_SHARED_PREFIX:
            return None
        dev = self.device
        parts = [u[g:own[i]] for i, u in enumerate(uniq)]
        suffixes = [list(r[own[u]:]) for r, u in zip(rows, src)]
        width = g + max(len(x) for x in parts)
        shift = width + max(len(x) for x in suffixes) - max(len(r) for r in rows)
        if on_prefix is not None:
            on_prefix(width, shift)      # before any pass: the edit skips the unedited ones
        cache = None
        if g:
            prefix = torch.as_tensor([uniq[0][:g]], dtype=torch.long, device=dev)
            _, cache = self._step(prefix, torch.ones_like(prefix), _positions(torch.ones_like(prefix)), None)
            _check_rows_cache(cache)
            cache.batch_repeat_interleave(U)
        gids, gmask = left_pad(parts, self.pad_id, dev)
        umask = torch.cat([torch.ones((U, g), dtype=torch.long, device=dev), gmask], dim=1)
        _, cache = self._step(gids, umask, _positions(gmask, g), cache)
        _check_rows_cache(cache)
        sel = torch.as_tensor(src, dtype=torch.long, device=dev)
        cache.batch_select_indices(sel)
        sids, smask = left_pad(suffixes, self.pad_id, dev)
        mask = torch.cat([umask[sel], smask], dim=1)
        logits, cache = self._step(sids, mask, _positions(mask)[:, width:], cache)
        return logits, cache, mask

    def _prefill(self, rows: Sequence[Sequence[int]], shared: int, on_prefix: Callable[..., None] | None
                 ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """The prompt pass: the ``shared`` common prefix once as a batch of one (when long enough and the cache
        can repeat rows), then the left-padded suffixes; else the plain left-padded batch. Returns (last logits,
        cache, mask)."""
        B, dev = len(rows), self.device
        cache = None
        if shared >= MIN_SHARED_PREFIX:
            if on_prefix is not None:
                on_prefix(shared)
            prefix = torch.as_tensor([list(rows[0][:shared])], dtype=torch.long, device=dev)
            pmask = torch.ones_like(prefix)
            _, cache = self._step(prefix, pmask, _positions(pmask), None)
            if not hasattr(cache, "batch_repeat_interleave"):
                cache, shared = None, 0          # a cache type without row repetition: plain prefill
                if on_prefix is not None:
                    on_prefix(0)
            else:
                cache.batch_repeat_interleave(B)
        if cache is not None:
            ids, smask = left_pad([r[shared:] for r in rows], self.pad_id, dev)
            mask = torch.cat([torch.ones((B, shared), dtype=torch.long, device=dev), smask], dim=1)
            logits, cache = self._step(ids, mask, _positions(smask, shared), cache)
        else:
            ids, mask = left_pad(rows, self.pad_id, dev)
            logits, cache = self._step(ids, mask, _positions(mask), None)
        return logits, cache, mask

    @torch.inference_mode()
    def decode(self, rows: Sequence[Sequence[int]], max_new_tokens: int, *,
               is_done: Callable[[list[int]], bool] | None = None, fast: bool = True,
               share_prefix: bool | None = None, compact: bool | None = None,
               on_compact: Callable[[list[int]], None] | None = None,
               prefix_limit: int | None = None, on_prefix: Callable[..., None] | None = None,
               row_prefix_limits: Sequence[int] | None = None,
               sampler: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
               constraint: Any = None) -> list[DecodeResult]:
        """Greedy ids after each row.

        ``is_done(ids)``: the caller's stop test beyond end-of-sequence, asked after every token. ``fast`` sets
        both ``share_prefix`` and ``compact`` (drop finished rows) unless they are given. ``on_compact(keep)``
        is told every reduction of the batch (surviving rows as indices into the batch before it).
        ``prefix_limit`` caps the shared prefix and ``on_prefix(n)`` is told its length before it runs (0: none).
        ``constraint`` masks each step's logits per original row (``mask(logits, rows)``) and is told every token
        a row takes (``accept(row, token)``). ``row_prefix_limits``: see :meth:`_grouped_prefill`.
        """
        share_prefix = fast if share_prefix is None else share_prefix
        compact = fast if compact is None else compact
        B = len(rows)
        results = [DecodeResult(ids=[], stop="max_tokens") for _ in range(B)]
        if B == 0 or max_new_tokens <= 0:
            return results
        dev = self.device
        shared = common_prefix_length(rows) if share_prefix and B > 1 else 0
        if prefix_limit is not None:
            shared = min(shared, int(prefix_limit))
        grouped = (self._grouped_prefill(rows, shared, row_prefix_limits, on_prefix)
                   if share_prefix and row_prefix_limits is not None and B > 1 else None)
        logits, cache, mask = grouped if grouped is not None else self._prefill(rows, shared, on_prefix)
        compact = compact and hasattr(cache, "batch_select_indices")
        last_pos = _positions(mask)[:, -1]
        active = list(range(B))          # original row of each batch row
        finished = [False] * B
        for step in range(max_new_tokens):
            if constraint is not None:
                logits = constraint.mask(logits, list(active))
            nxt = logits.argmax(-1) if sampler is None else sampler(logits, list(active))
            tokens = nxt.tolist()
            for b, row in enumerate(active):
                if finished[row]:
                    continue
                t = int(tokens[b])
                if constraint is not None:
                    constraint.accept(row, t)
                if t in self.eos_ids:
                    finished[row], results[row].stop = True, "eos"
                    continue
                results[row].ids.append(t)
                if is_done is not None and is_done(results[row].ids):
                    finished[row], results[row].stop = True, "final_line"
            if all(finished) or step == max_new_tokens - 1:
                break
            if compact:
                keep = [b for b, row in enumerate(active) if not finished[row]]
                if len(keep) < len(active):
                    if on_compact is not None:
                        on_compact(keep)
                    sel = torch.as_tensor(keep, device=dev)
                    cache.batch_select_indices(sel)
                    mask, last_pos, nxt = mask[sel], last_pos[sel], nxt[sel]
                    active = [active[b] for b in keep]
            else:
                # Static batch: finished rows are fed padding, as model.generate does.
                done = torch.as_tensor([finished[r] for r in active], device=dev)
                nxt = nxt.masked_fill(done, self.pad_id)
            mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=dev)], dim=1)
            last_pos = last_pos + 1
            logits, cache = self._step(nxt[:, None], mask, last_pos[:, None], cache)
        return results
