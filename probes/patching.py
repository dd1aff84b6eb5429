"""Activation patching and attribution patching: where in the network a clean/corrupt difference decides.

A :class:`PatchPair` is two token sequences that differ in one input (the tool value of ``tool_right`` and
``tool_wrong`` of one question), the aligned positions of each named role in both, and two answer tokens; the
metric ``logp(a) - logp(b)`` is read at the last position (the answer prefix ``FINAL: `` teacher-forced).

- :func:`exact_patching`: per hook point (TransformerLens names) and role, the corrupt sequence run with the
  clean activation written over the role's positions; many variants share one batched forward.
- :func:`attribution_patching`: the first-order estimate of the same effects from one forward and one backward
  of the corrupt sequence: the fast first pass, whose top cells exact patching confirms.

Forwards run through ``ModelParts.forward`` with a :class:`~memtoc.backends.plans.HookPlan`, so the hooks are
the one registrar's; a hook that did not fire is an error, never a zero.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from memtoc.backends.plans import HookPlan
from probes.model import ModelParts, ProbeError

__all__ = ["ROLES", "COMPONENTS", "PatchPair", "PairResult", "decision_metric", "exact_patching",
           "attribution_patching", "hook_names_for"]

ROLES = ("question", "tool_span", "final")
#: component -> the TransformerLens hook kind patched (the block's residual output, attention output, MLP output)
COMPONENTS = {"resid": "hook_resid_post", "attn": "hook_attn_out", "mlp": "hook_mlp_out"}


@dataclass
class PatchPair:
    """Two sequences of one question and the roles' aligned positions in each."""

    pair_id: str
    clean_ids: list[int]
    corrupt_ids: list[int]
    positions: dict[str, tuple[list[int], list[int]]]      # role -> (clean positions, corrupt positions)
    answer_ids: tuple[int, int]                              # (a, b): metric = logp(a) - logp(b)
    meta: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        for role, (c, k) in self.positions.items():
            if len(c) != len(k):
                raise ProbeError(f"pair {self.pair_id}: role {role} has {len(c)} clean and {len(k)} corrupt "
                                 "positions; aligned roles need one position for one")
            if any(not 0 <= p < len(self.clean_ids) for p in c) or any(not 0 <= p < len(self.corrupt_ids)
                                                                         for p in k):
                raise ProbeError(f"pair {self.pair_id}: role {role} has a position outside its sequence")


@dataclass
class PairResult:
    """Effects of one pair: ``effects[name][role]`` = patched metric - corrupt metric (NaN: role absent)."""

    pair_id: str
    clean_metric: float
    corrupt_metric: float
    effects: dict[str, dict[str, float]]

    @property
    def gap(self) -> float:
        return self.clean_metric - self.corrupt_metric


def hook_names_for(n_blocks: int, components: Sequence[str] = ("resid", "attn", "mlp"),
                   blocks: Sequence[int] | None = None) -> list[str]:
    """The hook names of ``components`` at ``blocks`` (default: every block), block-major."""
    bad = [c for c in components if c not in COMPONENTS]
    if bad:
        raise ProbeError(f"unknown component(s) {', '.join(bad)}; choose from {', '.join(COMPONENTS)}")
    blocks = range(n_blocks) if blocks is None else blocks
    return [f"blocks.{b}.{COMPONENTS[c]}" for b in blocks for c in components]


