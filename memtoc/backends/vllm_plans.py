"""How the vllm backend runs edit and capture plans (``memtoc.backends.plans``): as token-row hooks
(``memtoc.backends.vllm_rows.TokenHook``) pickled into every worker, addressed by (request row, token index).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from memtoc.backends.base import InterventionUnsupportedError, SiteInfo
from memtoc.backends import device_ops
from memtoc.backends.plans import CapturePlan, EditPlan, EditRows, HookPlan, PositionPlan, RowApplier


def token_hook(plan: Any, batch: Any, info: SiteInfo) -> Any:
    """The worker hook of ``plan`` for ``batch`` (None: nothing to install)."""
    if isinstance(plan, EditPlan):
        if not plan.edit.has_row_appliers:
            raise InterventionUnsupportedError(f"a {plan.edit.kind!r} edit has no row appliers, which the 'vllm' "
                                               "backend needs")
        if plan.positions.empty:
            return None
        strengths = plan.strengths or [plan.edit.strength] * plan.positions.batch_size
        return PlanTokenHook(plan.positions, plan.edit, strengths, batch.n_pad, info.d_model)
    if isinstance(plan, CapturePlan):
        if plan.hooks or plan.eager:
            raise InterventionUnsupportedError("this capture reads the model's sub-blocks, which the vllm backend "
                                               "runs out of reach; use --backend hf")
        return TokenCapture(plan, info.d_model, getattr(torch, info.dtype))
    if isinstance(plan, HookPlan):
        raise InterventionUnsupportedError("hook points with a function of their own need the model's module tree, "
                                           "which the vllm backend runs out of reach; use --backend hf")
    raise TypeError(f"not an intervention plan: {type(plan).__name__}")


class PlanTokenHook:
    """An edit on a token-row backend (vllm): which flattened rows of a forward the plan touches, and the applier.

    A row ``(request r, position p)`` is edited when column ``n_pad[r] + p`` is a prompt column the plan selects,
    or lies past the prompt and ``r`` edits generated tokens -- the rule :meth:`PositionPlan.chunk_index` applies
    on hf, so both backends edit the same tokens; rows of strength 0 are never touched. Every tensor rank edits
    and counts the rows it edited; :meth:`absorb` refuses a pass where any rank edited fewer than planned.
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


class TokenCapture:
    """Capture on a token-row backend (vllm): every flattened row of a forward whose (request row, token index) is
    in the selection is copied into its slot of ``values[site]``.

    It runs on tensor rank 0 (each pipeline stage fills its sites). On an accelerator (or with ``stage=True``) the
    rows go to a pinned host buffer by a non-blocking copy, scattered after the next forward's one device sync
    (:meth:`flush`). A recomputed row lands in the same slot again; :meth:`check` refuses a capture where any
    selected position never arrived.
    """

    reads_only = True

    def __init__(self, plan: CapturePlan, d_model: int, dtype: torch.dtype, *, stage: bool | None = None) -> None:
        n_tok = torch.as_tensor(list(plan.n_tokens), dtype=torch.long)
        self.n_tok = n_tok
        self.base = torch.cumsum(n_tok, 0) - n_tok
        total = int(n_tok.sum())
        self.slot = torch.full((max(total, 1),), -1, dtype=torch.long)
        # A token selected by several kinds (last_input is also in all) is read once, then copied per entry.
        flat = self.base[torch.as_tensor(plan.rows, dtype=torch.long)] + torch.as_tensor(
            plan.token_index, dtype=torch.long)
        uniq, self.inverse = torch.unique(flat, return_inverse=True)
        self.slot[uniq] = torch.arange(uniq.numel())
        self.sites = tuple(int(s) for s in plan.sites)
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
                raise InterventionUnsupportedError(
                    f"vllm computed {int(f.sum())} of {f.numel()} selected tokens at site {site}; the others never "
                    "reached the hooks (a compiled forward, or a prefix served from the engine's cache?)")
