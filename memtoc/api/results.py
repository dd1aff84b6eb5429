"""The objects the Python API returns: thin views of what the jobs wrote, each with ``to_pandas()``.

They hold the job's own result (``.result``: the ``EvaluationResult``, ``ProbeReport``, ``RankTable``,
``SweepResult``, ``ArmComparison``) and the files it wrote; nothing here computes a statistic of its own.
pandas (and xarray, for :meth:`Store.read` with ``xarray=True``) are imported only when asked for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np


def _frame(rows: Sequence[Mapping[str, Any]] | Mapping[str, Any], columns: Sequence[str] | None = None) -> Any:
    import pandas as pd

    return pd.DataFrame(rows, columns=columns)


@dataclass
class MetricTable:
    """The metric table of a run (``memtoc metrics``): one row per metric and formulation, plus ``pooled``."""

    table: Any                                     # memtoc.scoring.metrics.MetricTable

    def to_dict(self) -> dict[str, Any]:
        return self.table.to_dict()

    def to_pandas(self) -> Any:
        """Columns metric, label, formulation (a formulation or ``pooled``), value, k, n, ci_low, ci_high."""
        rows = []
        for name, m in self.to_dict()["metrics"].items():
            for f, c in m["per_formulation"].items():
                rows.append({"metric": name, "label": m["label"], "formulation": f, **c})
            p = m["pooled"]
            rows.append({"metric": name, "label": m["label"], "formulation": "pooled", "value": p["value"],
                         "k": None, "n": sum(p["n_per_formulation"].values()), "ci_low": p["ci_low"],
                         "ci_high": p["ci_high"]})
        return _frame(rows, ["metric", "label", "formulation", "value", "k", "n", "ci_low", "ci_high"])

    def __str__(self) -> str:
        return self.table.format_text()


@dataclass
class Run:
    """An evaluation run directory (``memtoc evaluate --out``): its scored records and metric table."""

    path: Path
    # memtoc.tasks.memtoc.evaluate.EvaluationResult (None: opened from disk)
    result: Any = None
    _records: list[dict[str, Any]] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        """An existing run directory, read only."""
        return cls(Path(path))

    @property
    def records(self) -> list[dict[str, Any]]:
        """The scored records (``episodes.jsonl``), in file order."""
        if self._records is None:
            from memtoc.runs.runstore import RunStore

            self._records = RunStore.read(self.path, warn=None).episodes.records()
        return self._records

    @property
    def metrics(self) -> MetricTable:
        """The metric table (the one the job printed; for a run opened from disk, recomputed as the job
        computed it)."""
        if self.result is not None and self.result.table is not None:
            return MetricTable(self.result.table)
        import json

        from memtoc.scoring.metrics import metric_table

        config = json.loads((self.path / "run.json").read_text(encoding="utf-8")).get("config") or {}
        return MetricTable(metric_table(self.records, seed=config.get("seed", 0)))   # as the job computed it

    @property
    def summary(self) -> dict[str, Any]:
        import json

        return json.loads((self.path / "summary.json").read_text(encoding="utf-8"))

    def to_pandas(self) -> Any:
        """One row per scored record."""
        return _frame(self.records)


@dataclass
class Episodes:
    """Built episodes (``memtoc episodes``), with the exact prompt strings."""

    episodes: list[Any]
    frame: str

    def __len__(self) -> int:
        return len(self.episodes)

    def __iter__(self):
        return iter(self.episodes)

    def __getitem__(self, i: int) -> Any:
        return self.episodes[i]

    def to_pandas(self) -> Any:
        return _frame([e.to_dict() for e in self.episodes])


class Store:
    """An opened activation store (``memtoc extract --out``), read only; use ``with`` or :meth:`close`."""

    def __init__(self, path: str | Path, result: Any = None) -> None:
        from activations.store import open_store

        self.path = Path(path)
        self.result = result                       # activations.extract.ExtractResult (None: opened from disk)
        self.store = open_store(self.path)

    @property
    def layers(self) -> list[int]:
        return self.store.layers

    @property
    def d_model(self) -> int:
        return self.store.d_model

    def __len__(self) -> int:
        return len(self.store)

    def to_pandas(self) -> Any:
        """The row index (episode, condition, position kind, token, joined labels), one row per stored row."""
        return self.store.index_frame()

    def rows(self, positions: str | Sequence[str] | None = None, **equals: Any) -> np.ndarray:
        """Row numbers of one position kind (or several) whose index columns equal ``equals``."""
        if positions is not None:
            equals = {"position_kind": positions if isinstance(positions, str) else list(positions), **equals}
        return self.store.select(**equals) if equals else np.arange(len(self.store))

    def read(self, site: int, positions: str | Sequence[str] | None = None, *, xarray: bool = False,
             **equals: Any) -> Any:
        """``[rows, d_model]`` float32 activations of ``site`` at the rows of :meth:`rows`.

        ``xarray=True``: an ``xarray.DataArray`` with dims ``(row, d_model)`` and every index column as a
        coordinate along ``row`` (needs the ``notebook`` extra).
        """
        rows = self.rows(positions, **equals)
        values = self.store.read(site, rows)
        if not xarray:
            return values
        import xarray as xr

        index = self.store.index
        coords = {"row": rows, **{c: ("row", index[c][rows]) for c in index if c != "row"}}
        return xr.DataArray(values, dims=("row", "d_model"), coords=coords, name=f"site_{site}",
                            attrs={"site": site, "store": str(self.path)})

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.store!r})"


@dataclass
class ProbeResult:
    """Linear probes per site (``memtoc probe``)."""

    report: Any                                    # probes.linear.ProbeReport
    files: dict[str, Path]

    @property
    def best(self) -> Any:
        return self.report.best()

    def to_pandas(self) -> Any:
        """One row per site: pooled AUROC, its interval, the fold mean/sd (per-fold values as a list)."""
        return _frame([asdict(s) for s in self.report.sites])


@dataclass
class Direction:
    """A fitted direction edit (``memtoc direction``): the spec file and the edit loaded from it."""

    result: Any                                    # steering.direction.DirectionResult
    path: Path

    @property
    def edit(self) -> Any:
        """The edit (a ``steering.DirectionEdit``) read back from the spec file, as ``--edit`` would read it."""
        from steering import load_edit

        return load_edit(self.path)

    def to_pandas(self) -> Any:
        """One row per site: question groups, rows per side, ``||mean diff||`` and the projection gap (scale)."""
        return _frame([{"site": f.site, "n_groups": f.n_groups, "n_rows_a": f.n_rows_a, "n_rows_b": f.n_rows_b,
                        "norm": f.norm, "scale": f.scale} for _, f in sorted(self.result.fits.items())])


@dataclass
class Sweep:
    """An edit evaluated at several strengths (``memtoc sweep``)."""

    result: Any                                    # memtoc.tasks.memtoc.sweep.SweepResult

    @property
    def path(self) -> Path:
        return Path(self.result.out)

    @property
    def runs(self) -> dict[float, Run]:
        return {s: Run(Path(p)) for s, p in self.result.run_dirs.items()}

    def to_pandas(self) -> Any:
        """The sweep table as ``sweep.csv`` holds it (one row per strength)."""
        import pandas as pd

        return pd.read_csv(self.result.files["csv"])

    def __str__(self) -> str:
        return self.result.markdown


@dataclass
class RankTable:
    """Ranks of the memory answer's first token per lens (``memtoc rank-table``)."""

    table: Any                                     # probes.rank_table.RankTable
    files: dict[str, Path]

    def to_pandas(self) -> Any:
        """One row per episode, as ``rank_table.csv`` holds it."""
        from probes.rank_table import episode_csv_rows

        head, body = episode_csv_rows(self.table)
        return _frame(body, head)

    def summary(self) -> Any:
        """The per-lens summary (``rank_summary.csv``) as a DataFrame."""
        return _frame(self.table.summary)


@dataclass
class Comparison:
    """A paired comparison of two runs with the criterion verdict (``memtoc compare``)."""

    result: Any                                    # memtoc.scoring.metrics.ArmComparison

    @property
    def verdict(self) -> dict[str, Any]:
        return self.result.verdict.to_dict()

    def to_pandas(self) -> Any:
        """One row per compared metric (support, rates, delta b - a, interval, p, Holm-adjusted p)."""
        return _frame(list(self.result.to_dict()["comparisons"].values()))

    def __str__(self) -> str:
        return self.result.format_text()
