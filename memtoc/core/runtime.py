"""What model to run and how to decode: :class:`ModelSpec` and :class:`GenerationConfig`.

Every job composes these two frozen records into its config (``memtoc.core.config``), and the backends read them
(``memtoc.backends.factory.load_backend(spec)``, ``backend.generate(prompts, config)``). They sit in core, below
the backends, so a job config names its model and decoding without importing a backend (or torch).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ModelSpec", "GenerationConfig", "row_seed"]


@dataclass(frozen=True)
class ModelSpec:
    """A model source plus the runtime settings that change its outputs or where it runs.

    ``backend`` names a kind of the backend registry (``memtoc.core.backend_kinds``); the fields a kind reads
    only for itself are its ``spec_fields`` (vLLM's engine settings below).
    """

    model: str = "default"            # 'default', a .gguf file, a local model directory or a hub id
    backend: str = "hf"               # a name in the backend registry: 'hf', 'vllm' or 'openai'
    device: str = "auto"
    dtype: str = "auto"
    chat_template: bool | None = None  # None: use the chat template when the tokenizer has one; False: raw completion
    adapter: str | None = None        # LoRA adapter directory, applied as a view (the shared model is never mutated)
    tensor_parallel_size: int = 1     # vllm only: GPUs per pipeline stage
    pipeline_parallel_size: int = 1   # vllm only: pipeline stages (nodes); vLLM spreads them over its Ray cluster
    gpu_memory_utilization: float = 0.9  # vllm only
    max_model_len: int | None = None  # vllm only
    base_url: str | None = None       # openai only: the server's OpenAI base URL (the key: MEMTOC_OPENAI_API_KEY)
    concurrency: int = 8              # openai only: requests in flight at once
    request_timeout: float = 600.0    # openai only: seconds one request may take before it is retried
    request_retries: int = 4          # openai only: retries (backoff) on connection errors, timeouts, 429, 5xx

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
    max_new_tokens: int | None = 128
    stop_at_final_line: bool | None = True   # stop once the ``FINAL:`` answer line is complete
    batch_size: int | None = None     # prompts per call a job sends (None: the job's default for its backend)
    temperature: float = 0.0          # 0 = greedy
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
