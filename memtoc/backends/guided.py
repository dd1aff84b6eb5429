"""Schema-constrained and sampled decoding: ``generate_guided`` of the hf and vllm backends, for the agent tasks.

- **constraint**: a row with a JSON schema can only produce a JSON document valid under it. On hf an xgrammar
  grammar masks the logits in the backend's own decoding loop (:class:`GrammarConstraint`, one matcher per
  row); on vllm, vLLM's own guided decoding (xgrammar too). Whitespace is fixed (``any_whitespace=False``) so
  the decoder cannot loop on JSON whitespace.
- **sampling**: ``Sampling(temperature, seed)``; temperature 0 is greedy. On hf each row's generator is seeded
  from ``seed`` and the row's text, so a repetition is reproducible whatever else is in the batch.

xgrammar because vLLM uses it (both backends constrain with one engine), it has CPU wheels and its per-token
mask is a precompiled bitmask (docs/agent.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from memtoc.backends.base import Generation
from memtoc.core.runtime import GenerationConfig
from memtoc.core.runtime import row_seed
from memtoc.core.errors import MemtocError

__all__ = ["Sampling", "GREEDY", "call_schema", "GrammarCompiler", "GrammarConstraint", "hf_generate_guided",
           "vllm_request_params", "ConstrainedDecodingUnavailable"]


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


class GrammarCompiler:
    """One xgrammar compiler per backend, compiled grammars cached by schema text."""

    def __init__(self, backend: Any) -> None:
        xgr = _xgrammar()
        self.vocab_size = int(backend.model.get_output_embeddings().weight.shape[0])
        info = xgr.TokenizerInfo.from_huggingface(backend.tokenizer, vocab_size=self.vocab_size,
                                                  stop_token_ids=sorted(backend._eos_ids()))
        self.compiler = xgr.GrammarCompiler(info)
        self.cache: dict[str, Any] = {}

    @classmethod
    def of(cls, backend: Any) -> "GrammarCompiler":
        """The backend's compiler (made on first use and kept on the backend)."""
        comp = getattr(backend, "_grammar_compiler", None)
        if comp is None:
            comp = backend._grammar_compiler = cls(backend)
        return comp

    def compile(self, schema: Mapping[str, Any]) -> Any:
        key = json.dumps(schema)          # key order kept: the grammar emits properties in this order
        if key not in self.cache:
            self.cache[key] = self.compiler.compile_json_schema(key, any_whitespace=False)
        return self.cache[key]


class GrammarConstraint:
    """Per-row grammar masks for the hf backend's decoding loop (``memtoc.backends.decode``).

    ``mask(logits, rows)`` sets every token the row's grammar forbids to -inf (rows without a grammar, and rows
    whose grammar has terminated, are left alone); ``accept(row, token)`` advances the row's matcher. ``rows``
    names each batch row's original row, so the masks follow the batch as finished rows leave it.
    """

    def __init__(self, grammars: Sequence[Any | None], vocab_size: int) -> None:
        self._xgr = _xgrammar()
        self.matchers = [self._xgr.GrammarMatcher(g) if g is not None else None for g in grammars]
        self.vocab_size = int(vocab_size)

    def mask(self, logits: Any, rows: Sequence[int]) -> Any:
        live = [b for b, r in enumerate(rows) if self.matchers[r] is not None and not self.matchers[r].is_terminated()]
        if not live:
            return logits
        bitmask = self._xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for b in live:
            self.matchers[rows[b]].fill_next_token_bitmask(bitmask, b)
        logits = logits.float().clone()
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size,
                                              indices=live)
        return logits

    def accept(self, row: int, token: int) -> None:
        m = self.matchers[row]
        if m is not None and not m.is_terminated():
            m.accept_token(int(token))


def hf_generate_guided(backend: Any, texts: Sequence[str], config: GenerationConfig,
                       schemas: Sequence[Mapping[str, Any] | None], sampling: Sampling) -> list[Generation]:
    """``generate_guided`` of the hf backend: the backend's own decoding loop (``generate_formatted``), with a
    grammar mask on the rows that have a schema and, when sampling, one generator per row seeded from
    ``sampling.seed``, the row's text and its copy number among identical texts of the call (a row's draw does
    not depend on the other rows beside it)."""
    seen: dict[str, int] = {}
    seeds = []
    for t in texts:                 # the k-th copy of a text in one call draws its own sample
        seeds.append(row_seed(sampling.seed, t, seen.get(t, 0)))
        seen[t] = seen.get(t, 0) + 1
    cfg = replace(config, temperature=0.0 if sampling.greedy else float(sampling.temperature), top_p=1.0,
                  row_seeds=None if sampling.greedy else tuple(seeds))
    constraint = None
    if any(s is not None for s in schemas):
        comp = GrammarCompiler.of(backend)
        constraint = GrammarConstraint([comp.compile(s) if s is not None else None for s in schemas],
                                       comp.vocab_size)
    return backend.generate_formatted(texts, cfg, constraint=constraint)


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
