"""``memtoc direction``, ``memtoc sweep`` and ``memtoc codeexec sweep``: how their results are shown (the jobs are
:mod:`memtoc.jobs.direction` and :mod:`memtoc.jobs.sweep`; the parsers are generated from their configs)."""

from __future__ import annotations

from typing import Any


def present_direction(res: Any, cfg: Any) -> int:
    """``memtoc direction``: the spec written and each site's fit."""
    print(f"direction edit -> {res.path}")
    for s, f in sorted(res.result.fits.items()):
        print(f"  site {s}: {f.n_groups} question groups ({f.n_rows_a} / {f.n_rows_b} rows), ||mean diff|| "
              f"{f.norm:.4g}, projection gap (scale) {f.scale:.4g}")
    return 0


def present_sweep(res: Any, cfg: Any) -> int:
    """``memtoc sweep`` / ``memtoc codeexec sweep``: the sweep table and the files written."""
    print(res.markdown)
    for kind, p in res.files.items():
        print(f"{kind}: {p}")
    return 0
