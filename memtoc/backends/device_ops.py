"""The three calls where a device-to-host copy differs by device: which devices stage, the host buffer, the event.

A reader inside vLLM's forward (``activations.capture.TokenCapture``) copies rows from the device to the host
without waiting: a pinned host buffer (a non-blocking copy from device memory needs page-locked memory), then an
event recorded after the copies, synchronized once before the rows are read. Everything else on that path is
the same code on every device, so a CPU test that asks for staging drives exactly what a GPU runs; only these
functions decide by device, and a test forces their GPU answers by monkeypatching :func:`device_kind` (and
``torch.cuda.Event`` / ``torch.empty``, which a CPU build cannot serve).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


#: Floating types arithmetic runs in; any other parameter dtype (float8 storage, quantized ints) is storage only.
MATH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` where math can run in it, else float32: what a hook computes in when all it knows is a
    parameter's dtype (an FP8 checkpoint's first parameter is float8, its activations are not)."""
    return dtype if dtype in MATH_DTYPES else torch.float32


def device_kind(device: torch.device | str) -> str:
    """The device's type (``cpu``, ``cuda``, ...): the one decision every branch below reads."""
    return torch.device(device).type


def is_accelerator(device: torch.device | str) -> bool:
    """True for a device whose copies to the host run asynchronously (anything but the CPU and ``meta``)."""
    return device_kind(device) not in ("cpu", "meta")


def host_buffer(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """An uninitialized host tensor that rows of ``device`` are copied into: pinned where ``device`` is an
    accelerator (so ``copy_(non_blocking=True)`` does not wait), plain memory on the CPU."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=is_accelerator(device))


class _Done:
    """The event of a CPU copy: the copy finished before ``copy_`` returned."""

    def record(self) -> None:
        return None

    def synchronize(self) -> None:
        return None


def copy_event(device: torch.device | str) -> Any:
    """An event recorded now on ``device``'s current stream (after the copies just queued); its ``synchronize()``
    waits for them. A no-op on the CPU, where copies are synchronous."""
    kind = device_kind(device)
    if kind == "cuda":
        ev = torch.cuda.Event()
    elif kind in ("cpu", "meta"):
        ev = _Done()
    else:
        ev = torch.Event(device=torch.device(device))
    ev.record()
    return ev


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (timing a forward): nothing to wait for on the CPU."""
    kind = device_kind(device)
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind not in ("cpu", "meta"):
        torch.accelerator.synchronize(torch.device(device))
