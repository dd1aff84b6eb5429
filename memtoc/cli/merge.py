"""``memtoc merge`` and ``memtoc merge-activations`` (:mod:`memtoc.jobs.merge`)."""

from __future__ import annotations

from typing import Any

from memtoc.jobs.merge import merge_activation_stores, merge_runs

def cmd_merge(args: Any) -> int:
    res = merge_runs(args.runs, args.out, seed=args.seed, overwrite=args.overwrite)
    print(res.table_text)
    print(f"\nmerged run directory: {res.out}  ({res.n_episodes} episodes, {res.n_closed_book} closed-book records "
          f"from {res.n_sources} runs; {res.n_duplicates} duplicate records dropped; status {res.status})")
    return 0


def cmd_merge_activations(args: Any) -> int:
    res = merge_activation_stores(args.stores, args.out, overwrite=args.overwrite)
    print(f"{res.out}: {res.n_episodes} episodes, {res.n_rows} rows from {res.n_sources} stores "
          f"({res.n_duplicates} duplicate episodes dropped; {'complete' if res.complete else 'INCOMPLETE'})")
    return 0 if res.complete else 1


def add_merge_parsers(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge run directories of the same settings (shards) into one run directory")
    p.add_argument("runs", nargs="+", help="run directories (memtoc evaluate --out) made with the same settings")
    p.add_argument("--out", required=True, help="merged run directory (written to a temp dir, then renamed)")
    p.add_argument("--seed", type=int, default=None, help="bootstrap seed of the recomputed metric table "
                   "(default: the first run's)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("merge-activations", help="merge HDF5 activation stores of the same settings into one")
    p.add_argument("stores", nargs="+", help="activation stores (memtoc extract --out) made with the same settings")
    p.add_argument("--out", required=True, help="merged store (written to a temp file, then renamed)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_merge_activations)
