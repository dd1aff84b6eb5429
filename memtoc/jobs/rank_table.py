"""The rank-table job: what ``memtoc rank-table``, ``mt.rank_table(...)`` and a recipe's ``rank-table`` step call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.options import DERIVATIVE_DTYPE_HELP, opt, option
from memtoc.core.vocab import ALL_CONDITIONS, CELLS, CONFLICT_CONDITION

__all__ = ["RankTableJobConfig", "RankTableJobResult", "run_rank_table"]


@dataclass
class RankTableJobConfig:
    """Everything ``memtoc rank-table`` takes: the run, the model that made it, the lenses and the selection."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"run": "input-run", "lens_file": "input", "out": "output-dir"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "band", "lens": "lenses"}

    model: str = field(default="default", metadata=option("model", help="the model that produced the run"))
    backend: str = field(default="hf", metadata=option("backend"))
    run: str = field(default="", metadata=opt("run directory (memtoc evaluate --out)", required=True, path=True))
    layers: str = field(default="default", metadata=opt(
        "site band (default: the MemToC paper's band of the model's family -- blocks 8-28 Llama, 10-38 gemma, 7-24 "
        "Qwen, as sites = block + 1 -- else 'depth' = round(0.25 L)..round(0.9 L)); s = output of block s-1"))
    lens: tuple[str, ...] = field(default=("jacobian",), metadata=opt(
        "a lens to read, with its fitted file where it needs one (repeatable, or a comma list; default jacobian): "
        "logit, jacobian, detached, jvp or a registered lens (probes.lenses; the logit lens is always added as the "
        "baseline)", repeat=True, metavar="NAME[=FILE]"))
    lens_file: str | None = field(default=None, metadata=opt(
        "the file of every lens that needs one and names none (e.g. the averaged Jacobian lens: memtoc lens fit "
        "--out)", path=True))
    out: str = field(default="rank", metadata=opt(
        "output directory (rank_table.md / .csv / .json, rank_summary.csv)", required=True, path=True))
    batch_size: int = field(default=8, metadata=option("batch_size"))
    top_k: int = field(default=20, metadata=opt("rank threshold of the top-k hit rates (rank <= k)", low=1))
    condition: str = field(default=CONFLICT_CONDITION, metadata=opt(
        "the episodes' condition (all: every condition)", choices=(*ALL_CONDITIONS, "all")))
    cell: str = field(default="arb", metadata=opt(
        "the questions' closed-book cell: arb = memory right, tool wrong (the paper's table); all: every cell",
        choices=(*CELLS, "all")))
    answer: str = field(default="memory", metadata=opt(
        "whose first token is ranked: the closed-book memory answer (primary) or the gold answer",
        choices=("memory", "gold")))
    controls: bool = field(default=True, metadata=opt("skip the other-questions control", flag="--no-controls"))
    check_model: bool = field(default=True, metadata=opt("do not check that the run was made by --model",
                                                         flag="--allow-other-model", negate=True))
    progress: bool = field(default=True, metadata=option("progress"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="float32", metadata=option("dtype", help=DERIVATIVE_DTYPE_HELP))


@dataclass
class RankTableJobResult:
    table: Any                   # probes.rank_table.RankTable
    files: dict[str, Path]


def run_rank_table(cfg: RankTableJobConfig, *, backend: Any = None, edit: Any = None,
                   log: Callable[[str], None] | None = None) -> RankTableJobResult:
    """Rank of the memory answer's first token at the last input position, per lens and site, over ``cfg.run``;
    written to ``cfg.out``. On vllm the states are captured by the engine and decoded with the final norm and head
    loaded on their own, so the lenses that need the blocks (detached, jvp) are refused there before loading."""
    from memtoc.core.backend_kinds import PARTS, READOUT, backend_kind
    from memtoc.core.config import ConfigError
    from memtoc.core.fileio import check_output_path
    from memtoc.runs.runstore import RunStore
    from probes.rank_table import build_rank_table, rank_lenses, refuse_module_lenses, write_rank_table

    if edit is not None:
        raise ConfigError("rank-table reads the untreated model; it takes no edit")
    if not cfg.run:
        raise ConfigError("rank-table needs run (a run directory)")
    lenses = rank_lenses(cfg)
    kind = backend_kind(cfg.backend)
    if backend is None and PARTS not in kind.capabilities:          # refused before the weights load
        if READOUT not in kind.capabilities:
            raise ConfigError(f"rank-table needs a backend that captures the residual stream and has the model's "
                              f"readout (final norm and unembedding); --backend {cfg.backend} has neither; use "
                              f"--backend hf (docs/backends.md)")
        refuse_module_lenses(lenses, cfg.backend)
    RunStore.read(cfg.run, warn=None)   # a missing or unreadable run: one line, before the weights load
    check_output_path(cfg.out, [cfg.run], flag="--out", output_is_dir=True)
    if backend is None:
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        backend = load_backend(ModelSpec(model=cfg.model, backend=cfg.backend, device=cfg.device, dtype=cfg.dtype),
                               hooks=True)          # the lenses read captured states
    table = build_rank_table(backend, cfg, lenses=lenses, progress=cfg.progress)
    return RankTableJobResult(table, write_rank_table(table, cfg.out))
