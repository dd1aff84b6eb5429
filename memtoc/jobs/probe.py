"""The probe job: grouped cross-validated linear probes over an activation store (``memtoc probe``, ``mt.probe``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["ProbeConfig", "ProbeJobResult", "run_probe"]


@dataclass
class ProbeConfig:
    activations: str = ""                # HDF5 store (memtoc extract)
    label: str = ""                      # index column, or with ``run`` an episode field of the run
    out: str = "probe"
    groups: str = "question_id"          # index column whose values never straddle folds
    positive: str | None = None
    negative: str | None = None
    position_kind: str = "last_input"    # "" = all rows
    reduce: str = "none"                 # none | last | mean
    run: str | None = None
    layers: str | None = None            # default: every stored site
    C: float = 0.05
    folds: int = 5
    seed: int = 0
    n_boot: int = 1000
    n_permutations: int = 0
    progress: bool = True


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
                               groups=cfg.groups, position_kind=cfg.position_kind or None, run=cfg.run,
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
