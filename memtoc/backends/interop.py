"""Existing model objects as backends: a transformers model + tokenizer, a TransformerLens ``HookedTransformer``,
an nnsight ``LanguageModel``.

Each becomes an :class:`~memtoc.backends.base.InspectableBackend` over the same seam and hook registrar as a
model loaded from a spec; its provenance says ``in-memory`` with a sha256 of the state dict.

- transformers: :class:`~memtoc.backends.hf.HFBackend` over the object itself.
- nnsight: the transformers module the ``LanguageModel`` wraps, so ``model.layers.3.output`` is site 4 here.
- TransformerLens: :class:`TLBackend` hooks ``HookedTransformer.blocks`` and its own hook points;
  :class:`TLCausalLM` gives it the decoder's call signature. Decoding recomputes the whole sequence at every
  token (its KV cache does not report its length to the hooks), so generation is quadratic in length.

Converters are a registry (:data:`CONVERTERS`) asked in order.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch import nn

from memtoc.backends.base import InterventionUnsupportedError
from memtoc.core.backend_kinds import ADAPTERS, GUIDED, INSPECT_CAPABILITIES
from memtoc.backends.hf import HFBackend
from memtoc.backends.hf_plans import TreeParts
from memtoc.backends.parts import ModelParts
from memtoc.core.errors import MemtocError


class InteropError(MemtocError):
    """A model object this toolkit cannot wrap (the message names its type and what is missing)."""


def weights_sha256(module: nn.Module) -> str:
    """sha256 of a module's state dict: every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        shape = t.shape
        t = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _in_memory(backend: HFBackend, module: nn.Module, kind: str) -> HFBackend:
    backend._fingerprint = {"method": "in-memory", "object": kind, "sha256": weights_sha256(module)}
    return backend


# -- TransformerLens -------------------------------------------------------------------------------------------

