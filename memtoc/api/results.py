"""The objects the Python API returns: thin views of what the jobs wrote, each with ``to_pandas()``.

They hold the job's own result (``.result``: the ``RunResult`` of any family's evaluation, ``ProbeReport``,
``RankTable``, ``SweepResult``, ``ArmComparison``) and the files it wrote; nothing here computes a statistic of its own.
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


#: the estimates of a code-executor condition row and of an agent arm, in table order
_CODEEXEC_METRICS = ("accuracy", "adoption", "override", "tool_call_ratio")
_AGENT_METRICS = ("agreement", "execution_rate")


@dataclass
class MetricTable:
    """The metric table of a run, whatever its family.

    MemToC (``memtoc metrics``): one row per metric and formulation, plus ``pooled``. Code executor: one row
    per policy, condition and metric (accuracy, adoption, override, tool-call ratio). Agent task: one row per
    protocol and metric (agreement, execution rate; paper Table 7).
    """

    #: memtoc.scoring.metrics.MetricTable (MemToC); the ConditionSummary rows (codeexec); the summary's arms (agent)
    table: Any
    family: str = "memtoc"
    text: str = ""                                 # the table the command printed (codeexec, agent)

    def to_dict(self) -> dict[str, Any]:
        """MemToC: the table's document (``summary.json``'s ``metrics``); codeexec: ``{"rows": ...}`` and agent:
        ``{"arms": ...}``, as ``summary.json`` holds them."""
        if self.family == "codeexec":
            return {"rows": [r.to_dict() for r in self.table]}
        if self.family == "agent":
            return {"arms": list(self.table)}
        return self.table.to_dict()

    def to_pandas(self) -> Any:
        """MemToC: columns metric, label, formulation (a formulation or ``pooled``), value, k, n, ci_low, ci_high.
        Codeexec: policy, condition, metric, value, ci_low, ci_high, n_trials, n_problems. Agent: protocol,
        metric, value, ci_low, ci_high, n."""
        rows = []
        if self.family == "codeexec":
            for r in self.to_dict()["rows"]:
                for name in _CODEEXEC_METRICS:
                    e = r.get(name)
                    if e is not None:
                        ci = e.get("ci") or {}
                        rows.append({"policy": r["policy"], "condition": r["condition"], "metric": name,
                                     "value": e.get("value"), "ci_low": ci.get("low"), "ci_high": ci.get("high"),
                                     "n_trials": e.get("n_trials"), "n_problems": e.get("n_problems")})
            return _frame(rows, ["policy", "condition", "metric", "value", "ci_low", "ci_high", "n_trials",
                                 "n_problems"])
        if self.family == "agent":
            for r in self.table:
                for name in _AGENT_METRICS:
                    e = r.get(name) or {}
                    rows.append({"protocol": r["protocol"], "metric": name, "value": e.get("value"),
                                 "ci_low": e.get("ci_low"), "ci_high": e.get("ci_high"), "n": e.get("n")})
            return _frame(rows, ["protocol", "metric", "value", "ci_low", "ci_high", "n"])
        for name, m in self.to_dict()["metrics"].items():
            for f, c in m["per_formulation"].items():
                rows.append({"metric": name, "label": m["label"], "formulation": f, **c})
            p = m["pooled"]
            rows.append({"metric": name, "label": m["label"], "formulation": "pooled", "value": p["value"],
                         "k": None, "n": sum(p["n_per_formulation"].values()), "ci_low": p["ci_low"],
                         "ci_high": p["ci_high"]})
        return _frame(rows, ["metric", "label", "formulation", "value", "k", "n", "ci_low", "ci_high"])

    def __str__(self) -> str:
        return self.table.format_text() if self.family == "memtoc" else self.text


@dataclass
class Run:
    """An evaluation run directory of any family (``memtoc evaluate``, ``memtoc codeexec evaluate``, ``memtoc
    agent evaluate``): a thin view of its :class:`memtoc.runs.result.RunResult`."""

    path: Path
    #: the job's memtoc.runs.result.RunResult (None: opened from disk; read back on first use)
    result: Any = None
    _records: list[dict[str, Any]] | None = field(default=None, repr=False)
    _read: Any = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        """An existing run directory of any family, read only; a path that is no run directory is refused here,
        in one line naming it (not at the first read)."""
        from memtoc.core.errors import RunStoreError
        from memtoc.runs.result import run_family

        path = Path(path)
        if not path.is_dir():
            raise RunStoreError(f"{path}: no such run directory" if not path.exists() else
                                f"{path} is not a run directory (a file, not a folder)")
        run_family(path)            # run.json present and of a known family (its own one-line refusal)
        return cls(path)

    @property
    def family(self) -> str:
        """``memtoc``, ``codeexec`` or ``agent`` (from the result, else from the directory's ``run.json``)."""
        if self.result is not None:
            return self.result.family
        from memtoc.runs.result import run_family

        return run_family(self.path)

    def _read_back(self) -> Any:
        """The directory read back by its family's task (:meth:`memtoc.core.tasks.Task.read_run`), once."""
        if self._read is None:
            from memtoc.core.tasks import get_task

            self._read = get_task(self.family).read_run(self.path)
        return self._read

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records: MemToC's scored episodes (``episodes.jsonl``), the code executor's trials
        (``trials.jsonl``) or the agent task's agent episodes (``agent_episodes.jsonl``). The job's records of
        its plan; for a run opened from disk, every record of the file, in file order."""
        if self.result is not None:
            return self.result.records
        if self._records is None:
            from memtoc.runs.result import read_records

            self._records = read_records(self.path, self.family)
        return self._records

    @property
    def metrics(self) -> MetricTable:
        """The metric table (the one the job printed; for a run opened from disk, recomputed as the job
        computed it)."""
        res = self.result
        if res is None or (res.family != "agent" and res.table is None):
            res = self._read_back()
        if res.family == "agent":
            return MetricTable(res.summary.get("arms", []), "agent", res.table_text)
        return MetricTable(res.table, res.family, res.table_text)

    @property
    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` document."""
        if self.result is not None:
            return self.result.summary
        from memtoc.runs.result import read_summary

        return read_summary(self.path)

    def to_pandas(self) -> Any:
        """One row per record."""
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
        self.result = result                       # memtoc.jobs.extract.ExtractResult (None: opened from disk)
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

    result: Any                                    # memtoc.jobs.sweep.SweepResult

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
