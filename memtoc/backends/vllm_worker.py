"""The toolkit's vLLM worker extension: capture and edits installed inside every worker, reached with collective_rpc.

vLLM mixes a worker extension class into its workers (``LLM(worker_extension_cls=...)``) and calls its methods on
every worker with ``LLM.collective_rpc``, whatever the executor. The backend uses three calls:
:meth:`~MemtocWorkerExtension.memtoc_info` (ranks, runner, eagerness), :meth:`~MemtocWorkerExtension.memtoc_open`
(a pickled session ``[(sites, TokenHook)]``, installed before its requests are sent) and
:meth:`~MemtocWorkerExtension.memtoc_close` (each hook's ``collect()`` back, pickled).

The residual stream is replicated over tensor-parallel ranks, so edits run on every rank and readers
(``reads_only``) on tensor rank 0 only; a pipeline stage hooks the sites of the blocks it owns.
"""

from __future__ import annotations

import pickle
from typing import Any

#: the qualified name vLLM resolves in each worker
EXTENSION = "memtoc.backends.vllm_worker.MemtocWorkerExtension"


def dumps(obj: Any) -> bytes:
    """Pickle with cloudpickle where vLLM brought it (a function edit's user function pickles by value)."""
    try:
        import cloudpickle
    except ImportError:                     # pragma: no cover - vllm depends on cloudpickle
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


def loads(blob: bytes) -> Any:
    return pickle.loads(blob)


def ranks() -> tuple[int, int]:
    """(tensor-parallel rank, pipeline-parallel rank) of the calling worker; (0, 0) outside a distributed setup."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)
    except (ImportError, AssertionError, AttributeError):
        return 0, 0


def eager(vllm_config: Any) -> bool:
    """True when the worker's forward runs as Python (no torch.compile, no CUDA graphs): hooks then run."""
    cc = getattr(vllm_config, "compilation_config", None)
    if cc is None:
        return True
    return int(getattr(cc, "mode", 0) or 0) == 0 and str(getattr(cc, "cudagraph_mode", "NONE")).endswith("NONE")


class MemtocWorkerExtension:
    """Mixed into vLLM's worker class; every attribute is prefixed ``memtoc_`` (vLLM refuses clashes)."""

    def memtoc_dispatcher(self) -> Any:
        from memtoc.backends.vllm_rows import Dispatcher

        d = getattr(self, "_memtoc_dispatch", None)
        if d is None:
            runner = self.model_runner
            cfg = self.vllm_config.model_config.hf_config
            d = Dispatcher(runner.get_model(), str(getattr(cfg, "model_type", "")), runner)
            self._memtoc_dispatch = d
        return d

    def memtoc_info(self) -> dict[str, Any]:
        """What the backend needs to decide whether hooks can run here (never raises)."""
        from memtoc.backends.vllm_rows import V2_REFUSAL

        runner = getattr(self, "model_runner", None)
        tp, pp = ranks()
        v1 = runner is not None and hasattr(runner, "input_batch") and hasattr(runner, "requests")
        return {"tp_rank": tp, "pp_rank": pp, "runner": type(runner).__module__ + "." + type(runner).__name__,
                "v1_runner": v1, "refusal": None if v1 else V2_REFUSAL,
                "eager": eager(getattr(self, "vllm_config", None))}

    def memtoc_open(self, sid: str, blob: bytes) -> bool:
        """Install session ``sid``: readers only on tensor rank 0. Returns whether anything was installed."""
        hooks = loads(blob)
        tp, _ = ranks()
        mine = [h if tp == 0 or not getattr(h, "reads_only", False) else None for _, h in hooks]
        self.memtoc_dispatcher().open(sid, [(sites, h) for (sites, _), h in zip(hooks, mine) if h is not None])
        if getattr(self, "_memtoc_sessions", None) is None:
            self._memtoc_sessions = {}
        self._memtoc_sessions[sid] = mine
        return any(h is not None for h in mine)

    def memtoc_close(self, sid: str) -> bytes:
        """Remove session ``sid``; the pickled ``collect()`` of each of its hooks in the order opened (None for a
        hook this rank did not run), with this rank's identity and the sites it owns. What a hook raised (in a
        forward, a flush or ``collect``) comes back as ``error`` in one line; the session is gone either way."""
        from memtoc.backends.vllm_rows import one_line

        d = self.memtoc_dispatcher()
        try:
            _, error = d.close(sid)
        finally:
            mine = (getattr(self, "_memtoc_sessions", None) or {}).pop(sid, [])
        got = []
        for h in mine:
            try:
                got.append(None if h is None else h.collect())
            except Exception as exc:        # noqa: BLE001 - the caller raises it, naming the hook's error
                error = error or one_line(exc)
                got.append(None)
        tp, pp = ranks()
        return dumps({"tp_rank": tp, "pp_rank": pp, "owned": [s for s in range(d.n_sites) if d.owns(s)],
                      "error": error, "hooks": got})
