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


# fine-tuning: the wording of the model options, and what the cross-fit's shared pieces hold that it does not take
_FT_MODEL_HELPS = {"model": "'default', a .gguf file, a local model directory or a hub id",
                   "formulations": "comma list or all (training prompts)",
                   "device": "auto | cpu | cuda | cuda:N (GPU for 7-9B models)",
                   "dtype": "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16"}
_CROSSFIT_EXCLUDE = ("backend", "chat", "adapter", "tensor_parallel_size", "pipeline_parallel_size",
                     "gpu_memory_utilization", "max_model_len", "edit", "stop_at_final_line", "temperature", "n_boot")
_CROSSFIT_HELPS = {**_FT_MODEL_HELPS, "conditions": "evaluation conditions",
                   "question_set": "the questions results are computed on (the paper: analysis)",
                   "prompt_intervention": "also evaluate base with this prompt intervention (the prompting arm)",
                   "batch_size": "evaluation prompts per batch",
                   "out": "output directory (data/, adapters/, runs/ and arms/ inside)"}

COMMANDS: tuple[Command, ...] = (
    # --- evaluation and scoring ---------------------------------------------------------------------------
    # --- activations, lenses, probes ----------------------------------------------------------------------
    Command("probe", _present("memtoc.cli.probes:present_probe")),
    Command("patch", _present("memtoc.cli.probes:present_patch")),
    # --- steering -------------------------------------------------------------------------------------------
    Command("features", _present("memtoc.cli.probes:present_features")),
    # --- fine-tuning ----------------------------------------------------------------------------------------
    Command("finetune data", _present("memtoc.cli.finetune:present_data"), helps=_FT_MODEL_HELPS),
    Command("finetune train", _present("memtoc.cli.finetune:present_train"), helps=_FT_MODEL_HELPS),
    Command("finetune crossfit", _present("memtoc.cli.finetune:present_crossfit"), exclude=_CROSSFIT_EXCLUDE,
            helps=_CROSSFIT_HELPS, required=("out",), choices={"question_set": ("all", "analysis")}),
    Command("finetune table", _present("memtoc.cli.finetune:present_table")),
    # --- the code-executor family and agent tasks -----------------------------------------------------------
    # --- judge, acknowledgment, annotation rounds -----------------------------------------------------------
    Command("judge", _present("memtoc.cli.judge:present_judge")),
    Command("ack car", _present("memtoc.cli.judge:present_ack_car")),
    Command("ack export", _present("memtoc.cli.judge:present_ack_export")),
    Command("ack import", _present("memtoc.cli.judge:present_ack_import")),
    Command("outcome-round export", _present("memtoc.cli.judge:present_outcome_export")),
    Command("outcome-round import", _present("memtoc.cli.judge:present_outcome_import")),
    # --- studies, merging, reports --------------------------------------------------------------------------
    Command("study", _present("memtoc.cli.study:present_study")),
    Command("transfer-table", _present("memtoc.cli.transfer:present_transfer_table")),
    Command("verify-release", _present("memtoc.cli.release:present_verify_release")),
)
