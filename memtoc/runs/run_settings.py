"""The settings two runs must share to be compared as arms: what ``memtoc compare`` warns about when they differ.

An arm comparison is paired on common support, so runs made with different generation budgets, limits or question
sets still compare -- but the difference is then partly the settings', not only the treatment's. The treatment
fields (edit, adapter, model) and run mechanics (out, batch size, device, progress) are not listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: ``run.json`` ``config`` fields that shape the generated answers or the episodes a run holds.
COMPARED_SETTINGS: tuple[str, ...] = (
    "max_new_tokens", "stop_at_final_line", "temperature", "top_p", "row_seeds", "chat_template", "dtype",
    "closed_book", "prompt_intervention", "frame", "protocol", "closed_book_from",
    "benchmark", "formulations", "conditions", "question_set", "limit", "seed")


#: ``run.json`` ``config`` keys of runs written before a field took its flag's name -> the field's name now
RENAMED_KEYS: dict[str, str] = {"chat": "chat_template", "positions": "position_kinds", "layer": "score_layer"}


def current_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``config`` with its older key names read as today's (a run made before a rename compares)."""
    return {RENAMED_KEYS.get(k, k) if RENAMED_KEYS.get(k, k) not in config else k: v for k, v in config.items()}


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """The ``config`` record of a run's ``run.json`` ({} when the file or the record is missing), in today's
    key names."""
    path = Path(run_dir) / "run.json"
    try:
        return current_keys(dict(json.loads(path.read_text(encoding="utf-8")).get("config") or {}))
    except (OSError, ValueError):
        return {}


def differing_settings(run_a: str | Path, run_b: str | Path) -> dict[str, tuple[Any, Any]]:
    """``{field: (value in a, value in b)}`` for every compared setting that differs between the two runs."""
    a, b = run_config(run_a), run_config(run_b)
    if not a or not b:
        return {}
    return {k: (a.get(k), b.get(k)) for k in COMPARED_SETTINGS if a.get(k) != b.get(k)}


def settings_warning(run_a: str | Path, run_b: str | Path) -> str | None:
    """One line naming every differing setting with both values, or None when they agree."""
    diff = differing_settings(run_a, run_b)
    if not diff:
        return None
    items = "; ".join(f"{k} {va!r} vs {vb!r}" for k, (va, vb) in diff.items())
    return (f"warning: the runs differ in generation / selection settings ({items}): the comparison measures "
            "those differences together with the treatment")
