"""How the vllm backend runs edit and capture plans (``memtoc.backends.plans``): as token-row hooks
(``memtoc.backends.vllm_rows.TokenHook``) pickled into every worker, addressed by (request row, token index).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from memtoc.backends.base import InterventionUnsupportedError, SiteInfo
from memtoc.backends.plans import EditPlan, EditRows, PositionPlan, RowApplier


def token_hook(plan: Any, batch: Any, info: SiteInfo) -> Any:
    """The worker hook of ``plan`` for ``batch`` (None: nothing to install)."""
    if isinstance(plan, EditPlan):
        if not plan.edit.has_row_appliers:
            raise InterventionUnsupportedError(f"a {plan.edit.kind!r} edit has no row appliers, which the 'vllm' "
                                               "backend needs")
        if plan.positions.empty:
            return None
        return PlanTokenHook(plan.positions, plan.edit, plan.row_strengths(), batch.n_pad, info.d_model)
    raise TypeError(f"not an intervention plan: {type(plan).__name__}")


class PlanTokenHook:
    """An edit on a token-row backend (vllm): which flattened rows of a forward the plan touches, and the applier.

    A row ``(request r, position p)`` is edited when column ``n_pad[r] + p`` is a prompt column the plan selects,
    or lies past the prompt and ``r`` edits generated tokens -- the same rule :meth:`PositionPlan.chunk_index`
    applies to hf's padded columns, so both backends edit the same tokens. Rows of strength 0 are never touched
    (a sweep's baseline equals the untreated run). Implements ``memtoc.backends.vllm_rows.TokenHook``: it is
    pickled into every vLLM worker (every tensor rank edits), builds the edit's row appliers there on the
    worker's device and dtype, and counts the rows it edited per request and site; :meth:`absorb` refuses a pass
    where any rank edited fewer rows than planned (a compiled forward, a cached prefix: never a silent no-op).
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

    def finish(self, plan: Any) -> None:
        """Nothing to hand back: :meth:`absorb` already checked the edited rows."""

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
