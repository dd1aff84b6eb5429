"""What an evaluation run returns, for every task family: one :class:`RunResult`.

``memtoc evaluate``, ``memtoc codeexec evaluate`` and ``memtoc agent evaluate`` all run through the one evaluate
job (:func:`memtoc.tasks.evaluation.evaluate_task`), and a run directory read back from disk (the Python API's
``Run.open``) is one too. Only the in-memory type is shared: each family's run directory keeps its own files
(:data:`RUN_FILES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtoc.core.errors import RunStoreError

__all__ = ["RunResult", "RUN_FILES", "run_family", "read_records", "read_summary"]

#: Each family's run directory: the ``schema_version`` its ``run.json`` records, and the JSONL file of its
#: records with the field that keys them.
RUN_FILES: dict[str, tuple[str, str, str]] = {
    "memtoc": ("memtoc-run-v1", "episodes.jsonl", "episode_id"),
    "codeexec": ("memtoc-codeexec-run-v1", "trials.jsonl", "key"),
    "agent": ("memtoc-agent-run-v1", "agent_episodes.jsonl", "key"),
}


@dataclass
class RunResult:
    """One evaluation run of any family: its directory, records, summary and metric table, and what was new.

    - ``records``: the records of the run's plan (MemToC's scored episodes, the code executor's trials, the agent
      task's agent episodes); for a run read from disk, every record of its records file.
    - ``summary``: the ``summary.json`` document; ``table_text``: the table the command prints; ``table``: the
      family's metric-table object behind it (agent: None, its table is the summary's ``arms``).
    - ``n_new``: records written by this invocation; ``new``: the same per part (MemToC: ``closed_book`` and
      ``episodes``); ``store``: MemToC's :class:`memtoc.runs.runstore.RunStore` (None for the other families).
    """

    root: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    table_text: str
    n_new: int = 0
    new: dict[str, int] = field(default_factory=dict)
    table: Any = None
    store: Any = None
    family: str = "memtoc"

    @property
    def n_closed_book_new(self) -> int:
        """Closed-book answers written by this invocation (MemToC's first part; 0 for other families)."""
        return self.new.get("closed_book", 0)

    @property
    def n_episodes_new(self) -> int:
        """Scored episodes written by this invocation (MemToC's tool-conditioned pass; 0 for other families)."""
        return self.new.get("episodes", 0)


def run_family(root: str | Path) -> str:
    """The family whose run directory ``root`` is, from its ``run.json`` (``schema_version``), else its files."""
    from memtoc.runs.runstore import read_run_info

    root = Path(root)
    schema = read_run_info(root).get("schema_version")
    for family, (name, _, _) in RUN_FILES.items():
        if schema == name:
            return family
    for family, (_, records, _) in RUN_FILES.items():
        if (root / records).is_file():
            return family
    raise RunStoreError(f"{root}: not an evaluation run directory (run.json schema {schema!r}, no records file "
                        f"of {', '.join(RUN_FILES)})")


def read_records(root: str | Path, family: str | None = None) -> list[dict[str, Any]]:
    """Every record of a run directory's records file, in file order (read only; a torn last line is ignored)."""
    from memtoc.runs.runstore import JsonlLog

    root = Path(root)
    _, name, key = RUN_FILES[family or run_family(root)]
    return JsonlLog.read(root / name, key).records()


def read_summary(root: str | Path) -> dict[str, Any]:
    """A run directory's ``summary.json`` ({} before its evaluation first finished)."""
    import json

    path = Path(root) / "summary.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RunStoreError(f"{path}: cannot read ({exc})") from None
