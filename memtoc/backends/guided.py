"""Schema-constrained and sampled decoding: ``generate_guided`` of the hf and vllm backends.

Greedy unconstrained generation stays on each backend's ``generate_formatted`` (the hf backend's own KV-cache
decoder). This module adds the two things that decoder does not do, for the agent tasks (:mod:`memtoc.agent`):

- **constraint**: a row with a JSON schema can only produce a JSON document valid under it. On the hf
  backend, an xgrammar grammar compiled from the schema masks the logits at every step
  (``xgrammar.contrib.hf.LogitsProcessor``, one compiled grammar per row); on the vllm backend, vLLM's own
  guided decoding (``GuidedDecodingParams(json=...)``, ``StructuredOutputsParams`` on newer vLLM), which is
  xgrammar by default there too. Whitespace is fixed (``any_whitespace=False``) so the decoder cannot loop
  on JSON whitespace (the failure App. G reports for one guided cell);
- **sampling**: ``Sampling(temperature, seed)``; temperature 0 is greedy. The hf path seeds torch before
  each call, so a repetition is reproducible for the same batch composition (batching changes the draws).

Why xgrammar (see docs/agent.md): it is the library vLLM itself uses for guided decoding, so the two backends
constrain with the same grammar engine; it has CPU wheels; its per-token mask is a precompiled bitmask
(outlines' regex-FSM index is built per schema in Python and is slower to compile; lm-format-enforcer walks a
character-level parser per token and has the highest per-step cost).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from memtoc.backends.base import Generation, GenerationConfig, cut_at_final_line, trim_ids_to_text
from memtoc.errors import MemtocError

__all__ = ["Sampling", "GREEDY", "call_schema", "hf_generate_guided", "vllm_request_params",
           "ConstrainedDecodingUnavailable"]


class ConstrainedDecodingUnavailable(MemtocError):
    """Constrained decoding was asked for and its library is not installed."""


@dataclass(frozen=True)
class Sampling:
    """Decoding of a guided call: greedy when ``temperature`` is 0."""

    temperature: float = 0.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


GREEDY = Sampling()


def call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call of ``tool`` (ToolHop/OpenAI form): ``{"name": <the name>, "arguments":
    <an object valid under the tool's parameters>}``."""
    return {"type": "object", "properties": {"name": {"const": tool["name"]},
                                             "arguments": tool.get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ConstrainedDecodingUnavailable(
            "constrained decoding on the hf backend needs xgrammar: pip install 'memtoc[agent]' (or xgrammar)"
        ) from None
    return xgrammar


class _Compiler:
    """One xgrammar compiler per backend, compiled grammars cached by schema text."""

    def __init__(self, backend: Any) -> None:
        xgr = _xgrammar()
        vocab = int(backend.model.get_output_embeddings().weight.shape[0])
        info = xgr.TokenizerInfo.from_huggingface(backend.tokenizer, vocab_size=vocab,
                                                  stop_token_ids=sorted(backend._eos_ids()))
        self.compiler = xgr.GrammarCompiler(info)
        self.cache: dict[str, Any] = {}

    def compile(self, schema: Mapping[str, Any]) -> Any:
        key = json.dumps(schema)          # key order kept: the grammar emits properties in this order
        if key not in self.cache:
            self.cache[key] = self.compiler.compile_json_schema(key, any_whitespace=False)
        return self.cache[key]


def hf_generate_guided(backend: Any, texts: Sequence[str], config: GenerationConfig,
                       schemas: Sequence[Mapping[str, Any] | None], sampling: Sampling) -> list[Generation]:
    """``generate_guided`` of the hf backend: ``model.generate`` with an xgrammar logits processor on the rows
    that have a schema (rows with and without one go in separate calls)."""
    import torch

    out: list[Generation | None] = [None] * len(texts)
    groups: dict[bool, list[int]] = {}
    for i, s in enumerate(schemas):
        groups.setdefault(s is not None, []).append(i)
    for constrained, idx in groups.items():
        processors = None
        if constrained:
            comp = getattr(backend, "_grammar_compiler", None)
            if comp is None:
                comp = backend._grammar_compiler = _Compiler(backend)
            xgr = _xgrammar()
            processors = [xgr.contrib.hf.LogitsProcessor([comp.compile(schemas[i]) for i in idx])]
        batch = backend.encode_formatted([texts[i] for i in idx])
        kwargs: dict[str, Any] = {"max_new_tokens": int(config.max_new_tokens),
                                  "pad_token_id": backend.tokenizer.pad_token_id,
                                  "eos_token_id": sorted(backend._eos_ids())}
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=float(sampling.temperature), top_p=1.0, top_k=0)
            torch.manual_seed(int(sampling.seed))
        with torch.inference_mode():
            seqs = backend.model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                          logits_processor=processors, **kwargs)
        width = batch.input_ids.shape[1]
        eos = backend._eos_ids()
        for j, i in enumerate(idx):
            ids = [int(t) for t in seqs[j, width:].tolist()]
            stop = "max_tokens"
            cut = next((k for k, t in enumerate(ids) if t in eos), None)
            if cut is not None:
                ids, stop = ids[:cut], "eos"
            pad = backend.tokenizer.pad_token_id
            while ids and ids[-1] == pad and pad not in eos:
                ids.pop()
            text = backend.tokenizer.decode(ids, skip_special_tokens=True)
            if config.stop_at_final_line:
                text, was_cut = cut_at_final_line(text)
                if was_cut:
                    stop, ids = "final_line", trim_ids_to_text(backend.tokenizer, ids, text)
            out[i] = Generation(text=text, n_prompt_tokens=len(batch.rows[j]), n_new_tokens=len(ids),
                                stop_reason=stop, token_ids=tuple(ids))
    return [g for g in out if g is not None]


def vllm_request_params(config: GenerationConfig, schema: Mapping[str, Any] | None, sampling: Sampling,
                        base: Mapping[str, Any]) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments of one guided request: ``base`` (the backend's greedy
    parameters) with the sampling and, when ``schema`` is given, vLLM's guided decoding on that JSON schema."""
    params = dict(base)
    params["temperature"] = 0.0 if sampling.greedy else float(sampling.temperature)
    params["seed"] = int(sampling.seed)
    if schema is not None:
        try:
            from vllm.sampling_params import GuidedDecodingParams
        except ImportError:
            GuidedDecodingParams = None  # noqa: N806
        if GuidedDecodingParams is not None:
            params["guided_decoding"] = GuidedDecodingParams(json=dict(schema), whitespace_pattern=r"[ ]?")
        else:   # vLLM >= 0.11 renamed guided decoding to structured outputs
            from vllm.sampling_params import StructuredOutputsParams

            params["structured_outputs"] = StructuredOutputsParams(json=dict(schema), whitespace_pattern=r"[ ]?")
    return params
