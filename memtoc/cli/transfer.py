"""``memtoc transfer-table`` (:mod:`memtoc.jobs.transfer_table`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memtoc.jobs.transfer_table import RETENTION_BAND, TransferRuns, format_markdown, transfer_table
from memtoc.scoring.stats import _clean


def cmd_transfer_table(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import write_json_atomic, write_text_atomic

    table = transfer_table(TransferRuns(args.base_value, args.arm_value, args.base_passage, args.arm_passage),
                           n_boot=args.n_boot, seed=args.seed, band=args.band)
    md = format_markdown(table, args.label)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "transfer_table.json", _clean(table))
        write_text_atomic(out / "transfer_table.md", md)
    return 0


def add_transfer_table_parser(sub: Any) -> None:
    p = sub.add_parser("transfer-table", help="App. F.1 Table 6: value / passage frame kept memory, unanswerable "
                       "abstention, closed-book retention vs the ±0.03 band (arm vs base transfer runs)")
    for name in ("base-value", "arm-value", "base-passage", "arm-passage"):
        p.add_argument(f"--{name}", required=True, help=f"{name.replace('-', ' ')} transfer run directory")
    p.add_argument("--label", default="arm", help="the arm's name in the table")
    p.add_argument("--band", type=float, default=RETENTION_BAND, help="closed-book retention band (paper ±0.03)")
    p.add_argument("--n-boot", type=int, default=2000, help="paired bootstrap draws (paper B = 2,000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the paired bootstrap")
    p.add_argument("--out", default=None, help="directory for transfer_table.{json,md}")
    p.set_defaults(func=cmd_transfer_table)
