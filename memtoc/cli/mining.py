"""``memtoc sae train|fvu`` and ``memtoc mine-features``: how their results are shown (the jobs are
:mod:`memtoc.jobs.mining`; the parsers are generated from their configs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def present_sae_train(paths: Any, cfg: Any) -> int:
    """``memtoc sae train``: the ``--sae`` value that mines with the SAEs just trained."""
    print("use with mine-features: --sae " + ",".join(f"{s}={p}" for s, p in paths))
    return 0


def present_sae_fvu(res: Any, cfg: Any) -> int:
    """``memtoc sae fvu``: one line per site with the gate's verdict; exit status 1 when a site fails the gate."""
    print(f"{'site':>4}  {'FVU':>8}  {'L0':>7}  {'rows':>6}  gate (FVU <= {res.threshold})  SAE")
    for site, r in sorted(res.report.items()):
        gate = "pass" if r["fvu"] <= res.threshold else "FAIL"
        print(f"{site:>4}  {r['fvu']:>8.4f}  {r['l0']:>7.1f}  {r['n_rows']:>6}  {gate:<20}  {r['sae']}")
    return 1 if res.failed else 0


def present_mine_features(res: Any, cfg: Any) -> int:
    """``memtoc mine-features``: the feature table's summary and the edit spec written."""
    print((Path(cfg.out) / "features.md").read_text(encoding="utf-8").split("\n| site | feature")[0].rstrip())
    print(f"\nedit spec: {res.spec_path}\n" + json.dumps({k: res.spec[k] for k in ("name", "layers", "positions",
                                                                                   "steer_toward", "fvu")}))
    return 0
