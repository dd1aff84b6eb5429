"""vLLM backend: the same greedy answers as the HF backend, from vLLM's batched engine on a CUDA GPU.

Thin on purpose. Prompts are formatted by ``memtoc.backends.chat`` (the function ``HFBackend`` uses) and
tokenized the way ``HFBackend.encode`` tokenizes them, then sent to vLLM as token ids, so both backends
condition on the same tokens. vLLM decodes greedily to the token budget (no stop strings); the text is then
decoded from the returned token ids and cut after the completed FINAL line by ``cut_at_final_line``, the
code path HF uses, so identical tokens give identical strings, token ids and stop reasons.

A text backend only (``capabilities``: generation over conversations): no forward pass, no capture, no edits,
no parts, no adapter views -- it is not an ``InspectableBackend``, and an edit handed to ``generate`` is refused
with a ``MemtocError`` (edits hook the decoder blocks of a transformers module tree; use the hf backend).
``vllm`` is imported inside ``load``; without it the toolkit still imports and the hf backend works.
"""

from __future__ import annotations

import hashlib
import platform
from typing import Any, Sequence

import copy

from memtoc.backends.base import (TEXT_CAPABILITIES, Generation, GenerationConfig, InterventionUnsupportedError,
                                  cut_at_final_line, trim_ids_to_text)
from memtoc.backends.chat import Conversation, encode_formatted, format_conversation, uses_chat_template
from memtoc.backends.models import ModelSource, resolve_model, weights_fingerprint
from memtoc.core.errors import MemtocError, ModelNotAvailableError

VLLM_INSTALL = "pip install 'memtoc-toolkit[vllm]'  (or, in a checkout: pip install '.[vllm]')"
# --dtype values vLLM accepts; float64 (an hf-backend option) has no vLLM kernels.
VLLM_DTYPES = ("auto", "float16", "bfloat16", "float32")
SEED = 0


def build_requests(tokenizer: Any, prompts: Sequence[Conversation], config: GenerationConfig,
                   chat: bool) -> tuple[list[str], dict[str, Any]]:
    """The formatted prompt strings and the ``vllm.SamplingParams`` keyword arguments for one batch.

    Greedy (temperature 0) to ``config.max_new_tokens``; no stop strings: the FINAL-line cut is applied to the
    decoded text afterwards, exactly as for the HF backend.
    """
    texts = [format_conversation(tokenizer, p, chat=chat) for p in prompts]
    return texts, sampling_params(config)


