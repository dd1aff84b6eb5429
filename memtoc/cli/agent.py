"""``memtoc agent evaluate``'s console output (its parser is generated from ``AgentRunConfig``; the job is the one
evaluate job, :func:`memtoc.jobs.evaluate.run_evaluate`)."""

from __future__ import annotations

from typing import Any


def present_agent_evaluate(result: Any, cfg: Any) -> int:
    """The table, each contrast's agreement change, the run directory."""
    print(result.table_text)
    for c in result.summary.get("contrasts", []):
        ag = c["agreement"]
        print(f"{c['b']} - {c['a']}: agreement {ag['delta']:+.3f} [{ag['ci_low']:+.3f}, {ag['ci_high']:+.3f}] "
              f"on {c['n_common']} common episodes")
    print(f"\nrun directory: {result.root}  ({len(result.records)} agent episodes; {result.n_new} new)")
    return 0
