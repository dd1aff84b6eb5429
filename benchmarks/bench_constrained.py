"""Constrained-decoding overhead: xgrammar-masked vs free decoding of tool calls on the hf backend, one process.

Both arms go through ``HFBackend.generate_guided`` (the backend's own decoding loop), greedy, on the same prompts
(an agent call turn of the demo questions, guided protocol, text tool protocol), in the same batches:

- ``free``: no schema;
- ``constrained``: each row masked by the xgrammar grammar of its question's call schema
  (``memtoc.backends.guided.call_schema``); grammars compiled once beforehand (compile time reported apart).

The arms stop at different lengths (a constrained call ends at its closing brace), so the figure is wall time
per generated token; rounds interleave the arms (rotated order) so machine load affects both alike. Reported:
median ms/token per arm, their ratio, the grammar compile time, and the share of constrained calls that
validate against their schema (should be 1.0).

    .venv/bin/python benchmarks/bench_constrained.py --model default --n-prompts 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", "--output", dest="out", default=None, help="write the result JSON here")
    a = ap.parse_args()
    from benchmarks import _guard

    from memtoc.tasks.agent.calls import check_call, find_call
    from memtoc.tasks.agent.loop import AgentItem, AgentSpec, _start, detect_tool_protocol
    from memtoc.tasks.agent.protocols import load_agent_prompts
    from memtoc.tasks.agent.schemas import load_demo_schemas
    from memtoc.core.runtime import GenerationConfig
    from memtoc.backends.guided import GREEDY, GrammarCompiler, call_schema
    from memtoc.backends.factory import load_backend
    from memtoc.core.config import ModelSpec
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.toolchat import render

    guard = _guard.Guard("bench_constrained").__enter__()
    backend = load_backend(ModelSpec(model=a.model, backend="hf", device="cpu", dtype="float32"))
    schemas = load_demo_schemas()
    prompts = load_agent_prompts()
    qs = load_benchmark("demo").questions[:a.n_prompts]
    tp = detect_tool_protocol(backend.tokenizer, backend.chat, schemas[qs[0].id])
    texts, rows = [], []
    for q in qs:
        it = AgentItem(q.id, q.id, "reference", q.question, q.gold_answer, (), {"result": q.gold_answer}, "", True,
                       None, schemas[q.id])
        st = _start(AgentSpec(it, "guided"), prompts, tp, "constrained")
        texts.append(render(backend.tokenizer, st.messages, chat=backend.chat,
                            tools=[it.schema] if tp == "native" else None))
        rows.append(call_schema(it.schema))
    t0 = time.perf_counter()
    comp = GrammarCompiler.of(backend)
    for s in rows:
        comp.compile(s)
    compile_s = time.perf_counter() - t0
    cfg = GenerationConfig(max_new_tokens=a.max_new_tokens, stop_at_final_line=False)
    per_token: dict[str, list[float]] = {"free": [], "constrained": []}
    valid = []
    for r in range(_guard.check_rounds(a.rounds)):
        order = ["free", "constrained"] if r % 2 == 0 else ["constrained", "free"]
        for arm in order:
            t = time.perf_counter()
            gens = backend.generate_guided(texts, cfg, schemas=rows if arm == "constrained" else None, sampling=GREEDY)
            dt = time.perf_counter() - t
            per_token[arm].append(1000 * dt / max(1, sum(g.n_new_tokens for g in gens)))
            if arm == "constrained":
                valid += [check_call(find_call(g.text, required=True), schemas[q.id]).valid for g, q in zip(gens, qs)]
    med = {k: statistics.median(v) for k, v in per_token.items()}
    ratio = _guard.ratios(per_token["constrained"], per_token["free"])
    res = {"model": a.model, "tool_protocol": tp, "n_prompts": len(texts), "rounds": a.rounds,
           "max_new_tokens": a.max_new_tokens, "ms_per_token": med,
           "ms_per_token_rounds": {k: _guard.summarize(v) for k, v in per_token.items()},
           "ratio": ratio["median"], "ratio_rounds": ratio,
           "grammar_compile_s": compile_s, "constrained_valid_share": sum(valid) / len(valid)}
    guard.finish(res, [_guard.figure("constrained / free, time per generated token", ratio, goal="small"),
                       _guard.figure("constrained calls schema-valid",
                                     _guard.summarize([res["constrained_valid_share"]]), unit="")])
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
