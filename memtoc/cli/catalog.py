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


COMMANDS: tuple[Command, ...] = (
    # --- evaluation and scoring ---------------------------------------------------------------------------
    # --- activations, lenses, probes ----------------------------------------------------------------------
    Command("probe", _present("memtoc.cli.probes:present_probe")),
    # --- steering -------------------------------------------------------------------------------------------
    # --- fine-tuning ----------------------------------------------------------------------------------------
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
