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


def _extract_helps() -> dict[str, str]:
    from activations.positions import POSITION_KINDS

    return {"positions": f"comma list of {', '.join(POSITION_KINDS)} (generated = greedy answer tokens)",
            "max_new_tokens": "generation budget for --position-kinds generated",
            "closed_book": "closed-book prompt used by no_tool episodes",
            "dtype": "model dtype: auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16",
            "out": "HDF5 store (extended if it exists with the same settings)"}


#: the protocol-filled options' help on evaluate and episodes (their default depends on --protocol)
_PROTOCOL_HELPS = {
    "formulations": "comma list of reference,paraphrase_a,paraphrase_b, or all (default reference; --protocol paper: "
                    "all)",
    "question_set": "all | analysis | fold-A | fold-B (default all; --protocol paper: analysis)"}

COMMANDS: tuple[Command, ...] = (
    # --- evaluation and scoring ---------------------------------------------------------------------------
    Command("evaluate", _present("memtoc.cli.evaluation:present_evaluate"), exclude=("temperature", "n_boot"),
            required=("out",), helps={
                **_PROTOCOL_HELPS, "batch_size": "prompts per backend call (default 8 on hf, 256 on vllm)",
                "out": "run directory (resumed if it exists with the same settings)"}),
    Command("score", _present("memtoc.cli.evaluation:present_score")),
    Command("metrics", _present("memtoc.cli.evaluation:present_metrics")),
    Command("episodes", _present("memtoc.cli.evaluation:present_episodes"), helps={
        "formulations": "a formulation, a comma list, or all (default reference; --protocol paper: all)",
        "question_set": _PROTOCOL_HELPS["question_set"],
        "protocol": "paper: the analysis set and all three formulations unless given (memtoc.bench.protocol)"}),
    Command("compare", _present("memtoc.cli.evaluation:present_compare")),
    Command("switch", _present("memtoc.cli.evaluation:present_switch")),
    # --- activations, lenses, probes ----------------------------------------------------------------------
    Command("probe", _present("memtoc.cli.probes:present_probe")),
    Command("patch", _present("memtoc.cli.probes:present_patch")),
    Command("extract", _present("memtoc.cli.activations:present_extract"), required=("out",), exclude=(
        "chat", "adapter", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len",
        "edit", "stop_at_final_line", "temperature", "seed", "n_boot"), helps=_extract_helps()),
    # --- steering -------------------------------------------------------------------------------------------
    Command("features", _present("memtoc.cli.probes:present_features")),
    # --- fine-tuning ----------------------------------------------------------------------------------------
    # --- the code-executor family and agent tasks -----------------------------------------------------------
    # --- judge, acknowledgment, annotation rounds -----------------------------------------------------------
    # --- studies, merging, reports --------------------------------------------------------------------------
    Command("merge", _present("memtoc.cli.merge:present_merge")),
    Command("merge-activations", _present("memtoc.cli.merge:present_merge_activations")),
    Command("report", _present("memtoc.cli.report:present_report")),
)
