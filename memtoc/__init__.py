"""MemToC: memory-tool conflict benchmark, evaluator and scorer.

When a tool return contradicts what a language model knows, which source does the model follow?
This package builds the benchmark episodes, runs models through one backend seam, scores answers with
one deterministic scorer and aggregates them into the paper's metrics.

The Python API (:mod:`memtoc.api`: ``memtoc.evaluate``, ``memtoc.extract``, ``memtoc.probe``,
``memtoc.direction``, ``memtoc.sweep``, ``memtoc.rank_table``, ``memtoc.compare``, ``memtoc.function_edit``, ...)
is re-exported here lazily: ``import memtoc`` loads neither torch nor the API until one of its names is used.
"""

from typing import Any

__version__ = "0.1.0"

#: The public names of :mod:`memtoc.api`, resolved on first use (module ``__getattr__``, PEP 562).
API_NAMES = ("evaluate", "extract", "probe", "direction", "sweep", "rank_table", "compare", "load_episodes",
             "load_benchmark", "load_backend", "function_edit", "vector_edit", "load_edit", "Run", "MetricTable",
             "Store", "ProbeResult", "Direction", "Sweep", "RankTable", "Comparison", "Episodes", "APIError",
             "trace", "Trace", "hook_names", "sae_train", "mine_features", "lens_fit", "judge", "ack_export",
             "ack_import", "report", "study", "patch", "features", "serve", "prompt_tokens", "answer_token",
             "condition_pairs", "ConditionPair", "patch_edit")

# No ``__all__``: it would hide the package's modules from the API reference (pdoc documents only ``__all__``).


def _api(name: str) -> Any:
    # The one sanctioned upward import (tests/test_layering.py LAZY_FACADE): the package's public face
    # re-exports the application-layer API, and only when a name is asked for.
    from memtoc import api

    return getattr(api, name)


def __getattr__(name: str) -> Any:
    if name in API_NAMES:
        value = globals()[name] = _api(name)
        return value
    raise AttributeError(f"module 'memtoc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API_NAMES))
