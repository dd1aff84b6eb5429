"""``TokenCapture``'s staged path (what a GPU worker runs) on the CPU: asked for with ``stage=True``, or taken by
the default decision when ``memtoc.backends.device_ops`` is made to answer "cuda" (pinned allocation and the CUDA
event replaced by recorders, which a CPU build of torch cannot serve)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from memtoc.backends.plans import CapturePlan
from memtoc.backends.vllm_plans import TokenCapture


def _capture(stage=None, dtype=torch.float32) -> TokenCapture:
    plan = CapturePlan((1,), rows=np.array([0, 1, 0]), columns=np.array([2, 0, 0]), token_index=np.array([2, 0, 0]),
                       n_tokens=[3, 2])
    return TokenCapture(plan, 4, dtype, stage=stage)


def _forward(cap: TokenCapture, x: torch.Tensor) -> None:
    rows = SimpleNamespace(request=torch.tensor([0, 0, 0, 1, 1]), position=torch.tensor([0, 1, 2, 0, 1]))
    idx = cap.select(rows)
    with torch.inference_mode():
        cap.apply(1, x[idx], rows, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_capture_takes_the_gpu_branch_by_the_device_decision(as_gpu, dtype):
    """``TokenCapture.apply`` with the default ``stage=None`` on rows the device decision calls CUDA: a pinned
    buffer, a non-blocking copy, a CUDA event recorded; ``flush`` waits on it once, then scatters (bfloat16: the
    GPU's default dtype, kept exactly)."""
    asked, events = as_gpu()
    cap = _capture(dtype=dtype)
    cap.prepare(torch.device("cpu"), dtype)
    x = (torch.arange(20, dtype=torch.float32).reshape(5, 4) / 7).to(dtype)
    _forward(cap, x)
    assert [a.get("pin_memory") for a in asked] == [True] and len(cap.staged) == 1
    assert cap._pinned[1].dtype == dtype and cap.values[1].dtype == dtype
    (ev,) = events
    assert ev.calls == ["record"] and not bool(cap.filled[1].any())      # nothing scattered before the flush
    got = cap.collect()
    assert ev.calls == ["record", "synchronize"] and cap.staged == []
    assert torch.equal(got[1][0][cap.inverse], x[[2, 3, 0]])


def test_token_capture_on_cpu_writes_in_the_forward_unless_told_to_stage():
    x = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    direct, staged = _capture(), _capture(stage=True)
    for cap in (direct, staged):
        _forward(cap, x)
    assert direct.staged == [] and bool(direct.filled[1].all())
    assert len(staged.staged) == 1 and not staged._pinned[1].is_pinned()
    assert torch.equal(staged.collect()[1][0], direct.collect()[1][0])
