"""Model plumbing shared by the lenses: blocks, final norm and head, site hooks, ranks, fingerprints.

Sites follow the ``output_hidden_states`` numbering used by ``activations/``: site 0 is the residual stream
entering block 0 (the embedding output), site ``s >= 1`` is the output of decoder block ``s - 1``, and the last
site ``L`` is the *raw* (pre-final-norm) output of the last block -- unlike transformers' ``hidden_states[L]``,
which is already final-normed.
"""

from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from memtoc.errors import MemtocError


class ProbeError(MemtocError):
    """A lens, rank-table or probe job that cannot run as asked (the message says what to change)."""


class LensMismatchError(ProbeError):
    """A lens artifact that does not belong to this model / corpus / settings."""


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a causal LM (``model.model.layers`` for the Llama family; found generically)."""
    try:
        from activations.capture import decoder_layers as _find  # the toolkit's one hook layer, when present
        return _find(model)
    except ImportError:  # pragma: no cover - activations/ ships with the toolkit
        pass
    for cand in (getattr(model, "model", None), getattr(model, "transformer", None), model):
        mods = getattr(cand, "layers", None) if cand is not None else None
        if isinstance(mods, nn.ModuleList) and len(mods):
            return mods
    raise ProbeError(f"cannot find the decoder blocks of {type(model).__name__}")


def hidden_of(output: Any) -> torch.Tensor:
    """The hidden state in a block output: a tensor (transformers 5) or the first element of a tuple."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find the hidden state in a block output of type {type(output).__name__}")


@dataclass
class ModelParts:
    """The pieces a lens needs: blocks, the model's own final norm and output head, and the real vocab size."""

    model: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module
    n_vocab: int            # real vocabulary (``len(tokenizer)``); logit rows beyond it are padding
    softcap: float | None

    @classmethod
    def of(cls, model: nn.Module, n_vocab: int | None = None) -> "ModelParts":
        layers = decoder_layers(model)
        base = getattr(model, "base_model", None) or getattr(model, "model", None)
        norm = getattr(base, "norm", None) or getattr(base, "final_layernorm", None) or getattr(base, "ln_f", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if norm is None or head is None:
            raise ProbeError(f"cannot find the final norm / output head of {type(model).__name__}")
        vocab = int(head.weight.shape[0])
        softcap = getattr(model.config, "final_logit_softcapping", None)
        return cls(model=model, layers=layers, final_norm=norm, lm_head=head,
                   n_vocab=min(int(n_vocab), vocab) if n_vocab else vocab, softcap=softcap)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_sites(self) -> int:
        return len(self.layers) + 1

    @property
    def d_model(self) -> int:
        return int(self.lm_head.weight.shape[1])

    def unembed(self, v: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` (float32) of residual vectors through the model's final norm and head."""
        w = self.lm_head.weight
        logits = self.lm_head(self.final_norm(v.to(w.dtype)))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)


def default_band(n_layers: int) -> tuple[int, int]:
    """Middle-to-late sites scaled to depth: ``round(0.25 L)`` .. ``round(0.9 L)`` (half rounds up)."""
    lo = int(math.floor(0.25 * n_layers + 0.5))
    hi = int(math.floor(0.9 * n_layers + 0.5))
    return max(lo, 0), max(min(hi, n_layers), max(lo, 0))


def parse_sites(spec: str | Sequence[int] | None, n_layers: int) -> tuple[int, ...]:
    """``default`` / None (the default band), ``all``, ``last``, or a comma list of sites and ranges ``a-b``."""
    if spec is None or (isinstance(spec, str) and spec.strip() in ("", "default")):
        lo, hi = default_band(n_layers)
        return tuple(range(lo, hi + 1))
    try:
        from activations.capture import parse_layers
    except ImportError:  # pragma: no cover
        parse_layers = None
    if parse_layers is not None:
        try:
            return tuple(parse_layers(spec, n_layers + 1))
        except MemtocError as exc:
            raise ProbeError(str(exc)) from None
    items = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]  # pragma: no cover
    out: set[int] = set()
    for item in items:
        lo, _, hi = item.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return tuple(sorted(out))


@contextmanager
def site_hooks(model: nn.Module, sites: Sequence[int],
               fn: Callable[[int, torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """``activations.capture.hook_sites`` over the distinct sites, with a probe error for an unknown site.

    ``fn(site, hidden)`` runs for every site during forwards; a tensor it returns replaces the hidden state.
    """
    from activations.capture import hook_sites

    n_blocks = len(decoder_layers(model))
    wanted = sorted(set(int(s) for s in sites))
    for site in wanted:
        if not 0 <= site <= n_blocks:
            raise ProbeError(f"unknown site {site}: this model has sites 0..{n_blocks}")
    with hook_sites(model, wanted, fn):
        yield


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Switch the model to eager attention for the duration (forward-mode AD and attention probabilities)."""
    cfg = model.config
    old = getattr(cfg, "_attn_implementation", None)
    if old == "eager":
        yield
        return
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter("eager")
    else:  # pragma: no cover - older transformers
        cfg._attn_implementation = "eager"
    try:
        yield
    finally:
        if callable(setter):
            setter(old)
        else:  # pragma: no cover
            cfg._attn_implementation = old


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """``requires_grad_(False)`` on every parameter for the duration (no weight gradients are ever built)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def base_model(model: nn.Module) -> nn.Module:
    """The decoder stack without the output head (``model.model`` for the Llama family)."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) and base is not model else getattr(model, "model", model)


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
    ranks = 1 + (z.unsqueeze(-2) > target.unsqueeze(-1)).sum(-1)      # [..., K]
    return ranks[..., 0] if scalar else ranks


def vocab_ordering(logits: torch.Tensor, n_vocab: int) -> torch.Tensor:
    """Real-vocabulary token ids from most to least likely (ties by id): the full ordering at a position."""
    z = logits[..., :n_vocab].float()
    return torch.sort(z, dim=-1, descending=True, stable=True).indices


# -- identity of a model -----------------------------------------------------------------------------------

def model_fingerprint(model: nn.Module) -> str:
    """A short identity of a model's weights, the same whatever float dtype it was loaded in.

    sha256 over every parameter's name, shape and a strided sample of its values rounded to bfloat16 (so a
    float32 and a float64 load of the same checkpoint agree, while any other checkpoint differs).
    """
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step][:4096].to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16)
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:32]
