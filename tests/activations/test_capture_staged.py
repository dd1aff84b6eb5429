"""``TokenCapture``'s staged path (what a GPU worker runs) on the CPU: asked for with ``stage=True``, or taken by
the default decision when ``memtoc.backends.device_ops`` is made to answer "cuda" (pinned allocation and the CUDA
event replaced by recorders, which a CPU build of torch cannot serve)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from activations.capture import TokenCapture
from activations.positions import Selection
from memtoc.backends import device_ops


class FakeEvent:
    def __init__(self) -> None:
        self.calls: list[str] = []
        EVENTS.append(self)

    def record(self) -> None:
        self.calls.append("record")

    def synchronize(self) -> None:
        self.calls.append("synchronize")


EVENTS: list[FakeEvent] = []


def _as_cuda(monkeypatch) -> list[dict]:
    asked: list[dict] = []
    real_empty = torch.empty

    def empty(*shape, **kwargs):
        asked.append(dict(kwargs))
        kwargs.pop("pin_memory", None)
        return real_empty(*shape, **kwargs)

    EVENTS.clear()
    monkeypatch.setattr(device_ops, "device_kind", lambda device: "cuda")
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    return asked


def _capture(stage=None, dtype=torch.float32) -> TokenCapture:
    lay = [SimpleNamespace(n_tokens=3), SimpleNamespace(n_tokens=2)]
    sel = Selection(row=np.array([0, 1, 0]), token_index=np.array([2, 0, 0]), column=np.array([2, 0, 0]),
                    kind=np.array(["all"] * 3), token_id=np.zeros(3, int))
    return TokenCapture(lay, sel, (1,), 4, dtype, stage=stage)


def _forward(cap: TokenCapture, x: torch.Tensor) -> None:
    rows = SimpleNamespace(request=torch.tensor([0, 0, 0, 1, 1]), position=torch.tensor([0, 1, 2, 0, 1]))
    idx = cap.select(rows)
    with torch.inference_mode():
        cap.apply(1, x[idx], rows, idx)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_capture_takes_the_gpu_branch_by_the_device_decision(monkeypatch, dtype):
    """``TokenCapture.apply`` with the default ``stage=None`` on rows the device decision calls CUDA: a pinned
    buffer, a non-blocking copy, a CUDA event recorded; ``flush`` waits on it once, then scatters (bfloat16: the
    GPU's default dtype, kept exactly)."""
    asked = _as_cuda(monkeypatch)
    cap = _capture(dtype=dtype)
    cap.prepare(torch.device("cpu"), dtype)
    x = (torch.arange(20, dtype=torch.float32).reshape(5, 4) / 7).to(dtype)
    _forward(cap, x)
    assert [a.get("pin_memory") for a in asked] == [True] and len(cap.staged) == 1
    assert cap._pinned[1].dtype == dtype and cap.values[1].dtype == dtype
    (ev,) = EVENTS
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
