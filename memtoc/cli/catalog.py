"""The subcommands of ``memtoc``: each a job (:mod:`memtoc.jobs.catalog`) and the function that shows its result.

The parsers are generated from the jobs' configs (:mod:`memtoc.cli.generate`); this table only says how each
result is printed and, for a command sharing a config piece, which of the piece's options do nothing there.
"""

from __future__ import annotations

from typing import Any

from memtoc.cli.generate import Command


def _present(ref: str) -> Any:
    """A presenter by ``module:function``, imported when the command runs (``memtoc --help`` imports none)."""
    module, _, name = ref.partition(":")

    def present(result: Any, cfg: Any) -> int | None:
        import importlib

        return getattr(importlib.import_module(module), name)(result, cfg)

    present.__qualname__ = ref
    return present


_DERIVATIVE_DTYPE = "float32 (default: derivatives need it) | bfloat16 | float16 | float64 | auto"

#: options of the model piece the sweeps do not take on the command line (the runtime is hf: edits need hooks)
_SWEEP_MODEL_EXCLUDED = ("backend", "chat", "adapter", "tensor_parallel_size", "pipeline_parallel_size",
                         "gpu_memory_utilization", "max_model_len")
_SWEEP_HELPS = {
    "edit": "edit spec (memtoc direction / mine-features output)",
    "direction": "steer toward memory or toward the tool (direction edits: the strength's sign; sae_clamp: swaps "
                 "the remove/add roles when the spec steers the other way); default: memory, or with memtoc "
                 "codeexec sweep the edit's own 'toward' (strength = spec strength)",
    "out": "sweep directory: one run directory per strength + sweep.*"}

COMMANDS: tuple[Command, ...] = (
    # --- evaluation and scoring ---------------------------------------------------------------------------
    # --- activations, lenses, probes ----------------------------------------------------------------------
    Command("probe", _present("memtoc.cli.probes:present_probe")),
    Command("lens fit", _present("memtoc.cli.probes:present_lens_fit"), helps={
        "model": "'default', a .gguf file, a local model directory or a hub id",
        "backend": "model runtime (hf: the fit needs gradients through the model's module tree)",
        "limit": "use only the first N corpus lines (default: 24 of the shipped default corpus, about 30 min for "
                 "the default model on 2 CPU cores; every line of any other corpus; 0 = all)",
        "dtype": _DERIVATIVE_DTYPE}),
    Command("rank-table", _present("memtoc.cli.probes:present_rank_table"), helps={
        "model": "the model that produced the run", "dtype": _DERIVATIVE_DTYPE}),
    Command("sae train", _present("memtoc.cli.mining:present_sae_train")),
    Command("sae fvu", _present("memtoc.cli.mining:present_sae_fvu")),
    Command("mine-features", _present("memtoc.cli.mining:present_mine_features")),
    # --- steering -------------------------------------------------------------------------------------------
    Command("direction", _present("memtoc.cli.steering:present_direction")),
    Command("sweep", _present("memtoc.cli.steering:present_sweep"), required=("edit", "out"),
            exclude=_SWEEP_MODEL_EXCLUDED + ("stop_at_final_line", "temperature"), helps={
                **_SWEEP_HELPS, "max_new_tokens": "generation budget per answer"}),
    # --- fine-tuning ----------------------------------------------------------------------------------------
    # --- the code-executor family and agent tasks -----------------------------------------------------------
    Command("codeexec sweep", _present("memtoc.cli.steering:present_sweep"), required=("edit", "out"),
            exclude=_SWEEP_MODEL_EXCLUDED + ("bootstrap_seed", "timeout_s", "cpu_s", "memory_mb",
                                             "max_total_new_tokens", "closed_book", "prompt_intervention", "frame"),
            helps={**_SWEEP_HELPS, "max_new_tokens": "generation budget per model turn",
                   "limit": "first N problems of the split",
                   "first_call": "scripted (default here): every tool-condition trial starts with the problem's "
                                 "scripted, really executed tool call, so every trial has a first tool return to "
                                 "steer from"}),
    # --- judge, acknowledgment, annotation rounds -----------------------------------------------------------
    # --- studies, merging, reports --------------------------------------------------------------------------
)