def sampling_params(config: GenerationConfig) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments: greedy to the budget, no stop strings."""
    return {"temperature": 0.0, "max_tokens": int(config.max_new_tokens), "seed": SEED, "skip_special_tokens": True}


def to_generation(tokenizer: Any, output: Any, n_prompt_tokens: int, config: GenerationConfig) -> Generation:
    """One ``CompletionOutput`` (``.token_ids``, ``.finish_reason``, ``.stop_reason``) as a ``Generation``.

    vLLM keeps the token that stopped a sequence (EOS or a stop token id) in ``token_ids``; HF cuts it, so it
    is dropped here. The text is decoded from the ids with the call HF uses (``skip_special_tokens=True``)
    rather than taken from vLLM's incremental detokenizer, so both backends agree on every tokenizer.
    """
    ids = [int(t) for t in output.token_ids]
    stop = "max_tokens"
    if output.finish_reason == "stop":
        stop = "eos"
        # stop_reason is None for EOS and the token id for a stop token; a string would be a stop string,
        # which this backend never sends (and which vLLM does not keep in token_ids).
        if ids and not isinstance(getattr(output, "stop_reason", None), str):
            ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if config.stop_at_final_line:
        text, cut = cut_at_final_line(text)
        if cut:
            stop = "final_line"
            ids = trim_ids_to_text(tokenizer, ids, text)
    return Generation(text=text, n_prompt_tokens=int(n_prompt_tokens), n_new_tokens=len(ids), stop_reason=stop,
                      token_ids=tuple(ids))


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ModelNotAvailableError(
            f"the vllm backend needs the vllm package, which could not be imported ({exc}); install it on a "
            f"machine with an NVIDIA GPU: {VLLM_INSTALL}. Without a GPU use --backend hf.") from exc
    return vllm


class VLLMBackend:
    """A ``vllm.LLM`` behind the text-backend seam (greedy generation over conversations; no interventions)."""

    name = "vllm"
    capabilities = TEXT_CAPABILITIES
    _preformatted = False

    def __init__(self, llm: Any, *, source: ModelSource | None = None, chat: bool | None = None,
                 dtype: str = "auto") -> None:
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.source = source
        self.chat = uses_chat_template(self.tokenizer) if chat is None else chat
        self.requested_dtype = dtype
        self._fingerprint: dict[str, Any] | None = None

    @classmethod
    def load(cls, spec: str, *, dtype: str = "auto", tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
             gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, chat: bool | None = None,
             **llm_kwargs: Any) -> "VLLMBackend":
        """Build a ``vllm.LLM`` for ``default``, a .gguf file, a local directory or a hub id.

        ``llm_kwargs`` go to ``vllm.LLM`` as they are (``tokenizer=`` among them: vLLM advises a GGUF's base
        model tokenizer over its own conversion of the GGUF vocabulary; the default here is the GGUF file,
        which is what the hf backend loads too).
        """
        vllm = _import_vllm()
        import torch

        if not torch.cuda.is_available():
            raise ModelNotAvailableError("the vllm backend needs a CUDA GPU and torch sees none here; "
                                         "use --backend hf instead (it runs on the CPU)")
        if dtype not in VLLM_DTYPES:
            raise MemtocError(f"--dtype {dtype} is not available on the vllm backend; choose from "
                              f"{', '.join(VLLM_DTYPES)}")
        source = resolve_model(spec)
        if source.kind == "gguf":
            # vLLM reads a GGUF model from the file itself, and converts its tokenizer when given the file.
            model = tokenizer = str(source.weight_files()[0])
        else:
            model = tokenizer = source.path
        kwargs: dict[str, Any] = {"model": model, "tokenizer": tokenizer, "dtype": dtype,
                                  "tensor_parallel_size": tensor_parallel_size,
                                  "pipeline_parallel_size": pipeline_parallel_size,
                                  "gpu_memory_utilization": gpu_memory_utilization, "seed": SEED}
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs)
        try:
            llm = vllm.LLM(**kwargs)
        except OSError as exc:
            raise ModelNotAvailableError(f"could not load model {spec!r} with vllm: {exc}") from exc
        return cls(llm, source=source, chat=chat, dtype=dtype)

    # -- prompts -------------------------------------------------------------------------------------------
    def format_prompt(self, conversation: Conversation) -> str:
        """A conversation (a plain string = one user message) through the chat template, or the raw text; on a
        :meth:`preformatted` view a string is returned as it is."""
        if self._preformatted and isinstance(conversation, str):
            return conversation
        return format_conversation(self.tokenizer, conversation, chat=self.chat)

    def preformatted(self) -> "VLLMBackend":
        """A view (same engine) whose string prompts are already the exact strings the model is conditioned on."""
        view = copy.copy(self)
        view._preformatted = True
        return view

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Conversation], config: GenerationConfig, *,
                 edit: Any = None) -> list[Generation]:
        return self.generate_formatted([self.format_prompt(p) for p in prompts], config, edit=edit)

    def generate_formatted(self, texts: Sequence[str], config: GenerationConfig, *,
                           edit: Any = None) -> list[Generation]:
        """``generate`` for already formatted strings (a conversation rendered through the chat template, as
        the code-executor agent loop sends), tokenized as ``HFBackend.generate_formatted`` tokenizes them."""
        if edit is not None:
            raise InterventionUnsupportedError("edits run on the hf backend for now: the vllm backend has no hooks "
                                               "into the decoder blocks; rerun with --backend hf")
        if not texts:
            return []
        if config.sampling:
            raise MemtocError("sampled decoding (temperature > 0) runs on the hf backend only; use --backend hf")
        from vllm import SamplingParams

        token_prompts = encode_formatted(self.tokenizer, list(texts), chat=self.chat)
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in token_prompts],
                                 SamplingParams(**sampling_params(config)),
                                 use_tqdm=False)
        if len(outs) != len(texts):
            raise MemtocError(f"vllm returned {len(outs)} outputs for {len(texts)} prompts")
        results = []
        for ids, out in zip(token_prompts, outs):
            n_prompt = len(out.prompt_token_ids) if out.prompt_token_ids is not None else len(ids)
            results.append(to_generation(self.tokenizer, out.outputs[0], n_prompt, config))
        return results

    def generate_guided(self, texts: Sequence[str], config: GenerationConfig, *,
                        schemas: Sequence[Any] | None = None, sampling: Any = None) -> list[Generation]:
        """Already formatted strings, each row optionally constrained to a JSON schema by vLLM's own guided
        decoding, greedy or sampled (:mod:`memtoc.backends.guided`); one ``SamplingParams`` per request."""
        from vllm import SamplingParams

        from memtoc.backends.guided import GREEDY, vllm_request_params

        if not texts:
            return []
        rows = list(schemas) if schemas is not None else [None] * len(texts)
        base = sampling_params(config)
        params = [SamplingParams(**vllm_request_params(config, s, sampling or GREEDY, base)) for s in rows]
        token_prompts = encode_formatted(self.tokenizer, list(texts), chat=self.chat)
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in token_prompts], params, use_tqdm=False)
        if len(outs) != len(texts):
            raise MemtocError(f"vllm returned {len(outs)} outputs for {len(texts)} prompts")
        return [to_generation(self.tokenizer, out.outputs[0],
                              len(out.prompt_token_ids) if out.prompt_token_ids is not None else len(ids), config)
                for ids, out in zip(token_prompts, outs)]

    # -- provenance ----------------------------------------------------------------------------------------
    def _model_config(self) -> Any:
        engine = getattr(self.llm, "llm_engine", None)
        return getattr(engine, "model_config", None) or getattr(self.llm, "model_config", None)

    def provenance(self) -> dict[str, Any]:
        import torch
        import transformers
        import vllm

        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.source) if self.source else {"method": "in-memory"}
        mcfg = self._model_config()
        hf_config = getattr(mcfg, "hf_config", None)
        archs = getattr(hf_config, "architectures", None) or []
        n_layers = getattr(hf_config, "num_hidden_layers", None)
        engine_dtype = getattr(mcfg, "dtype", None)   # what "auto" resolved to
        dtype = str(engine_dtype).replace("torch.", "") if engine_dtype is not None else self.requested_dtype
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return {
            "backend": self.name,
            "model": self.source.spec if self.source else type(self.llm).__name__,
            "model_source": self.source.kind if self.source else "in-memory",
            "model_path": self.source.path if self.source else None,
            "gguf_file": self.source.gguf_file if self.source else None,
            "weights": self._fingerprint,
            "architecture": archs[0] if archs else None,
            "n_layers": int(n_layers) if n_layers is not None else None,
            "dtype": dtype,
            "device": "cuda",
            "chat_template": self.chat,
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if self.chat else None,
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": len(self.tokenizer),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "vllm": getattr(vllm, "__version__", None), "python": platform.python_version()},
        }
