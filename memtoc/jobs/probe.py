"""The probe job: grouped cross-validated linear probes over an activation store (``memtoc probe``, ``mt.probe``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memtoc.core.options import opt, option

__all__ = ["ProbeConfig", "ProbeJobResult", "run_probe"]


@dataclass
class ProbeConfig:
    """``memtoc probe``: grouped cross-validated linear probes (AUROC per layer) on stored activations."""

    activations: str = field(default="", metadata=opt("HDF5 store (memtoc extract)", required=True,
                                                                 role="input-store"))
    label: str = field(default="", metadata=opt(
        "index column (condition, outcome, followed_tool, ...) or, with --run, an episode field of the run",
        required=True))
    out: str = field(default="probe", metadata=opt("output directory (probe.json / .csv / .md, probe_auroc.png)",
                                                   required=True, role="output-dir"))
    groups: str = field(default="question_id", metadata=opt("index column whose values never straddle folds"))
    positive: str | None = field(default=None, metadata=opt(
        "label value of the positive class (default: the larger of the label's two values)"))
    negative: str | None = field(default=None, metadata=opt(
        "label value of the negative class (default: the other value)"))
    position_kinds: str = field(default="last_input", metadata=opt("rows of this position kind ('' = all rows)"))
    reduce: str = field(default="none", metadata=opt(
        "several rows per episode: keep all, the last token, or their mean", choices=("none", "last", "mean")))
    run: str | None = field(default=None, metadata=opt("run directory to take the label from when the store lacks "
                                                       "it", role="input-run"))
    layers: str | None = field(default=None, metadata=opt("sites to probe (default: every stored site)"))
    C: float = field(default=0.05, metadata=opt("inverse L2 strength of the logistic regression", low=0,
                                                above=True))
    folds: int = field(default=5, metadata=opt(
        "grouped cross-validation folds (fewer groups: one fold per group, with a warning)", low=2))
    seed: int = field(default=0, metadata=opt("seed of the folds and the bootstrap intervals", low=0))
    n_boot: int = field(default=1000, metadata=option("n_boot"))
    n_permutations: int = field(default=0, metadata=opt("within-group label permutations for a null", low=0))
    progress: bool = field(default=True, metadata=option("progress"))


@dataclass
class ProbeJobResult:
    report: Any                          # probes.linear.ProbeReport
    files: dict[str, Path]


def run_probe(cfg: ProbeConfig, *, backend: Any = None, edit: Any = None,
              log: Callable[[str], None] | None = None) -> ProbeJobResult:
    """AUROC per stored site of a linear probe for ``cfg.label``; written to ``cfg.out``."""
    from activations.store import open_store
    from probes.linear import load_probe_data, run_probes, write_probe_report
    from probes.model import ProbeError

    with open_store(cfg.activations) as store:
        data = load_probe_data(store, label=cfg.label, positive=cfg.positive, negative=cfg.negative,
                               groups=cfg.groups, position_kind=cfg.position_kinds or None, run=cfg.run,
                               reduce=cfg.reduce)
        layers = store.layers
        if cfg.layers:
            from probes.model import parse_sites

            want = parse_sites(cfg.layers, max(layers))
            missing = [s for s in want if s not in layers]
            if missing:
                raise ProbeError(f"layers {missing} are not stored in {cfg.activations} (stored: {layers})")
            layers = list(want)
        report = run_probes(lambda s: data.features(store, s), layers, data.y, data.groups, C=cfg.C,
                            n_splits=cfg.folds, seed=cfg.seed, n_boot=cfg.n_boot,
                            n_permutations=cfg.n_permutations,
                            meta={**data.meta, "activations": str(cfg.activations)}, progress=cfg.progress)
    return ProbeJobResult(report, write_probe_report(report, cfg.out))
