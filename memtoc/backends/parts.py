"""The model's parts, found once: decoder blocks, final norm, output head, widths, sites, sub-block layout.

Sites follow the ``output_hidden_states`` numbering: site 0 is the embedding output, site ``s >= 1`` the output
of block ``s - 1``, and the last site is the *raw* (pre-final-norm) output of the last block, unlike
transformers' ``hidden_states[L]``. :func:`parse_sites` is the one parser of site selections. Sub-block modules
come from a per-architecture table (:data:`BLOCK_LAYOUTS`), so a known module shape is one table line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from memtoc.core.errors import MemtocError


class SiteSpecError(MemtocError):
    """A site (layer) selection or a model part that does not exist in this model."""


class UnsupportedArchitectureError(MemtocError):
    """A model whose blocks have no entry in the per-architecture table."""


# -- blocks ----------------------------------------------------------------------------------------------------

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
    raise SiteSpecError(f"cannot find the decoder blocks of {type(model).__name__} (no layers/h/blocks ModuleList)")


def n_sites(model: nn.Module) -> int:
    """Number of residual sites: the embedding output plus one per block."""
    return len(decoder_layers(model)) + 1


def residual_width(model: nn.Module) -> int:
    """Width ``d_model`` of the residual stream: the embedding width (a TransformerLens model: ``cfg.d_model``)."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        return int(get().weight.shape[1])
    cfg = getattr(model, "cfg", None)
    if cfg is not None and getattr(cfg, "d_model", None):
        return int(cfg.d_model)
    raise SiteSpecError(f"cannot find the residual width of {type(model).__name__}")


