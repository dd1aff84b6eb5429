"""``memtoc codeexec ...``: the corrupted code-executor family on the command line."""

from __future__ import annotations

import argparse

from memtoc.codeexec.prompts import POLICIES


def _prepare_sandbox(args: argparse.Namespace) -> None:
    """Sandbox limits and kernel isolation are checked before the model loads or the output is created."""
    from memtoc.codeexec.sandbox import prepare_sandbox

    prepare_sandbox(timeout_s=args.timeout_s, cpu_s=args.cpu_s, memory_mb=args.memory_mb,
                    require_isolation=args.require_isolation)


def cmd_codeexec_evaluate(args: argparse.Namespace) -> int:
    _prepare_sandbox(args)
    from memtoc.codeexec.agent import AgentConfig
    from memtoc.codeexec.run import CodeexecRunConfig, evaluate_codeexec

    agent = AgentConfig(max_tool_rounds=args.max_tool_rounds, max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, protocol=args.protocol, timeout_s=args.timeout_s,
                        cpu_s=args.cpu_s, memory_mb=args.memory_mb, first_call=args.first_call)
    cfg = CodeexecRunConfig(model=args.model, out=args.out, conditions=args.conditions, policy=args.policy,
                            repetitions=args.repetitions, limit=args.limit, split=args.split, seed=args.seed,
                            bootstrap_seed=args.bootstrap_seed, n_boot=args.n_boot, agent=agent,
                            device=args.device, dtype=args.dtype, backend=args.backend,
                            progress=not args.no_progress)
    edit = None
    if args.edit:
        from steering.edits import load_edit

        edit = load_edit(args.edit)
    result = evaluate_codeexec(cfg, edit=edit)
    print(result.table_text)
    print(f"\nrun directory: {result.root}  ({len(result.records)} trials; {result.n_new} new)")
    return 0


def cmd_codeexec_extract(args: argparse.Namespace) -> int:
    _prepare_sandbox(args)
    from memtoc.codeexec.agent import AgentConfig
    from memtoc.codeexec.capture import CodeexecExtractConfig, extract_codeexec

    agent = AgentConfig(max_tool_rounds=args.max_tool_rounds, protocol=args.protocol, timeout_s=args.timeout_s,
                        cpu_s=args.cpu_s, memory_mb=args.memory_mb, first_call="scripted")
    cfg = CodeexecExtractConfig(model=args.model, out=args.out, split=args.split, conditions=args.conditions,
                                policy=args.policy, limit=args.limit, seed=args.seed, layers=args.layers,
                                positions=args.positions, batch_size=args.batch_size, agent=agent, device=args.device,
                                dtype=args.dtype, store_dtype=args.store_dtype, progress=not args.no_progress)
    res = extract_codeexec(cfg)
    state = "complete" if res["complete"] else "incomplete"
    print(f"{res['path']}: {res['n_done']} of {res['n_planned']} prompts stored ({res['n_new']} new; {state})")
    return 0


def add_codeexec_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``memtoc codeexec evaluate``."""
    top = sub.add_parser("codeexec", help="corrupted code-executor family: agent runs with a real Python tool")
    csub = top.add_subparsers(dest="codeexec_command", required=True)
    p = csub.add_parser("evaluate", help="run the agent loop over problems x conditions; writes run.json, "
                        "trials.jsonl, summary.json (resumable)")
    p.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M-Instruct), a .gguf file, "
                   "a local model directory, or a hub id")
    p.add_argument("--conditions", default="all", help="comma list of no_tool,P0,P1+,P1-,P2+,P2-, or all")
    p.add_argument("--policy", choices=POLICIES, default="Plain")
    p.add_argument("--repetitions", type=int, default=1,
                   help="runs per problem x condition (identical under greedy decoding; kept for sampled backends)")
    p.add_argument("--limit", type=int, default=None, help="first N problems of the split")
    p.add_argument("--split", choices=("heldout", "dev", "all"), default="heldout")
    p.add_argument("--seed", type=int, default=0, help="problem and corruption-factor seed")
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--n-boot", type=int, default=1000)
    p.add_argument("--max-tool-rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--protocol", choices=("auto", "native", "text"), default="auto",
                   help="tool-call format: native chat-template tools, or ```python blocks (auto: detect)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="sandbox wall-clock limit per execution")
    p.add_argument("--cpu-s", type=int, default=5, help="sandbox CPU-time limit per execution")
    p.add_argument("--memory-mb", type=int, default=512, help="sandbox address-space limit per execution")
    p.add_argument("--require-isolation", action="store_true",
                   help="refuse to run unless the sandbox's kernel isolation (Landlock, network namespace, "
                        "seccomp) is all in force here (see docs/sandbox.md)")
    p.add_argument("--first-call", choices=("model", "scripted"), default="model",
                   help="scripted: the first assistant turn of the tool conditions is the problem's scripted "
                        "python_executor call (really run), so every trial sees a tool return")
    p.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    p.add_argument("--edit", default=None, help="edit spec applied to every model turn (hf backend)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", required=True, help="run directory (resumed if it exists with the same settings)")
    p.set_defaults(func=cmd_codeexec_evaluate)

    p = csub.add_parser("extract", help="residual stream at the final prompt token after the (scripted) first tool "
                        "return -> HDF5 activation store (for memtoc probe / memtoc direction)")
    p.add_argument("--model", default="default")
    p.add_argument("--split", choices=("heldout", "dev", "all"), default="dev")
    p.add_argument("--conditions", default="P0,P1+,P1-", help="comma list of P0,P1+,P1-,P2+,P2-")
    p.add_argument("--policy", choices=POLICIES, default="Plain")
    p.add_argument("--limit", type=int, default=None, help="first N problems of the split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default="all", help="sites: all | last | N | N-M, comma separated (0 = embedding output)")
    p.add_argument("--positions", default="last_input", help="last_input,tool_span,from_tool_return")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tool-rounds", type=int, default=2, help="as in the runs the activations describe")
    p.add_argument("--protocol", choices=("auto", "native", "text"), default="auto")
    p.add_argument("--timeout-s", type=float, default=5.0)
    p.add_argument("--cpu-s", type=int, default=5)
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--require-isolation", action="store_true", help="as for codeexec evaluate")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--store-dtype", default="auto")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", required=True, help="HDF5 store (resumed if it exists with the same settings)")
    p.set_defaults(func=cmd_codeexec_extract)
