"""How ``memtoc finetune data|train|crossfit|table`` show their results (the jobs: :mod:`memtoc.jobs.finetune.jobs`,
:mod:`memtoc.jobs.finetune.crossfit`)."""

from __future__ import annotations

import sys
from typing import Any

def present_data(res: Any, cfg: Any) -> int:
    ps = res.pair_set
    print(f"{len(ps.pairs)} pairs from {ps.meta['n_questions']} questions -> {res.path}  (sha256 {ps.sha256[:12]})")
    return 0


def present_train(res: Any, cfg: Any) -> int:
    state = "complete" if res.completed else f"stopped at {res.steps_done}/{res.total_steps} (re-run to resume)"
    print(f"{cfg.objective} adapter {state}: {res.path}" + (f"  sha256 {res.adapter_sha256}" if
                                                             res.adapter_sha256 else ""))
    return 0


def present_crossfit(res: Any, cfg: Any) -> int:
    print(res.table_markdown)
    print(f"cross-fit directory: {res.out}  (table: {res.manifest['table']['markdown']})")
    return 0


def present_table(res: Any, cfg: Any) -> int:
    print(res.table.markdown())
    if res.files:
        print(f"-> {res.files['markdown']}, {res.files['json']}", file=sys.stderr)
    return 0
