"""What model to run and how to decode: :class:`ModelSpec` and :class:`GenerationConfig`.

Every job composes these two frozen records into its config (``memtoc.core.config``), and the backends read them
(``memtoc.backends.factory.load_backend(spec)``, ``backend.generate(prompts, config)``). They sit in core, below
the backends, so a job config names its model and decoding without importing a backend (or torch).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from memtoc.core import vocab
from memtoc.core.options import opt, option

__all__ = ["ModelSpec", "GenerationConfig", "row_seed"]

_CHAT_FIELD = {"auto": None, "on": True, "off": False}     # --chat-template -> ModelSpec.chat_template


@dataclass(frozen=True)
class ModelSpec:
    """A model source plus the runtime settings that change its outputs or where it runs.

    ``backend`` names a kind of the backend registry (``memtoc.core.backend_kinds``); the fields a kind reads
    only for itself are its ``spec_fields`` (vLLM's engine settings below).
    """

    model: str = field(default="default", metadata=option("model"))
    backend: str = field(default="hf", metadata=option("backend"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="auto", metadata=option("dtype"))
    #: None: the chat template when the tokenizer has one; False: raw completion
    chat_template: bool | None = field(default=None, metadata=opt(
        "auto: the chat template when the tokenizer has one; off: raw completion of the prompt text (base models, "
        "the release's completion mode); on: require the template", choices=vocab.CHAT_TEMPLATE_MODES,
        to_field=_CHAT_FIELD.get))
    #: applied as a view: the shared model is never mutated
    adapter: str | None = field(default=None, metadata=opt(
        "LoRA adapter directory (memtoc finetune train/crossfit) applied to the whole model (closed-book pass "
        "included); its hash joins the run identity", path=True))
    tensor_parallel_size: int = field(default=1, metadata=opt("vllm: GPUs to shard the model over", low=1))
    pipeline_parallel_size: int = field(default=1, metadata=opt(
        "vllm: pipeline stages to split the layers into (usually one per node; vLLM places them through Ray); GPUs "
        "used = tensor x pipeline", low=1))
    gpu_memory_utilization: float = field(default=0.9, metadata=opt("vllm: share of GPU memory to use", low=0,
                                                                      above=True, high=1))
    max_model_len: int | None = field(default=None, metadata=opt("vllm: context length to reserve", low=1))
    base_url: str | None = field(default=None, metadata=opt(
        "openai: the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1 (the key is read from "
        "MEMTOC_OPENAI_API_KEY or OPENAI_API_KEY; --model names the served model)", metavar="URL"))
    concurrency: int = field(default=8, metadata=opt("openai: requests in flight at once", low=1))
    request_timeout: float = field(default=600.0, metadata=opt(
        "openai: seconds one request may take (then it is retried)", low=0, above=True))
    request_retries: int = field(default=4, metadata=opt(
        "openai: retries with backoff on connection errors, timeouts, 429 and 5xx", low=0))

    def __post_init__(self) -> None:
        from memtoc.core.backend_kinds import backend_kind
        from memtoc.core.checks import check_device

        backend_kind(self.backend)         # an unknown backend: one line naming --backend, before anything runs
        check_device(self.device)          # before any job opens its run or loads weights

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding settings shared by every backend: greedy unless ``temperature`` > 0.

    Sampling (hf backend only) draws each row's tokens from its own generator seeded with ``row_seeds[i]`` (a
    seed per prompt of the call; None: derived from the prompt text), so a row's sample does not depend on the
    other rows of its batch, and a sampled run is reproducible from its seeds.
    """

    #: None (and for ``stop_at_final_line``): not given in a job whose protocol fills it (``EvaluationConfig``);
    #: that job resolves it before anything reads it
    max_new_tokens: int | None = field(default=128, metadata=option("max_new_tokens"))
    stop_at_final_line: bool | None = field(default=True, metadata=opt(
        "stop once the first FINAL: line is complete (the default without --protocol paper)", flag="--stop-at-final",
        off_flag="--generate-to-budget", off_help="generate to the budget (no stop at the first FINAL: line; the "
        "scorer takes the last marker, as the release did; the default under --protocol paper)"))
    #: None: the job's default for its backend
    batch_size: int | None = field(default=None, metadata=option("batch_size"))
    temperature: float = field(default=0.0, metadata=option("temperature"))     # 0 = greedy
    top_p: float = 1.0                # nucleus mass kept when sampling
    row_seeds: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        from memtoc.core.checks import check_temperature

        check_temperature(self.temperature)    # -1 and nan: one line naming --temperature, not a traceback
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def sampling(self) -> bool:
        return self.temperature > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from ``seed`` and labels (sha256; the same on every platform).

    Here, beside :class:`GenerationConfig`, rather than in the torch decoder: task loops derive per-row seeds
    without loading torch, and the decoders draw with the same seeds."""
    text = "/".join([str(seed), *(str(p) for p in parts)])
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1
