"""The Python API: the four jobs as functions, results as DataFrames and arrays, custom edits as callables.

One function per ``memtoc`` command, taking the command's options as keywords and calling the same function
the command calls, so a notebook and a recipe do the same thing (``docs/api.md``)::

    import memtoc as mt

    run = mt.evaluate(model="default", benchmark="demo", limit=4)      # memtoc evaluate
    run.metrics.to_pandas()                                            # the metric table as a DataFrame
    acts = mt.extract(model="default", limit=4, layers="all", run=run) # memtoc extract -> an opened store
    x = acts.read(15, positions="last_input", xarray=True)            # [row, d_model] with the index as coords
    mt.probe(acts, label="condition", positive="tool_wrong", negative="tool_right").to_pandas()

    def push(site, hidden, positions):                                 # a custom edit: any function of the state
        return hidden + 0.5 * hidden.mean(0)
    edited = mt.evaluate(model="default", limit=4, edit=mt.function_edit(push, layers=[15]))
    mt.compare(run, edited).to_pandas()

Every name here is importable from ``memtoc`` itself; ``import memtoc`` stays cheap (nothing below loads until a
name is used).
"""

from memtoc.api.errors import APIError
from memtoc.api.edits import function_edit, load_edit, vector_edit
from memtoc.api.results import (Comparison, Direction, Episodes, MetricTable, ProbeResult, RankTable, Run, Store,
                                Sweep)

__all__ = ["evaluate", "extract", "probe", "direction", "sweep", "rank_table", "compare", "load_episodes",
           "load_benchmark", "load_backend", "function_edit", "vector_edit", "load_edit", "Run", "MetricTable",
           "Store", "ProbeResult", "Direction", "Sweep", "RankTable", "Comparison", "Episodes", "APIError",
           "trace", "Trace", "hook_names", "sae_train", "mine_features", "lens_fit", "judge", "ack_export",
           "ack_import", "report", "study", "patch", "features", "serve", "prompt_tokens", "answer_token",
           "condition_pairs", "ConditionPair", "patch_edit"]

#: loaded on first use: :mod:`memtoc.api.tracing` imports torch, and ``mt.compare`` must not
_LAZY = {"trace": "memtoc.api.tracing", "Trace": "memtoc.api.tracing", "hook_names": "memtoc.api.tracing",
         "prompt_tokens": "memtoc.api.tracing",
         **{name: "memtoc.api.pairs" for name in ("answer_token", "condition_pairs", "ConditionPair", "patch_edit")},
         # the job functions: each gets its signature from its config when first used (memtoc.api.signature)
         **{name: "memtoc.api.jobs" for name in ("evaluate", "extract", "probe", "direction", "sweep", "rank_table",
                                                   "compare", "load_episodes", "load_benchmark", "patch",
                                                   "features", "serve")},
         **{name: "memtoc.api.study_jobs" for name in ("judge", "ack_export", "ack_import", "study", "report",
                                                       "sae_train", "mine_features", "lens_fit")},
         # its signature lists ModelSpec's options
         "load_backend": "memtoc.api.interop"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'memtoc.api' has no attribute {name!r}")