class _RecomputeCache:
    """The "cache" :class:`TLCausalLM` hands the decoder: the ids so far (the next forward recomputes them all)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def get_seq_length(self) -> int:
        return 0                    # every forward starts at column 0 (hooks see whole sequences)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.ids = self.ids[indices]


class TLCausalLM(nn.Module):
    """A ``HookedTransformer`` behind the call signature of a transformers causal LM (what ``GreedyDecoder`` and
    ``HFBackend.forward`` call): left-padded ``input_ids`` with an ``attention_mask``; TransformerLens derives the
    rotary positions from the mask."""

    def __init__(self, tl: nn.Module) -> None:
        super().__init__()
        self.tl = tl
        cfg = tl.cfg
        self.config = SimpleNamespace(num_hidden_layers=int(cfg.n_layers), model_type="hooked_transformer",
                                      final_logit_softcapping=getattr(cfg, "output_logits_soft_cap", None) or None)
        self.generation_config = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, use_cache: bool = False,
                past_key_values: _RecomputeCache | None = None, logits_to_keep: int = 0) -> SimpleNamespace:
        ids = input_ids if past_key_values is None else torch.cat([past_key_values.ids, input_ids], dim=1)
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask
        if mask.shape != ids.shape:
            raise InteropError(f"attention mask {tuple(mask.shape)} does not cover the ids {tuple(ids.shape)}")
        logits = self.tl(ids, attention_mask=mask)[:, -int(input_ids.shape[1]):]
        if logits_to_keep:
            logits = logits[:, -int(logits_to_keep):]
        return SimpleNamespace(logits=logits, past_key_values=_RecomputeCache(ids) if use_cache else None)


class TLParts(TreeParts):
    """Parts of a ``HookedTransformer``: ``blocks``, ``ln_final`` and ``unembed`` (``W_U``, ``b_U``)."""

    def unembed(self, v: torch.Tensor) -> torch.Tensor:
        tl = self.model
        logits = tl.unembed(tl.ln_final(v.to(self.dtype)))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()


class TLBackend(HFBackend):
    """A TransformerLens ``HookedTransformer`` (with its tokenizer) as an inspectable backend (module docstring).

    Capture and edits hook ``tl.blocks`` and its hook points through the one registrar; adapters (LoRA views)
    and guided decoding are transformers-only and not offered.
    """

    name = "transformer_lens"
    capabilities = INSPECT_CAPABILITIES - {ADAPTERS, GUIDED}

    def __init__(self, tl: nn.Module, tokenizer: Any = None, *, chat: bool | None = None) -> None:
        tokenizer = tokenizer if tokenizer is not None else getattr(tl, "tokenizer", None)
        if tokenizer is None:
            raise InteropError("this HookedTransformer has no tokenizer: pass tokenizer=")
        self.tl = tl
        super().__init__(TLCausalLM(tl), tokenizer, chat=chat)
        self.fast_decoding = False      # no shared-prefix cache to repeat: a static batch, as model.generate

    @property
    def parts(self) -> ModelParts:
        if self._parts is None:
            tl = self.tl
            n = min(len(self.tokenizer), int(tl.cfg.d_vocab))
            soft = getattr(tl.cfg, "output_logits_soft_cap", None)
            self._parts = TLParts(model=tl, layers=tl.blocks, final_norm=tl.ln_final, lm_head=tl.unembed,
                                  n_vocab=n, softcap=soft if soft and soft > 0 else None)
        return self._parts

    def with_adapter(self, path: Any) -> HFBackend:
        raise InterventionUnsupportedError("adapters apply to transformers models; load the model with hf")

    def trainable_copy(self) -> Any:
        raise InterventionUnsupportedError("fine-tuning runs on transformers models; load the model with hf")

    def provenance(self) -> dict[str, Any]:
        prov = super().provenance()
        prov.update({"backend": self.name, "architecture": str(getattr(self.tl.cfg, "original_architecture", None)
                                                               or type(self.tl).__name__),
                     "model": str(getattr(self.tl.cfg, "model_name", None) or type(self.tl).__name__)})
        return prov


# -- the converter registry ---------------------------------------------------------------------------------------

def _is_tl(obj: Any) -> bool:
    return type(obj).__module__.startswith("transformer_lens") and hasattr(obj, "hook_dict") and hasattr(obj, "blocks")


def _is_nnsight(obj: Any) -> bool:
    return type(obj).__module__.startswith("nnsight") and isinstance(getattr(obj, "_module", None), nn.Module)


def _is_transformers(obj: Any) -> bool:
    return isinstance(obj, nn.Module) and hasattr(obj, "config") and callable(getattr(obj, "generate", None))


def _from_tl(obj: Any, tokenizer: Any, chat: bool | None) -> HFBackend:
    return _in_memory(TLBackend(obj, tokenizer, chat=chat), obj, "transformer_lens.HookedTransformer")


def _from_nnsight(obj: Any, tokenizer: Any, chat: bool | None) -> HFBackend:
    tok = tokenizer if tokenizer is not None else getattr(obj, "tokenizer", None)
    if tok is None:
        raise InteropError("this nnsight LanguageModel has no tokenizer: pass tokenizer=")
    module = obj._module
    return _in_memory(HFBackend(module, tok, chat=chat), module, "nnsight.LanguageModel")


def _from_transformers(obj: Any, tokenizer: Any, chat: bool | None) -> HFBackend:
    if tokenizer is None:
        raise InteropError(f"a {type(obj).__name__} needs its tokenizer: load_backend(model, tokenizer=tok)")
    return _in_memory(HFBackend(obj, tokenizer, chat=chat), obj, f"transformers.{type(obj).__name__}")


#: ``(name, matches(obj), build(obj, tokenizer, chat))``, asked in order; the first match builds the backend.
CONVERTERS: list[tuple[str, Callable[[Any], bool], Callable[[Any, Any, bool | None], HFBackend]]] = [
    ("transformer_lens", _is_tl, _from_tl),
    ("nnsight", _is_nnsight, _from_nnsight),
    ("transformers", _is_transformers, _from_transformers),
]


def backend_from_object(obj: Any, tokenizer: Any = None, *, chat: bool | None = None) -> HFBackend:
    """The backend of an existing model object (module docstring); an unknown type is refused by name."""
    for _name, matches, build in CONVERTERS:
        if matches(obj):
            return build(obj, tokenizer, chat)
    raise InteropError(f"cannot use a {type(obj).__module__}.{type(obj).__name__} as a model: pass a spec string, "
                       "a transformers model with tokenizer=, a HookedTransformer or an nnsight LanguageModel")


# -- a transformers Llama as a HookedTransformer -----------------------------------------------------------------

def hooked_transformer_from_hf(model: nn.Module, tokenizer: Any) -> nn.Module:
    """A TransformerLens ``HookedTransformer`` with ``model``'s weights (Llama-family architectures).

    ``HookedTransformer.from_pretrained`` needs an official model name and refuses a GGUF checkpoint, so the
    loaded tensors go through TransformerLens' own ``convert_llama_weights`` with a config built from
    ``model.config``; no layer-norm folding or centering, so the converted model computes the same function.
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.loading_from_pretrained import _get_rope_theta
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    cfg = model.config
    if getattr(cfg, "model_type", None) != "llama":
        raise InteropError(f"model type {getattr(cfg, 'model_type', None)!r}: only the Llama path is converted "
                           "(memtoc.backends.interop.hooked_transformer_from_hf)")
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") not in ("default", None):
        raise InteropError(f"rope type {rope.get('rope_type')!r} is not converted (only plain rotary)")
    dtype = next(model.parameters()).dtype
    d_head = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    kv = int(cfg.num_key_value_heads)
    tl_cfg = HookedTransformerConfig(
        d_model=cfg.hidden_size, d_head=d_head, n_heads=cfg.num_attention_heads, d_mlp=cfg.intermediate_size,
        n_layers=cfg.num_hidden_layers, n_ctx=cfg.max_position_embeddings, eps=cfg.rms_norm_eps,
        d_vocab=cfg.vocab_size, act_fn=cfg.hidden_act, n_key_value_heads=kv if kv != cfg.num_attention_heads else None,
        normalization_type="RMS", positional_embedding_type="rotary", rotary_adjacent_pairs=False,
        rotary_dim=d_head, rotary_base=_get_rope_theta(cfg), final_rms=True, gated_mlp=True,
        original_architecture="LlamaForCausalLM", dtype=dtype, device=str(next(model.parameters()).device),
        default_prepend_bos=False, tokenizer_prepends_bos=False)
    tl = HookedTransformer(tl_cfg, tokenizer=tokenizer, move_to_device=False)
    state = convert_llama_weights(model, tl_cfg)
    tl.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                   fold_value_biases=False, refactor_factored_attn_matrices=False)
    return tl.eval()
