"""The rank-table job: what ``memtoc rank-table``, ``mt.rank_table(...)`` and a recipe's ``rank-table`` step call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memtoc.core.options import option
from memtoc.core.vocab import CONFLICT_CONDITION

__all__ = ["RankTableJobConfig", "RankTableJobResult", "run_rank_table"]


@dataclass
class RankTableJobConfig:
    """Everything ``memtoc rank-table`` takes: the run, the model that made it, the lenses and the selection."""

    run: str = field(default="", metadata=option("run"))         # the run directory whose episodes are ranked
    out: str = field(default="rank", metadata=option("out"))
    model: str = field(default="default", metadata=option("model"))
    backend: str = field(default="hf", metadata=option("backend"))   # hf only: the lenses read the model's parts
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="float32", metadata=option("dtype"))      # derivatives need float32
    layers: str = field(default="default", metadata=option("layers"))
    lens: tuple[str, ...] = field(default=("jacobian",), metadata=option("lens"))
    lens_file: str | None = field(default=None, metadata=option("lens_file"))
    batch_size: int = field(default=8, metadata=option("batch_size"))
    top_k: int = field(default=20, metadata=option("top_k"))
    condition: str = field(default=CONFLICT_CONDITION, metadata=option("rank_condition"))
    cell: str = field(default="arb", metadata=option("cell"))
    answer: str = field(default="memory", metadata=option("answer"))
    controls: bool = field(default=True, metadata=option("controls"))
    check_model: bool = field(default=True, metadata=option("check_model"))
    progress: bool = field(default=True, metadata=option("progress"))


@dataclass
class RankTableJobResult:
    table: Any                   # probes.rank_table.RankTable
    files: dict[str, Path]


def run_rank_table(cfg: RankTableJobConfig, *, backend: Any = None, edit: Any = None,
                   log: Callable[[str], None] | None = None) -> RankTableJobResult:
    """Rank of the memory answer's first token at the last input position, per lens and site, over ``cfg.run``;
    written to ``cfg.out``. ``backend``: a loaded backend of ``cfg.model`` (else loaded on hf)."""
    from memtoc.core.config import ConfigError
    from probes.rank_table import RankTableConfig, build_rank_table, write_rank_table

    if edit is not None:
        raise ConfigError("rank-table reads the untreated model; it takes no edit")
    if not cfg.run:
        raise ConfigError("rank-table needs run (a run directory)")
    from memtoc.core.backend_kinds import PARTS, backend_kind

    if PARTS not in backend_kind(cfg.backend).capabilities and backend is None:
        raise ConfigError(f"rank-table needs a backend with the model's parts: its lenses read the model's blocks, "
                          f"final norm and unembedding (and the Jacobian lens its gradients), which --backend "
                          f"{cfg.backend} does not expose; use --backend hf (docs/backends.md)")
    from memtoc.core.fileio import check_output_path
    from memtoc.runs.runstore import RunStore

    RunStore.read(cfg.run, warn=None)   # a missing or unreadable run: one line, before the weights load
    check_output_path(cfg.out, [cfg.run], flag="--out", output_is_dir=True)
    if backend is None:
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        backend = load_backend(ModelSpec(model=cfg.model, backend="hf", device=cfg.device, dtype=cfg.dtype))
    table = build_rank_table(backend, RankTableConfig(
        run=cfg.run, sites=cfg.layers, lenses=list(cfg.lens), lens_file=cfg.lens_file, batch_size=cfg.batch_size,
        top_k=cfg.top_k, condition=cfg.condition, cell=cfg.cell, controls=cfg.controls, check_model=cfg.check_model,
        answer=cfg.answer), progress=cfg.progress)
    return RankTableJobResult(table, write_rank_table(table, cfg.out))
