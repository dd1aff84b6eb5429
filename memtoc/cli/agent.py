"""``memtoc agent evaluate``: MemToC episodes through the agent loop (options generated from the config)."""

from __future__ import annotations

import argparse


def cmd_agent_evaluate(args: argparse.Namespace) -> int:
    from memtoc.tasks.agent.task import AgentRunConfig, evaluate_agent
    from memtoc.core.options import config_from_args

    result = evaluate_agent(config_from_args(AgentRunConfig, args))
    print(result.table_text)
    for c in result.summary.get("contrasts", []):
        ag = c["agreement"]
        print(f"{c['b']} - {c['a']}: agreement {ag['delta']:+.3f} [{ag['ci_low']:+.3f}, {ag['ci_high']:+.3f}] "
              f"on {c['n_common']} common episodes")
    print(f"\nrun directory: {result.root}  ({len(result.records)} agent episodes; {result.n_new} new)")
    return 0


def add_agent_parsers(sub: argparse._SubParsersAction) -> None:
    from memtoc.tasks.agent.task import AgentRunConfig
    from memtoc.core.options import add_options

    top = sub.add_parser("agent", help="MemToC episodes as agent tasks: the tool is offered, the call validated and "
                                       "executed, under a tool-choice protocol (paper App. G)")
    asub = top.add_subparsers(dest="agent_command", required=True)
    p = asub.add_parser("evaluate", help="replay a slice through the agent loop; writes run.json, "
                        "agent_episodes.jsonl (traces), summary.json (resumable)")
    add_options(p, AgentRunConfig, only=(
        "model", "benchmark", "formulations", "conditions", "question_set", "limit", "protocols", "decoding",
        "temperature", "repetitions", "sample_seed", "slice", "call_parser", "run", "max_new_tokens", "batch_size",
        "backend",
        "device", "dtype", "seed", "n_boot", "progress", "out"), required=("out",),
                helps={"run": "finished memtoc evaluate run whose memory labels define the slice (default: a "
                              "closed-book pass is made here)",
                       "conditions": "conditions whose episodes are replayed (default tool_right)",
                       "repetitions": "sampled repetitions per episode and protocol (needs --temperature > 0)",
                       "max_new_tokens": "generation budget per agent turn",
                       "out": "run directory (resumed if it exists with the same settings; another --protocol "
                              "adds an arm)"})
    p.set_defaults(func=cmd_agent_evaluate)
