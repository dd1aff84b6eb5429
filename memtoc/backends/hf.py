"""Hugging Face transformers backend: batched greedy generation with left padding and the KV cache.

The inspectable backend: capture and edits attach to the decoder blocks through the one registrar
(``memtoc.backends.hooks``); ``with_adapter`` and ``trainable_copy`` never mutate the shared model.
"""

from __future__ import annotations

import hashlib
import platform
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from memtoc.backends.base import Generation, SiteInfo, cut_at_final_line, final_line_end
from memtoc.core.backend_kinds import INSPECT_CAPABILITIES
from memtoc.core.runtime import GenerationConfig, row_seed
from memtoc.backends.base import trim_ids_to_text as _trim_ids_to_text
from memtoc.backends.chat import Conversation, FormatsPrompts, uses_chat_template
from memtoc.backends.decode import GreedyDecoder, RowSampler
from memtoc.backends.models import ModelSource, resolve_model, weights_fingerprint
from memtoc.backends.hf_plans import TreeParts
from memtoc.backends.tokens import TokenBatch, encode_texts
from memtoc.core.errors import MemtocError, ModelNotAvailableError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelNotAvailableError("--device cuda was asked for but torch sees no CUDA device")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise MemtocError(f"unknown dtype {dtype!r}; choose from auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _load_path(source: ModelSource) -> tuple[str, dict[str, Any]]:
    """Where transformers reads ``source`` from: a GGUF's cached safetensors conversion (``memtoc.backends.
    gguf_cache``: the same weights, read far faster), or the GGUF itself when the cache cannot be written."""
    if source.kind == "gguf":
        from memtoc.backends.gguf_cache import model_dir

        try:
            return model_dir(source), {"local_files_only": True}
        except OSError:
            return source.path, {"local_files_only": True, "gguf_file": source.gguf_file}
    return source.path, {"local_files_only": source.local}


class HFBackend(FormatsPrompts):
    """transformers causal LM from ``default``, a GGUF file, a local directory or a hub id."""

    name = "hf"
    capabilities = INSPECT_CAPABILITIES

    def __init__(self, model: Any, tokenizer: Any, *, source: ModelSource | None = None,
                 chat: bool | None = None, adapter: str | None = None) -> None:
        self.model = model.eval()
        self.adapter = adapter          # the adapter directory merged into this view's model, if any
        self._parts: TreeParts | None = None
        self.tokenizer = tokenizer
        self.source = source
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.chat = uses_chat_template(tokenizer) if chat is None else chat
        self._fingerprint: dict[str, Any] | None = None
        #: Shared-prefix prefill and row compaction (``memtoc.backends.decode``); off = a static batch as
        #: ``model.generate`` runs it. Same tokens either way (a switch for benchmarks), as for:
        self.fast_decoding = True
        #: edited calls share the prefix up to the first edited token (off: the full left-padded prefill).
        self.share_edited_prefix = True

    @classmethod
    def load(cls, spec: str, *, device: str = "auto", dtype: str = "auto", chat: bool | None = None) -> "HFBackend":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = resolve_model(spec)
        dev = pick_device(device)
        path, kwargs = _load_path(source)
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, dev), **kwargs)
        except OSError as exc:
            raise ModelNotAvailableError(f"could not load model {spec!r}: {exc}") from exc
        return cls(model.to(dev), tokenizer, source=source, chat=chat)

    # -- prompts -------------------------------------------------------------------------------------------
    def encode_formatted(self, texts: Sequence[str]) -> TokenBatch:
        """Already formatted strings as a :class:`TokenBatch` (the one tokenization rule, ``chat``)."""
        return encode_texts(self.tokenizer, texts, chat=self.chat, device=self.device)

    # -- model internals and views ---------------------------------------------------------------------------
    @property
    def parts(self) -> TreeParts:
        """Blocks, final norm, output head, d_model and sites of the model (found once)."""
        if self._parts is None:
            self._parts = TreeParts.of(self.model, len(self.tokenizer))
        return self._parts

    @property
    def site_info(self) -> SiteInfo:
        """Layers, residual width, architecture, device and dtype (from :attr:`parts`)."""
        p = self.parts
        return SiteInfo(n_layers=p.n_layers, d_model=p.d_model, model_type=p.model_type, device=str(p.device),
                        dtype=str(p.dtype).replace("torch.", ""))

    def with_adapter(self, path: str | Path) -> "HFBackend":
        """A backend over this model with the LoRA adapter at ``path`` merged in: the adapted weights are the
        view's own copies, every other weight is shared read-only (``adapters.adapter_view``)."""
        from memtoc.backends.adapters import adapter_view

        view = HFBackend(adapter_view(self.model, path), self.tokenizer, source=self.source, chat=self.chat,
                         adapter=str(path))
        view.fast_decoding = self.fast_decoding
        view.share_edited_prefix = self.share_edited_prefix
        view._fingerprint = self._fingerprint
        return view

    def trainable_copy(self) -> torch.nn.Module:
        """A copy of the model to train adapters on, its weights shared and frozen (the served model never changes)."""
        from memtoc.backends.adapters import frozen_copy

        return frozen_copy(self.model)

    def intervene(self, batch: Mapping[str, torch.Tensor], plan: Any) -> Any:
        """A plan (``memtoc.backends.plans``) as hooks on this model for the forwards inside (``hf_plans``)."""
        return self.parts.intervene(batch, plan)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- generation ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Conversation], config: GenerationConfig, *,
                 edit: Any = None) -> list[Generation]:
        if not prompts:
            return []
        return self.generate_formatted([self.format_prompt(p) for p in prompts], config, edit=edit)

    @torch.inference_mode()
    def generate_formatted(self, texts: Sequence[str], config: GenerationConfig, *,
                           edit: Any = None, constraint: Any = None) -> list[Generation]:
        """``generate`` for already formatted strings, tokenized as ``encode`` does. ``constraint``: per-row logit
        masks (:class:`memtoc.backends.guided.GrammarConstraint`)."""
        if not texts:
            return []
        batch = self.encode_formatted(texts)
        rows = [list(r) for r in batch.rows]
        decoder = GreedyDecoder(self.model, pad_id=self.tokenizer.pad_token_id, eos_ids=self._eos_ids())

        def final_line_done(ids: list[int]) -> bool:
            return final_line_end(self.tokenizer.decode(ids, skip_special_tokens=True)) is not None

        is_done = final_line_done if config.stop_at_final_line else None
        sampler = None
        if config.sampling:
            seeds = config.row_seeds if config.row_seeds is not None else [row_seed(0, t) for t in texts]
            if len(seeds) != len(texts):
                raise ValueError(f"row_seeds has {len(seeds)} seeds for {len(texts)} prompts")
            sampler = RowSampler(seeds, temperature=config.temperature, top_p=config.top_p)
        with ExitStack() as stack:
            state, share = None, False
            if edit is not None:
                # the prefix is shared up to the first edited token; rows leave with the hooks following
                plan = edit.make_plan(self, batch)
                state = stack.enter_context(self.intervene(batch, plan))
                share = self.fast_decoding and self.share_edited_prefix
            decoded = decoder.decode(rows, config.max_new_tokens, is_done=is_done, fast=self.fast_decoding,
                                     share_prefix=share if edit is not None else None,
                                     prefix_limit=min(plan.row_prefix_limits(), default=0) if share else None,
                                     on_prefix=state.use_prefix if share else None,
                                     row_prefix_limits=plan.row_prefix_limits() if share else None,
                                     on_compact=state.select_rows if state is not None else None,
                                     sampler=sampler, constraint=constraint)
        results = []
        for row, d in zip(rows, decoded):
            ids, stop = d.ids, d.stop
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if config.stop_at_final_line:
                text, cut = cut_at_final_line(text)
                if cut:
                    stop = "final_line"
                    ids = _trim_ids_to_text(self.tokenizer, ids, text)
            results.append(Generation(text=text, n_prompt_tokens=len(row), n_new_tokens=len(ids),
                                      stop_reason=stop, token_ids=tuple(ids)))
        return results

    def generate_guided(self, texts: Sequence[str], config: GenerationConfig, *,
                        schemas: Sequence[Any] | None = None, sampling: Any = None) -> list[Generation]:
        """Already formatted strings, each row optionally constrained to a JSON schema (xgrammar) and decoded
        greedily or sampled (``memtoc.backends.guided.Sampling``); see :mod:`memtoc.backends.guided`."""
        from memtoc.backends.guided import GREEDY, hf_generate_guided

        if not texts:
            return []
        return hf_generate_guided(self, texts, config, list(schemas) if schemas is not None else [None] * len(texts),
                                  sampling or GREEDY)

    def _eos_ids(self) -> set[int]:
        ids = set()
        for src in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(x) for x in src)
        return ids

    # -- provenance ----------------------------------------------------------------------------------------
    def provenance(self) -> dict[str, Any]:
        import transformers

        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.source) if self.source else {"method": "in-memory"}
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return {
            "backend": self.name,
            "model": self.source.spec if self.source else type(self.model).__name__,
            "model_source": self.source.kind if self.source else "in-memory",
            "model_path": self.source.path if self.source else None,
            "gguf_file": self.source.gguf_file if self.source else None,
            "weights": self._fingerprint,
            "architecture": type(self.model).__name__,
            "n_layers": int(self.model.config.num_hidden_layers),
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "device": str(self.device),
            "chat_template": self.chat,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if self.chat else None,
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": len(self.tokenizer),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
        }

    # -- forward pass with capture / edit hooks (activations/, probes/, steering/) -----------------------------
    @torch.inference_mode()
    def forward(self, prompts: Sequence[Conversation], *, capture: Any = None, edit: Any = None,
                continuations: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """One batched forward pass over prompts (templated, left padded) with capture / edit hooks, the edit first
        so a capture reads the edited stream. ``continuations`` appends token ids after each prompt, read
        teacher-forced. Returns the batch (``input_ids``, ``attention_mask``, ``position_ids``, ``batch``) and
        ``last_logits`` ``[batch, vocab]`` after each row's last token.
        """
        import inspect

        if not prompts:
            raise ValueError("forward needs at least one prompt")
        batch = self.encode(prompts)
        if continuations is not None:
            batch = batch.with_continuations(continuations)
        mask = batch["attention_mask"]
        position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
        kwargs: dict[str, Any] = {"position_ids": position_ids, "use_cache": False}
        if "logits_to_keep" in inspect.signature(self.model.forward).parameters:
            kwargs["logits_to_keep"] = 1
        with ExitStack() as stack:
            if edit is not None:
                stack.enter_context(self.intervene(batch, edit.make_plan(self, batch)))
            if capture is not None:
                stack.enter_context(capture.attach(self, batch))
            out = self.model(input_ids=batch["input_ids"], attention_mask=mask, **kwargs)
        return {"input_ids": batch["input_ids"], "attention_mask": mask, "position_ids": position_ids,
                "last_logits": out.logits[:, -1], "batch": batch}
