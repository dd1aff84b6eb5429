"""What model to run and how: the one description every job hands to ``memtoc.backends.factory.load_backend``.

Jobs compose a ``ModelSpec`` into their config instead of repeating model fields, so the CLI options, the run
identity and the backend construction all read the same frozen record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """A model source plus the runtime settings that change its outputs or where it runs."""

    model: str = "default"            # 'default', a .gguf file, a local model directory or a hub id
    backend: str = "hf"               # a name in the backend registry: 'hf' or 'vllm'
    device: str = "auto"
    dtype: str = "auto"
    chat: bool | None = None          # None: use the chat template when the tokenizer has one; False: raw completion
    adapter: str | None = None        # LoRA adapter directory, applied as a view (the shared model is never mutated)
    tensor_parallel_size: int = 1     # vllm only: GPUs per pipeline stage
    pipeline_parallel_size: int = 1   # vllm only: pipeline stages (nodes); vLLM spreads them over its Ray cluster
    gpu_memory_utilization: float = 0.9  # vllm only
    max_model_len: int | None = None  # vllm only

    def __post_init__(self) -> None:
        from memtoc.core.checks import check_device

        check_device(self.device)          # before any job opens its run or loads weights
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
