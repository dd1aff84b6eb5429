"""How ``memtoc evaluate``, ``score``, ``metrics``, ``episodes``, ``compare`` and ``switch`` show their results.

The parsers are generated from the jobs' configs and the jobs do the work (:mod:`memtoc.jobs`); each function
here only prints a job's result and returns the exit status.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any


def present_evaluate(result: Any, cfg: Any) -> int:
    """The metric table, then the run directory and how many episodes are done."""
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({result.summary['n_episodes']['done']}/"
          f"{result.summary['n_episodes']['planned']} episodes; {result.n_episodes_new} new)")
    return 0


def present_score(result: Any, cfg: Any) -> int:
    print(f"scored {len(result.records)} records -> {result.out}  outcomes: " +
          ", ".join(f"{k}={v}" for k, v in sorted(result.counts.items())))
    return 0


def present_metrics(result: Any, cfg: Any) -> int:
    """The table of the layer asked for; the judged layer adds the judge, its changes and the CAR table; both
    layers are shown side by side with the difference."""
    if result.layer == "deterministic":
        print(result.tables["deterministic"].format_text())
        return 0
    from memtoc.scoring.judge.ack import format_car_table

    judged = result.judged
    if result.layer == "judged":
        print(result.tables["judged"].format_text())
    print(f"\njudge: {judged.judge.get('model')} (prompts {judged.judge.get('prompt_version')}); "
          f"changes: {json.dumps(judged.changes)}")
    if judged.partial_text is not None:
        print(f"PARTIAL judge pass (--allow-partial): {judged.partial_text}; unjudged episodes keep the "
              "scorer's labels")
    print(format_car_table(judged.car))
    if result.layer == "both":
        from memtoc.scoring.judge.sidebyside import side_by_side_text

        print()
        print(side_by_side_text(result.tables["deterministic"], result.tables["judged"]))
    return 0


def present_episodes(result: Any, cfg: Any) -> int:
    eps = result.episodes
    counts = Counter((e.formulation, e.arm) for e in eps)
    print(f"{len(eps)} episodes from {len({e.question.id for e in eps})} questions (frame {result.frame}, question "
          f"set {result.question_set}, protocol {cfg.protocol}) -> {cfg.out}")
    for (f, arm), n in sorted(counts.items()):
        print(f"  {f:13s} {arm:15s} {n}")
    return 0


def present_compare(result: Any, cfg: Any) -> int:
    print(result.format_text())
    return 0


def present_switch(summary: Any, cfg: Any) -> int:
    print(summary["table_text"])
    sw = summary["switch"]
    print(f"\nswitch ({sw['gate']} gate, knob {sw['knob']}): fired on {sw['n_fired']} of "
          f"{summary['n_episodes']['done']} episodes -> {cfg.out}")
    return 0
