"""Model plumbing shared by the lenses: ranks, fingerprints, eager attention; parts and hooks from the core.

Sites follow the ``output_hidden_states`` numbering used by ``activations/``: site 0 is the residual stream
entering block 0 (the embedding output), site ``s >= 1`` is the output of decoder block ``s - 1``, and the last
site ``L`` is the *raw* (pre-final-norm) output of the last block -- unlike transformers' ``hidden_states[L]``,
which is already final-normed.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from memtoc.backends import parts as _parts
from memtoc.backends.hf_plans import TreeParts
from memtoc.core.errors import MemtocError


class ProbeError(MemtocError):
    """A lens, rank-table or probe job that cannot run as asked (the message says what to change)."""


class LensMismatchError(ProbeError):
    """A lens artifact that does not belong to this model / corpus / settings."""


# The model's parts, site numbering and the hook registrar are the core's (memtoc.backends.parts / .hooks);
# the names below stay importable from here. ``ModelParts.of(model)`` gives the parts of a module tree, which also
# run plans on its own forwards (``TreeParts``); readout-only parts (vLLM) are the base ``memtoc.backends.parts``
# class.
ModelParts = TreeParts
base_model = _parts.base_model


def default_band(n_layers: int) -> tuple[int, int]:
    """Middle-to-late sites scaled to depth: ``round(0.25 L)`` .. ``round(0.9 L)`` (half rounds up)."""
    lo = int(math.floor(0.25 * n_layers + 0.5))
    hi = int(math.floor(0.9 * n_layers + 0.5))
    return max(lo, 0), max(min(hi, n_layers), max(lo, 0))


def parse_sites(spec: str | Sequence[int] | None, n_layers: int) -> tuple[int, ...]:
    """``default`` / None (the default band), ``all``, ``last``, or a comma list of sites and ranges ``a-b``."""
    lo, hi = default_band(n_layers)
    return _parts.parse_sites(spec, n_layers + 1, default=range(lo, hi + 1), default_names=("", "default"),
                              error=ProbeError)


# -- ranks -------------------------------------------------------------------------------------------------

def token_ranks(logits: torch.Tensor, token_ids: torch.Tensor | Sequence[int] | int, n_vocab: int) -> torch.Tensor:
    """1-based rank of tokens among the real vocabulary: ``1 + #{v < n_vocab : z[v] > z[a]}``.

    ``logits`` is ``[..., V]`` (V may exceed ``n_vocab``: padded embedding rows are ignored); ``token_ids`` is
    an int, ``[K]`` (the same ids for every leading index) or ``[..., K]``. Ties count in the token's favour
    (strict ``>``). Returns int64 ranks ``[..., K]`` (``[...]`` for an int).
    """
    z = logits[..., :n_vocab].float()
    scalar = isinstance(token_ids, int)
    ids = torch.as_tensor([token_ids] if scalar else token_ids, dtype=torch.long, device=z.device)
    if ((ids < 0) | (ids >= n_vocab)).any():
        raise ProbeError(f"token id outside the real vocabulary 0..{n_vocab - 1}: {ids.tolist()}")
    if ids.dim() == 1:
        ids = ids.expand(*z.shape[:-1], ids.shape[0])
    target = torch.gather(z, -1, ids)                                  # [..., K]
    # Counting ``z > target`` by broadcasting builds a [..., K, V] mask and was 60% of the rank table's reading
    # (benchmarks/bench_lens.py); instead sort the K targets, place every logit among them (searchsorted:
    # ``#targets strictly below z``) and count per slot. O(V log K), no [K, V] temporary; ties stay strict.
    lead = z.shape[:-1]
    z2, t2 = z.reshape(-1, z.shape[-1]), target.reshape(-1, target.shape[-1])
    t_sorted, order = t2.sort(-1)
    below = torch.searchsorted(t_sorted, z2.contiguous())              # [R, V] in 0..K
    counts = torch.zeros(t2.shape[0], t2.shape[1] + 1, dtype=torch.long, device=z.device)
    counts.scatter_add_(1, below, torch.ones_like(below))
    above = counts.flip(-1).cumsum(-1).flip(-1)[:, 1:]                 # #z above the j-th smallest target
    ranks = torch.empty_like(order).scatter_(1, order, 1 + above).reshape(*lead, t2.shape[-1])
    return ranks[..., 0] if scalar else ranks


def vocab_ordering(logits: torch.Tensor, n_vocab: int) -> torch.Tensor:
    """Real-vocabulary token ids from most to least likely (ties by id): the full ordering at a position."""
    z = logits[..., :n_vocab].float()
    return torch.sort(z, dim=-1, descending=True, stable=True).indices


# -- identity of a model -----------------------------------------------------------------------------------

def model_fingerprint(model: nn.Module) -> str:
    """A short identity of a model's weights, the same whatever float dtype it was loaded in
    (``memtoc.backends.parts.params_fingerprint`` of its parameters)."""
    return _parts.params_fingerprint(model.named_parameters())