def base_model(model: nn.Module) -> nn.Module:
    """The decoder stack without the output head (``model.model`` for the Llama family)."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) and base is not model else getattr(model, "model", model)


# -- site selections ---------------------------------------------------------------------------------------------

_SITE_ITEM = re.compile(r"^(?:(?P<last>last)|(?P<lo>-?\d+)(?:-(?P<hi>-?\d+))?)$")


def parse_sites(spec: str | Sequence[int] | None, n_sites_: int, *, default: Sequence[int] | None = None,
                default_names: Sequence[str] = (), error: type[MemtocError] = SiteSpecError) -> tuple[int, ...]:
    """``all`` | ``last`` | comma list of site indices and inclusive ranges ``a-b`` -> sorted unique sites.

    ``None`` and the words in ``default_names`` give ``default`` (every site when None), so each command keeps
    its documented default; ``error`` is the error class raised.
    """
    last = n_sites_ - 1
    if spec is None or (isinstance(spec, str) and spec.strip() in default_names):
        return tuple(range(n_sites_)) if default is None else tuple(sorted(set(int(s) for s in default)))
    if isinstance(spec, str) and spec.strip() == "all":
        return tuple(range(n_sites_))
    items = spec.split(",") if isinstance(spec, str) else [str(s) for s in spec]
    out: set[int] = set()
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        m = _SITE_ITEM.match(item)
        if m is None:
            raise error(f"bad layer {item!r}: use all, last, N or N-M (site indices 0..{last})")
        if m.group("last"):
            lo = hi = last
        else:
            lo = int(m.group("lo"))
            hi = int(m.group("hi")) if m.group("hi") is not None else lo
        if lo > hi:
            raise error(f"bad layer range {item!r}: start after end")
        if lo < 0 or hi > last:
            raise error(f"unknown layer {item!r}: this model has sites 0..{last} (0 = embedding output, "
                        f"s = output of block s-1; {last} blocks)")
        out.update(range(lo, hi + 1))
    if not out:
        raise error("empty layer selection")
    return tuple(sorted(out))


# -- the per-architecture table of block internals -----------------------------------------------------------------

@dataclass(frozen=True)
class BlockLayout:
    """Attribute names of a pre-norm block's parts: ``h = x + [attn_out_norm](attn(input_norm(x)))``, then
    ``out = h + [mlp_out_norm](mlp(mlp_norm(h)))`` with a gated MLP ``down(act(gate(y)) * up(y))``.

    ``norm_offset`` is added to an RMSNorm's weight to give its gain (Gemma's norms scale by ``1 + weight``).
    """

    input_norm: str = "input_layernorm"
    attn: str = "self_attn"
    attn_out_norm: str | None = None
    mlp_norm: str = "post_attention_layernorm"
    mlp: str = "mlp"
    mlp_out_norm: str | None = None
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    act: str = "act_fn"
    norm_offset: float = 0.0

    def norms(self) -> tuple[str, ...]:
        return tuple(n for n in (self.input_norm, self.attn_out_norm, self.mlp_norm, self.mlp_out_norm) if n)

    def check(self, block: nn.Module, model_type: str) -> None:
        """Raise when ``block`` lacks a part this layout names (a table entry that does not fit the model)."""
        need = [*self.norms(), self.attn, self.mlp]
        missing = [n for n in need if not hasattr(block, n)]
        attn, mlp = getattr(block, self.attn, None), getattr(block, self.mlp, None)
        missing += [f"{self.attn}.{n}" for n in (self.q, self.k, self.v, self.o) if not hasattr(attn, n)]
        missing += [f"{self.mlp}.{n}" for n in (self.gate, self.up, self.down, self.act) if not hasattr(mlp, n)]
        if missing:
            raise UnsupportedArchitectureError(
                f"model type {model_type!r}: block {type(block).__name__} has no {', '.join(missing)} "
                "(the per-architecture table in memtoc/backends/parts.py does not fit this model)")


_PRE_NORM = BlockLayout()
_SANDWICH = BlockLayout(attn_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
                        mlp_out_norm="post_feedforward_layernorm", norm_offset=1.0)

#: ``config.model_type`` -> layout of its decoder blocks (gated-MLP pre-norm transformers).
BLOCK_LAYOUTS: dict[str, BlockLayout] = {
    "llama": _PRE_NORM,
    "mistral": _PRE_NORM,
    "qwen2": _PRE_NORM,
    "qwen3": _PRE_NORM,
    "gemma": BlockLayout(norm_offset=1.0),
    "gemma2": _SANDWICH,
    "gemma3_text": _SANDWICH,
}


def model_type(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__)


def block_layout(model: nn.Module) -> BlockLayout:
    """The table entry of ``model``'s architecture (checked against its first block)."""
    mtype = model_type(model)
    layout = BLOCK_LAYOUTS.get(mtype)
    if layout is None:
        raise UnsupportedArchitectureError(
            f"model type {mtype!r} has no entry in the per-architecture block table (memtoc/backends/parts.py "
            f"BLOCK_LAYOUTS; known: {', '.join(sorted(BLOCK_LAYOUTS))}); the detached lens cannot read its blocks")
    layout.check(decoder_layers(model)[0], mtype)
    return layout


# -- the parts -----------------------------------------------------------------------------------------------------

def params_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A short identity of a model's weights, the same whatever float dtype they were loaded in: sha256 over every
    parameter's name, shape and a strided sample of its values rounded to bfloat16."""
    h = hashlib.sha256()
    for name, p in sorted(named, key=lambda kv: kv[0]):
        flat = p.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step][:4096].to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16)
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:32]