def decision_metric(logits: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """``log p(a) - log p(b)`` of next-token logits ``[..., vocab]`` (the softmax normaliser cancels)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp[..., a] - logp[..., b]


def _resolve(model: ModelParts | nn.Module) -> ModelParts:
    return ModelParts.of(model) if isinstance(model, nn.Module) else model


def _run(parts: ModelParts, ids: torch.Tensor, names: Sequence[str], fn: Any, *,
         inputs_embeds: torch.Tensor | None = None, cached: bool = False, past: Any = None
         ) -> tuple[torch.Tensor, Any]:
    """Last-position logits of ``ids`` ``[B, S]`` (no padding: equal rows) with ``fn`` at ``names``, and the KV
    cache when ``cached``. ``past``: the cache of the first ``n`` columns (every row's), so only
    ``ids[:, n:]`` run and ``fn`` sees those columns."""
    fired: set[str] = set()

    def hook(name: str, value: torch.Tensor) -> torch.Tensor | None:
        fired.add(name)
        return fn(name, value)

    kwargs: dict[str, Any] = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": ids}
    with parts.intervene(None, HookPlan(hook, names=names)):
        cache = None
        if not cached:
            out = parts.forward(**kwargs)
        else:
            if past is not None:
                kwargs["input_ids"] = ids[:, past.get_seq_length():]
            out, cache = parts.forward_cached(past, **kwargs)
    missing = [n for n in names if n not in fired]
    if missing:
        raise ProbeError(f"hooks did not fire for {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[:, -1, :], cache


def _capture(parts: ModelParts, ids: Sequence[int], names: Sequence[str], a: int, b: int
             ) -> tuple[dict[str, torch.Tensor], float]:
    """Activations ``[S, d]`` at ``names`` and the decision metric of one sequence."""
    acts: dict[str, torch.Tensor] = {}

    def grab(name: str, value: torch.Tensor) -> None:
        acts[name] = value[0].detach().clone()

    x = torch.tensor([list(ids)], device=parts.device)
    with torch.no_grad():
        logits, _ = _run(parts, x, names, grab)
    return acts, float(decision_metric(logits[0], a, b))


def exact_patching(model: ModelParts | nn.Module, pair: PatchPair, names: Sequence[str],
                   roles: Sequence[str] = ROLES, *, batch_rows: int = 32) -> PairResult:
    """Patch each (name, role) of the clean run into the corrupt run, one variant per batch row.

    A patched row equals the corrupt run before its first patched position, so where the model takes a KV cache
    the corrupt run's cache stands for those columns: variants are grouped by their first patched position and
    each group's forwards run only the columns from there on (the ``final`` role: one column)."""
    pair.check()
    parts = _resolve(model)
    a, b = pair.answer_ids
    clean_acts, m_clean = _capture(parts, pair.clean_ids, names, a, b)
    cached = parts.cache_kw is not None
    with torch.no_grad():
        corrupt_logits, cache = _run(parts, torch.tensor([pair.corrupt_ids], device=parts.device), names,
                                     lambda n, v: None, cached=cached)
    corrupt_logits = corrupt_logits[0]
    if cached and not all(hasattr(cache, a) for a in ("crop", "batch_repeat_interleave", "get_seq_length")):
        cached, cache = False, None                # a cache that cannot be cropped and repeated: whole forwards
    m_corrupt = float(decision_metric(corrupt_logits, a, b))
    variants = [(n, r) for n in names for r in roles if pair.positions.get(r) and pair.positions[r][0]]
    effects: dict[str, dict[str, float]] = {n: {r: float("nan") for r in roles} for n in names}
    dev = parts.device
    # The last column always runs (its logits are the metric's), so a group starts at most there.
    last = len(pair.corrupt_ids) - 1
    groups: dict[int, list[tuple[str, str]]] = {}
    for n, r in variants:
        start = min(min(pair.positions[r][1]), last) if cached else 0
        groups.setdefault(start, []).append((n, r))
    chunks = [(start, g[i:i + batch_rows]) for start, g in sorted(groups.items()) for i in range(0, len(g),
                                                                                                  batch_rows)]
    for start, chunk in chunks:
        rows_of: dict[str, list[tuple[int, str]]] = {}
        for i, (n, r) in enumerate(chunk):
            rows_of.setdefault(n, []).append((i, r))
        patched_rows: set[int] = set()

        def patch(name: str, value: torch.Tensor, _rows=rows_of, _done=patched_rows,
                  _off=start) -> torch.Tensor | None:
            todo = _rows.get(name)
            if not todo:
                return None
            value = value.clone()
            for i, r in todo:
                c_pos, k_pos = pair.positions[r]
                value[i, [k - _off for k in k_pos]] = clean_acts[name][c_pos].to(value.dtype)
                _done.add(i)
            return value

        x = torch.tensor([pair.corrupt_ids] * len(chunk), device=dev)
        past = None
        if cached and start > 0:
            past = copy.deepcopy(cache)
            past.crop(start - past.get_seq_length())     # a negative count: the tokens removed (every version)
            past.batch_repeat_interleave(len(chunk))
        with torch.no_grad():
            logits, _ = _run(parts, x, names, patch, cached=cached, past=past)
        if len(patched_rows) != len(chunk):
            raise ProbeError(f"pair {pair.pair_id}: {len(chunk) - len(patched_rows)} patched rows were not patched")
        metrics = decision_metric(logits, a, b)
        for i, (n, r) in enumerate(chunk):
            effects[n][r] = float(metrics[i]) - m_corrupt
    return PairResult(pair.pair_id, m_clean, m_corrupt, effects)


def attribution_patching(model: ModelParts | nn.Module, pair: PatchPair, names: Sequence[str],
                         roles: Sequence[str] = ROLES) -> PairResult:
    """The first-order estimate of :func:`exact_patching`'s effects: one forward and one backward."""
    pair.check()
    parts = _resolve(model)
    a, b = pair.answer_ids
    clean_acts, m_clean = _capture(parts, pair.clean_ids, names, a, b)
    acts: dict[str, torch.Tensor] = {}

    def keep(name: str, value: torch.Tensor) -> None:
        value.retain_grad()
        acts[name] = value

    with parts.frozen(), torch.enable_grad():
        x = torch.tensor([pair.corrupt_ids], device=parts.device)
        embeds = parts.embed(x).detach().requires_grad_(True)   # every activation downstream carries a gradient
        logits, _ = _run(parts, x, names, keep, inputs_embeds=embeds)
        metric = decision_metric(logits[0], a, b)
        metric.backward()
    m_corrupt = float(metric.detach())
    effects: dict[str, dict[str, float]] = {}
    for n in names:
        grad = acts[n].grad
        if grad is None:
            raise ProbeError(f"no gradient reached {n}; it does not feed the metric")
        effects[n] = {}
        for r in roles:
            c_pos, k_pos = pair.positions.get(r) or ([], [])
            if not c_pos:
                effects[n][r] = float("nan")
                continue
            diff = clean_acts[n][c_pos].float() - acts[n][0, k_pos].detach().float()
            effects[n][r] = float((diff * grad[0, k_pos].float()).sum())
    return PairResult(pair.pair_id, m_clean, m_corrupt, effects)


def effect_table(results: Sequence[PairResult], names: Sequence[str], roles: Sequence[str] = ROLES, *,
                 normalise: bool = False) -> np.ndarray:
    """``[pair, name, role]`` effects (``normalise``: divided by the pair's clean - corrupt gap; NaN where the gap
    is zero)."""
    out = np.full((len(results), len(names), len(roles)), np.nan)
    for i, res in enumerate(results):
        scale = res.gap if normalise else 1.0
        for j, n in enumerate(names):
            for k, r in enumerate(roles):
                v = res.effects.get(n, {}).get(r, float("nan"))
                out[i, j, k] = v / scale if scale not in (0.0,) else float("nan")
    return out


def align_positions(clean: Sequence[int], corrupt: Sequence[int]) -> tuple[list[int], list[int]]:
    """Two position lists of one role, aligned from their ends (a tool value of another length: its last tokens
    correspond)."""
    n = min(len(clean), len(corrupt))
    return list(clean[len(clean) - n:]), list(corrupt[len(corrupt) - n:])


# -- components: attention to the tool span, direct logit attribution ------------------------------------------

def attention_mass(model: ModelParts | nn.Module, ids: Sequence[int], query: int, keys: Sequence[int]) -> np.ndarray:
    """``[block, head]`` attention probability from position ``query`` to the positions ``keys`` (summed)."""
    parts = _resolve(model)
    n = parts.n_layers
    names = [f"blocks.{b}.attn.hook_pattern" for b in range(n)]
    rows: dict[int, np.ndarray] = {}

    def grab(name: str, value: torch.Tensor) -> None:
        b = int(name.split(".")[1])
        rows[b] = value[0, :, query, list(keys)].sum(-1).float().cpu().numpy() if keys else \
            np.zeros(value.shape[1])

    with torch.no_grad():
        _run(parts, torch.tensor([list(ids)], device=parts.device), names, grab)
    return np.stack([rows[b] for b in range(n)])


def direct_logit_attribution(model: ModelParts | nn.Module, ids: Sequence[int], a: int, b: int
                             ) -> tuple[dict[str, float], np.ndarray, float]:
    """Each component's direct contribution to ``logit(a) - logit(b)`` at the last position, returned third.

    With the final RMSNorm's scale frozen at the value the full residual gives it, the embedding's, attention
    outputs' and MLP outputs' contributions add up to that difference. Heads: ``[block, head]`` contributions of
    each head's ``hook_z`` through its slice of the output projection.
    """
    parts = _resolve(model)
    n, layout = parts.n_layers, parts.layout
    names = (["blocks.0.hook_resid_pre"] + [f"blocks.{k}.{h}" for k in range(n) for h in ("hook_attn_out",
                                                                                          "hook_mlp_out")]
             + [f"blocks.{k}.attn.hook_z" for k in range(n)] + [f"blocks.{n - 1}.hook_resid_post"])
    vals: dict[str, torch.Tensor] = {}

    def grab(name: str, value: torch.Tensor) -> None:
        vals[name] = value[0, -1].detach().float()

    with torch.no_grad():
        logits = _run(parts, torch.tensor([list(ids)], device=parts.device), names, grab)[0][0]
    norm = parts.final_norm
    resid = vals[f"blocks.{n - 1}.hook_resid_post"]
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    scale = torch.rsqrt(resid.pow(2).mean() + eps)
    gain = norm.weight.detach().float() + layout.norm_offset
    w_u = parts.lm_head.weight.detach().float()
    direction = gain * scale * (w_u[a] - w_u[b])
    comps = {"embed": float(vals["blocks.0.hook_resid_pre"] @ direction)}
    per_head = []
    for k in range(n):
        comps[f"blocks.{k}.hook_attn_out"] = float(vals[f"blocks.{k}.hook_attn_out"] @ direction)
        comps[f"blocks.{k}.hook_mlp_out"] = float(vals[f"blocks.{k}.hook_mlp_out"] @ direction)
        z = vals[f"blocks.{k}.attn.hook_z"]                     # [H, d_head]
        w_o = getattr(parts.block_part(k, "attn"), layout.o).weight.detach().float()   # [d_model, H * d_head]
        h, dh = z.shape
        per_head.append([float(z[i] @ (w_o[:, i * dh:(i + 1) * dh].T @ direction)) for i in range(h)])
    return comps, np.array(per_head), float(logits[a].float() - logits[b].float())
