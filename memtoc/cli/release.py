"""``memtoc verify-release`` (:mod:`memtoc.jobs.release_verify`)."""

from __future__ import annotations

import argparse

from memtoc.jobs.release_verify import EXIT_DIFFERENCES, EXIT_OK, EXIT_UNVERIFIED, format_report, verify_release


def cmd_verify_release(args: argparse.Namespace) -> int:
    from memtoc.core.fileio import check_outputs, write_json_atomic, write_records_csv_atomic

    check_outputs({"--json": args.json, "--csv": args.csv}, [args.path])
    rep = verify_release(args.path, channel=args.channel)
    print(format_report(rep))
    if args.json:
        write_json_atomic(args.json, rep)
    if args.csv:
        write_records_csv_atomic(args.csv, rep["rows"])
    if rep["n_differences"]:
        return EXIT_DIFFERENCES
    return EXIT_OK if rep["n_compared"] else EXIT_UNVERIFIED


def add_verify_release_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify-release", help="recompute the paper's Ret./Tool/Wrong/Err. columns from a MemToC "
                       "release checkout and flag differences from its stored summaries (exit 0: all match, 1: "
                       "differences flagged, 2: could not verify)")
    p.add_argument("path", help="release checkout (with results/scored_episodes/ and results/summaries/)")
    p.add_argument("--channel", choices=("judged", "det"), default="judged",
                   help="arm_metrics.json channel to compare with (the scored files are the judged layer)")
    p.add_argument("--json", help="also write the full comparison as JSON")
    p.add_argument("--csv", help="also write the per-cell rows as CSV")
    p.set_defaults(func=cmd_verify_release)
