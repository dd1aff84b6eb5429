"""``memtoc codeexec ...``: how the code-executor jobs' results are shown (their parsers are generated from the
configs: :mod:`memtoc.cli.catalog`, :mod:`memtoc.jobs.codeexec`); ``codeexec sweep`` is still registered here."""

from __future__ import annotations

from typing import Any


def present_evaluate(result: Any, cfg: Any) -> int:
    """``memtoc codeexec evaluate``'s console output: the table and the run directory."""
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({len(result.records)} trials; {result.n_new} new)")
    return 0


def present_extract(res: Any, cfg: Any) -> int:
    """``memtoc codeexec extract``'s console output: what the store holds now."""
    state = "complete" if res.complete else "incomplete"
    print(f"{res.path}: {res.n_done} of {res.n_planned} prompts stored ({res.n_new_episodes} new; {state})")
    return 0


def present_table(res: Any, cfg: Any) -> int:
    """``memtoc codeexec table``'s console output: the table and the files written."""
    print(res.paths["markdown"].read_text(encoding="utf-8").rstrip())
    print("\nwritten: " + ", ".join(str(p) for p in res.paths.values()))
    return 0


def present_policy_contrasts(res: Any, cfg: Any) -> int:
    """``memtoc codeexec policy-contrasts``: the contrast table as written."""
    from pathlib import Path

    print((Path(cfg.out) / "policy_contrasts.md").read_text(encoding="utf-8").rstrip())
    return 0
