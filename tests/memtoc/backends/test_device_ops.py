"""The device-to-host staging calls, with their GPU answers forced on the CPU: the device decision monkeypatched,
``torch.cuda.Event`` and the pinned allocation replaced by recorders (a CPU build of torch has neither)."""

from __future__ import annotations

import torch

from memtoc.backends import device_ops


def test_cpu_answers_plain_memory_and_no_event():
    assert not device_ops.is_accelerator("cpu") and not device_ops.is_accelerator("meta")
    buf = device_ops.host_buffer((2, 3), torch.float16, torch.device("cpu"))
    assert buf.shape == (2, 3) and buf.dtype == torch.float16 and not buf.is_pinned()
    ev = device_ops.copy_event("cpu")
    assert ev.synchronize() is None and type(ev).__name__ == "_Done"


def test_cuda_answers_pinned_memory_and_a_recorded_cuda_event(as_gpu):
    asked, events = as_gpu()
    assert device_ops.is_accelerator("cpu")
    device_ops.host_buffer((4, 2), torch.float32, "cpu")
    assert asked == [{"dtype": torch.float32, "pin_memory": True}]
    ev = device_ops.copy_event("cpu")
    assert events == [ev] and ev.calls == ["record"]


def test_another_accelerator_gets_torch_event_on_its_device(as_gpu):
    _, events = as_gpu("xpu")
    ev = device_ops.copy_event(torch.device("cpu"))
    assert events == [ev] and ev.kwargs == {"device": torch.device("cpu")} and ev.calls == ["record"]


def test_math_dtype_keeps_floating_types_and_replaces_storage_types():
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert device_ops.math_dtype(dt) is dt
    storage = [torch.int8, torch.uint8] + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2")
                                           if hasattr(torch, n)]
    assert {device_ops.math_dtype(dt) for dt in storage} == {torch.float32}


def test_synchronize_waits_on_the_device_it_is_given(monkeypatch):
    """``bench_edit``'s timing sync: ``torch.cuda.synchronize`` on CUDA, ``torch.accelerator`` on another
    accelerator, nothing on the CPU."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(("cuda", device)))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: waited.append(("acc", device)))
    device_ops.synchronize("cpu")
    assert waited == []
    monkeypatch.setattr(device_ops, "device_kind", lambda device: "cuda")
    device_ops.synchronize("cuda:1")
    monkeypatch.setattr(device_ops, "device_kind", lambda device: "xpu")
    device_ops.synchronize("cpu")
    assert waited == [("cuda", "cuda:1"), ("acc", torch.device("cpu"))]
