"""Loading the embedded default model: transformers' GGUF parse against the cached safetensors conversion
(``memtoc.backends.gguf_cache``), side by side in each round, in this process.

    .venv/bin/python benchmarks/bench_model_load.py --rounds 3 --out bench_out/model_load.json

Each round loads the GGUF directly (the fallback ``HFBackend.load`` takes when the cache cannot be written) and then
through the cache (converted once, before the rounds, into a temporary cache). Reported: each side's median and
the per-round ratio GGUF / cached. The conversion itself (once per machine) is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard


def _load(cache: str) -> float:
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    os.environ["MEMTOC_MODEL_CACHE"] = cache
    t0 = time.perf_counter()
    load_backend(ModelSpec(model="default", backend="hf", dtype="float32", device="cpu"))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="result JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "models")
        blocked = Path(tmp) / "file"
        blocked.write_text("")
        guard = _guard.Guard("model_load").__enter__()
        first = _load(cache)                                     # converts, then reads the copy
        direct, cached = [], []
        for i in range(args.rounds):                             # order rotated every round
            for side in (("direct", "cached") if i % 2 == 0 else ("cached", "direct")):
                if side == "direct":
                    direct.append(_load(str(blocked / "cache")))  # unwritable: the GGUF itself
                else:
                    cached.append(_load(cache))
        result = guard.finish({
            "first_load_with_conversion_s": round(first, 2), "gguf_s": _guard.summarize(direct),
            "cached_s": _guard.summarize(cached), "gguf_over_cached": _guard.ratios(direct, cached)},
            [{"name": "default model load, GGUF / cached copy", "value": _guard.ratios(direct, cached)["median"]}])
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