@dataclass
class ModelParts:
    """The pieces analysis code reads: blocks, the model's own final norm and output head, the real vocab size.

    ``readout_only``: parts of a backend without the module tree (vLLM): ``model`` is a weightless skeleton and
    only ``final_norm`` and ``lm_head`` hold weights, so lenses that read captured states work and those that run
    the blocks do not. ``fingerprint_of`` computes :meth:`fingerprint` from the checkpoint's tensors."""

    model: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module
    n_vocab: int            # real vocabulary (``len(tokenizer)``); logit rows beyond it are padding
    softcap: float | None
    _layout: BlockLayout | None = field(default=None, repr=False)
    readout_only: bool = False
    fingerprint_of: Callable[[], str] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, model: nn.Module, n_vocab: int | None = None) -> "ModelParts":
        layers = decoder_layers(model)
        base = getattr(model, "base_model", None) or getattr(model, "model", None)
        norm = getattr(base, "norm", None) or getattr(base, "final_layernorm", None) or getattr(base, "ln_f", None)
        get_head = getattr(model, "get_output_embeddings", None)
        head = get_head() if callable(get_head) else None
        if norm is None or head is None:
            raise SiteSpecError(f"cannot find the final norm / output head of {type(model).__name__}")
        vocab = int(head.weight.shape[0])
        softcap = getattr(model.config, "final_logit_softcapping", None)
        return cls(model=model, layers=layers, final_norm=norm, lm_head=head,
                   n_vocab=min(int(n_vocab), vocab) if n_vocab else vocab, softcap=softcap)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def fingerprint(self) -> str:
        """:func:`params_fingerprint` of the model's weights (what a fitted lens records and is checked against)."""
        if self.fingerprint_of is not None:
            return self.fingerprint_of()
        return params_fingerprint(self.model.named_parameters())

    @property
    def n_sites(self) -> int:
        return len(self.layers) + 1

    @property
    def d_model(self) -> int:
        """Width of the residual stream (:func:`residual_width`)."""
        return residual_width(self.model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def model_type(self) -> str:
        return model_type(self.model)

    @property
    def architecture(self) -> str:
        """The model's class name (``LlamaForCausalLM``)."""
        return type(self.model).__name__

    @property
    def layout(self) -> BlockLayout:
        """The block layout of this architecture (raises :class:`UnsupportedArchitectureError` when unknown)."""
        if self._layout is None:
            self._layout = block_layout(self.model)
        return self._layout

    def block_part(self, k: int, role: str) -> nn.Module:
        """Block ``k``'s module of a layout role (``input_norm``, ``attn``, ``mlp_norm``, ``mlp``, ...)."""
        name = getattr(self.layout, role)
        return getattr(self.layers[k], name)

    def unembed(self, v: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., vocab]`` (float32) of residual vectors through the model's final norm and head."""
        w = self.lm_head.weight
        logits = self.lm_head(self.final_norm(v.to(w.dtype)))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)


# -- named hook points (TransformerLens names) ------------------------------------------------------------------

#: Hook-point names in TransformerLens spelling: ``blocks.L.hook_resid_pre`` = site L, ``blocks.L.hook_resid_post``
#: = site L + 1; ``ln_final.hook_normalized`` is the final-normed last site.
HOOK_POINT_KINDS = ("hook_resid_pre", "hook_resid_post", "hook_attn_out", "hook_mlp_out")
FINAL_NORM_HOOK = "ln_final.hook_normalized"
_HOOK_NAME = re.compile(r"^blocks\.(?P<block>\d+)\.(?P<kind>" + "|".join(HOOK_POINT_KINDS) + r")$")
#: per-head hook points: ``hook_pattern`` = attention probabilities [B, H, q, k] (read only; eager attention),
#: ``hook_z`` = each head's output before the output projection [B, S, H, d_head]
HEAD_HOOK_KINDS = ("hook_pattern", "hook_z")
_HEAD_NAME = re.compile(r"^blocks\.(?P<block>\d+)\.attn\.(?P<kind>" + "|".join(HEAD_HOOK_KINDS) + r")$")


@dataclass(frozen=True)
class HookPoint:
    """Where a named hook point lives in one model: ``module``, hook ``kind`` (``forward`` reads the module's
    output; ``pre`` its first argument) and the ``named_modules`` path (nnsight's)."""

    name: str
    module: nn.Module
    kind: str
    path: str
    read: str = "hidden"        # "hidden": the module's output (or first input); "weights": the attention weights
    heads: int | None = None    # per-head view: the value [B, S, H * d_head] is seen as [B, S, H, d_head]


