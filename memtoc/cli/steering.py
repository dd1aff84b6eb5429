"""``memtoc direction``, ``memtoc sweep`` and ``memtoc codeexec sweep``: how their results are shown (the jobs are
:mod:`memtoc.jobs.direction` and :mod:`memtoc.jobs.sweep`; the parsers are generated from their configs)."""

from __future__ import annotations

from typing import Any


def present_direction(res: Any, cfg: Any) -> int:
    """``memtoc direction``: the spec written and each site's fit."""
    import json

    print(f"direction edit -> {res.path}")
    spec = json.loads(res.path.read_text(encoding="utf-8"))
    sides = spec.get("contrast") or {}
    side = f"toward {spec['toward']}" if spec.get("toward") else "no memory/tool side recorded"
    print(f"  points from {sides.get('from')} toward {sides.get('toward')}; a positive strength: {side} "
          f"({spec.get('toward_basis')})")
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
