"""How ``memtoc judge``, ``memtoc ack {car,export,import}`` and ``memtoc outcome-round {export,import}`` show their
results (the jobs: :mod:`memtoc.jobs.judge`, :mod:`memtoc.jobs.ack`, :mod:`memtoc.jobs.outcome_round`), plus the
layer helpers ``metrics``/``compare``/``sweep`` call."""

from __future__ import annotations

import json
from typing import Any



def present_judge(res: Any, cfg: Any) -> int:
    """``memtoc judge``'s console output: the requests, the verdicts by kind and status."""
    from memtoc.scoring.judge.store import read_judge_records

    recs = read_judge_records(res.path)
    status: dict[str, int] = {}
    for r in recs.values():
        v = r["verdict"]
        s = f"{r['kind']}:{v['status'] if 'status' in v else {True: 'yes', False: 'no', None: 'none'}[v['ack']]}"
        status[s] = status.get(s, 0) + 1
    print(f"{res.path}: {res.n_requests} requests ({', '.join(f'{k} {v}' for k, v in res.counts.items())}); "
          f"{res.n_new} judged now")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in sorted(status.items())))
    return 0


def present_ack_car(rows: Any, cfg: Any) -> int:
    from memtoc.scoring.judge.ack import format_car_table

    print(format_car_table(rows))
    return 0


def present_ack_export(info: Any, cfg: Any) -> int:
    print(f"{info['n_items']} items -> {cfg.sheet} (blinded; fill the 'ack' column with yes/no); key -> {info['key']}")
    for arm, c in info["screen"].items():
        print(f"  {arm}: {c['k']} of {c['n']} flagged by the {cfg.detector} detector")
    return 0


def present_ack_import(res: Any, cfg: Any) -> int:
    print(json.dumps(res, indent=1))
    return 0


def present_outcome_export(info: Any, cfg: Any) -> int:
    print(f"{info['n_items']} items -> {cfg.sheet} (blinded; fill the 'outcome' column with followed_tool, "
          f"kept_memory, both, abstain or other); key -> {info['key']}")
    print("scorer classes in the population: " + ", ".join(f"{k} {v}" for k, v in info["population"].items()))
    return 0


def present_outcome_import(res: Any, cfg: Any) -> int:
    print(json.dumps(res, indent=1))
    return 0


