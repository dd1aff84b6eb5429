"""A fake vLLM worker (ranks, V1 runner fields, a Llama-shaped model of vLLM's block convention) for checks that must
drive ``memtoc.backends.vllm_worker`` / ``vllm_rows`` without vLLM: the GPU check runs the staged capture path
through it on the device, at any width, dtype and device.

The blocks have vLLM's Llama signature ``(positions, hidden, residual) -> (hidden, residual)`` with the residual add
deferred into the next block, so the stream after block ``i`` is ``hidden + residual``; each block is one seeded
linear map and ``tanh``, so a token's stream depends on that token alone (chunked prefill changes nothing).
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

import numpy as np
import torch
from torch import nn

from memtoc.backends import vllm_worker


class Block(nn.Module):
    """vLLM's Llama block shape: ``(positions, hidden, residual) -> (hidden, residual)``, residual add deferred."""

    def __init__(self, i: int, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(d, d, generator=torch.Generator().manual_seed(i)) / d ** 0.5)
            self.lin.bias.zero_()

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else hidden_states + residual
        return torch.tanh(self.lin(residual)), residual


class Missing(nn.Module):
    """vLLM's ``PPMissingLayer``: a block another pipeline stage owns."""


class Inner(nn.Module):
    def __init__(self, d: int, n_layers: int, start: int, end: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(i, d) if start <= i < end else Missing() for i in range(n_layers)])
        self.start_layer, self.end_layer = start, end


class Model(nn.Module):
    """Blocks ``start .. end`` of an ``n_layers`` model (a pipeline stage; default: all of them)."""

    def __init__(self, d: int, n_layers: int, start: int = 0, end: int | None = None) -> None:
        super().__init__()
        self.model = Inner(d, n_layers, start, n_layers if end is None else end)

    def forward(self, positions, hidden, residual=None):
        for layer in self.model.layers[self.model.start_layer:self.model.end_layer]:
            hidden, residual = layer(positions=positions, hidden_states=hidden, residual=residual)
        return hidden, residual


class Runner:
    """The V1 runner's fields the dispatcher reads: the input batch order, cached request states, host layouts."""

    def __init__(self, model: nn.Module) -> None:
        self.requests: dict = {}
        self.input_batch = SimpleNamespace(req_ids=[], num_reqs=0)
        self.query_start_loc = SimpleNamespace(cpu=torch.zeros(64, dtype=torch.int32))
        self.optimistic_seq_lens_cpu = torch.zeros(64, dtype=torch.int32)
        self.get_model = lambda: model

    def schedule(self, reqs: list[tuple[str, dict | None, int, int]]) -> int:
        """``reqs``: (request id, extra_args, tokens computed before, tokens this step); returns n_tokens."""
        self.input_batch = SimpleNamespace(req_ids=[r[0] for r in reqs], num_reqs=len(reqs))
        qsl = np.cumsum([0] + [r[3] for r in reqs])
        self.query_start_loc.cpu[:len(qsl)] = torch.as_tensor(qsl)
        for i, (rid, extra, before, now) in enumerate(reqs):
            self.requests[rid] = SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra))
            self.optimistic_seq_lens_cpu[i] = before + now
        return int(qsl[-1])


class Worker(vllm_worker.MemtocWorkerExtension):
    """The toolkit's worker extension over a fake runner; ``tp`` / ``pp``: the ranks :func:`ranked` reports."""

    def __init__(self, model: Model, tp: int = 0, pp: int = 0) -> None:
        self.runner = Runner(model)
        self.model_runner = self.runner
        self.model, self.tp, self.pp = model, tp, pp
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(model_type="llama")),
                                           compilation_config=SimpleNamespace(mode=0, cudagraph_mode="NONE"))


@contextmanager
def ranked() -> Iterator:
    """``call(worker, method, *args)``: runs a worker method while ``vllm_worker.ranks()`` answers that worker's
    ranks (restored on exit)."""
    current: dict = {"w": None}
    before = vllm_worker.ranks

    def ranks() -> tuple[int, int]:
        w = current["w"]
        return (w.tp, w.pp) if w is not None else (0, 0)

    def call(w: Worker, method: str, *args):
        current["w"] = w
        try:
            return getattr(w, method)(*args)
        finally:
            current["w"] = None

    vllm_worker.ranks = ranks
    try:
        yield call
    finally:
        vllm_worker.ranks = before