def site_hook_name(site: int) -> str:
    """The TransformerLens name of a residual site: site 0 is ``blocks.0.hook_resid_pre``, site s >= 1
    ``blocks.{s-1}.hook_resid_post``."""
    return "blocks.0.hook_resid_pre" if int(site) == 0 else f"blocks.{int(site) - 1}.hook_resid_post"


def hook_point_site(name: str) -> int | None:
    """The residual site a resid name reads (None for attention / MLP outputs and the final norm)."""
    m = _HOOK_NAME.match(name)
    if m is None or m.group("kind") not in ("hook_resid_pre", "hook_resid_post"):
        return None
    b = int(m.group("block"))
    return b if m.group("kind") == "hook_resid_pre" else b + 1


def hook_point(model: nn.Module, name: str) -> HookPoint:
    """The module and hook kind behind a TransformerLens hook name in ``model``: a TransformerLens model's own
    ``HookPoint``, or a transformers model's blocks, attention / MLP (their contribution to the residual stream,
    after the output norm on sandwich-norm architectures) and final norm.
    """
    hook_dict = getattr(model, "hook_dict", None)
    if isinstance(hook_dict, dict):
        if name not in hook_dict:
            raise SiteSpecError(f"unknown hook point {name!r}: this TransformerLens model has no such hook")
        return HookPoint(name, hook_dict[name], "forward", name)
    names = {id(m): n for n, m in model.named_modules()}

    def point(module: nn.Module, kind: str) -> HookPoint:
        return HookPoint(name, module, kind, names.get(id(module), type(module).__name__))

    if name == FINAL_NORM_HOOK:
        return point(ModelParts.of(model).final_norm, "forward")
    m = _HEAD_NAME.match(name) or _HOOK_NAME.match(name)
    if m is None:
        raise SiteSpecError(f"unknown hook point {name!r}: use blocks.L.{{{','.join(HOOK_POINT_KINDS)}}} or "
                            f"{FINAL_NORM_HOOK}")
    layers = decoder_layers(model)
    b, kind = int(m.group("block")), m.group("kind")
    if not 0 <= b < len(layers):
        raise SiteSpecError(f"unknown hook point {name!r}: this model has blocks 0..{len(layers) - 1}")
    if kind in HEAD_HOOK_KINDS:
        layout = block_layout(model)
        attn = getattr(layers[b], layout.attn)
        if kind == "hook_pattern":
            return dataclasses.replace(point(attn, "forward"), read="weights")
        heads = int((getattr(base_model(model), "config", None) or model.config).num_attention_heads)
        return dataclasses.replace(point(getattr(attn, layout.o), "pre"), heads=heads)
    if kind == "hook_resid_pre":
        return point(layers[b], "pre")
    if kind == "hook_resid_post":
        return point(layers[b], "forward")
    layout = block_layout(model)
    role = (layout.attn_out_norm or layout.attn) if kind == "hook_attn_out" else (layout.mlp_out_norm or layout.mlp)
    return point(getattr(layers[b], role), "forward")


def hook_point_names(model: nn.Module, *, parts: bool = True) -> list[str]:
    """Every hook name :func:`hook_point` answers for ``model``: the residual sites in site order, then per block
    ``hook_attn_out`` / ``hook_mlp_out`` where the model has them."""
    n = len(decoder_layers(model))
    names = [site_hook_name(s) for s in range(n + 1)]
    if parts:
        try:
            for b in range(n):
                for k in ("hook_attn_out", "hook_mlp_out"):
                    hook_point(model, f"blocks.{b}.{k}")
                    names.append(f"blocks.{b}.{k}")
        except (UnsupportedArchitectureError, SiteSpecError):
            pass
    return names
