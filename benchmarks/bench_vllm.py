"""vLLM against the hf backend on the default model: generation, capture, edits and a 4-strength sweep.

    .venv/bin/python benchmarks/bench_vllm.py --n 32 --max-new-tokens 64 --out bench_out/vllm.json
    (make bench runs it through benchmarks/run_all.py; it needs `make vllm` first)

Each backend is timed in its OWN process, never both in one: vLLM's CPU worker threads spin while idle and slow
anything beside them (timed in one process the generation ratio read 6-7x in vLLM's favour; apart it is < 1x on
2 cores). The parent starts one worker per backend (hf under this interpreter, vllm under ``--vllm-python``,
default ``.venv-vllm/bin/python``); each loads its model once and times, in ``--rounds`` rounds:

- ``generate``: the same prompts to the same budget (greedy, float32; hf batched with ``--batch-size``);
- ``capture``: one forward over the prompts with capture of every site at ``last_input`` (vs the same forward
  without capture: the overhead ratio); and the capture grid ``capture_{last,every}_{one,all}``: positions
  ``last_input`` or every position (``all``), one site (the middle one) or every site, each against the plain
  forward (vLLM captures in its worker: pinned host buffers, non-blocking copies, one device sync per step);
- ``edit``: generation with a direction edit at ``from_tool_return`` (vs untreated: the overhead ratio);
- ``sweep``: 4 strengths of that edit over the prompts -- vLLM as one pass with a strength per request, hf as one
  batched pass per strength (hf has one strength per batch).

The parent reports per-backend seconds, the ratios hf / vllm (> 1 = vLLM faster), the overhead ratios, and how
many generations agree token for token between the two backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STRENGTHS = (0.0, 1.0, 2.0, 4.0)


def _prompts(n: int):
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",), conditions=("tool_wrong",))
    eps = (eps * (n // max(len(eps), 1) + 1))[:n]
    return [e.prompt for e in eps], [e.tool_output_span for e in eps]


def _edit(d: int):
    import torch

    from steering.kinds.direction import DirectionEdit

    g = torch.Generator().manual_seed(0)
    u = torch.randn(d, generator=g)
    return DirectionEdit.build(name="bench", layers=[12], vectors={12: u / u.norm()}, scale={12: 8.0},
                               positions="from_tool_return", strength=1.0)


def _lengths(model: str, prompts) -> list[list[int]]:
    """Token ids of the formatted prompts, from the model's tokenizer alone (no weights loaded)."""
    from transformers import AutoTokenizer

    from memtoc.backends.chat import format_conversation, uses_chat_template
    from memtoc.backends.models import resolve_model
    from memtoc.backends.tokens import encode_texts

    from memtoc.backends.gguf_cache import model_dir

    tok = AutoTokenizer.from_pretrained(model_dir(resolve_model(model)))   # the directory vLLM loads
    chat = uses_chat_template(tok)
    return list(encode_texts(tok, [format_conversation(tok, p, chat=chat) for p in prompts], chat=chat).rows)


def worker(args: argparse.Namespace) -> dict:
    """Time every task on one backend (this process holds only that backend)."""
    from activations.capture import ResidualCapture
    from memtoc.core.runtime import GenerationConfig
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    t0 = time.perf_counter()
    prompts, spans = _prompts(args.n)
    spec = ModelSpec(model=args.model, backend=args.worker, dtype=args.dtype, device=args.device)
    if args.worker == "vllm":          # the engine's context: the longest prompt plus the budget
        from dataclasses import replace

        from memtoc.backends.vllm import max_model_len_for

        longest = max(len(ids) for ids in _lengths(args.model, prompts))
        spec = replace(spec, max_model_len=max_model_len_for(longest, args.max_new_tokens))
    b = load_backend(spec)
    load_s = time.perf_counter() - t0
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_at_final_line=False)
    bs = args.batch_size if args.worker == "hf" else len(prompts)
    edit = _edit(b.site_info.d_model)
    sites = list(range(b.site_info.n_sites))

    def batches(fn):
        out = []
        for i in range(0, len(prompts), bs):
            out += fn(prompts[i:i + bs], spans[i:i + bs])
        return out

    def gen():
        return batches(lambda p, s: b.generate(p, cfg))

    def fwd():
        return batches(lambda p, s: [b.forward(p)])

    def cap():
        return batches(lambda p, s: [b.forward(p, capture=ResidualCapture(sites, "last_input", prompts=p))])

    def grid(positions, where):
        def run():
            return batches(lambda p, s: [b.forward(p, capture=ResidualCapture(where, positions, prompts=p))])
        return run

    def edited():
        return batches(lambda p, s: b.generate(p, cfg, edit=edit.bind(p, s)))

    def sweep():
        if args.worker == "vllm":      # one pass, a strength per request
            P, S = prompts * len(STRENGTHS), spans * len(STRENGTHS)
            st = [x for x in STRENGTHS for _ in prompts]
            return b.generate(P, cfg, edit=edit.bind(P, S, strengths=st))
        out = []
        for x in STRENGTHS:         # one strength per batch on hf
            ex = edit.with_strength(x)
            out += batches(lambda p, s, _e=ex: b.generate(p, cfg, edit=_e.bind(p, s)))
        return out

    tasks = {"generate": gen, "forward": fwd, "capture": cap, "edit": edited, "sweep": sweep}
    mid = [len(sites) // 2]
    for pk, pos in (("last", "last_input"), ("every", "all")):
        for sk, where in (("one", mid), ("all", sites)):
            tasks[f"capture_{pk}_{sk}"] = grid(pos, where)
    times = {k: [] for k in tasks}
    outs = {}
    for r in range(args.rounds):
        names = list(tasks)
        for k in names[r % len(names):] + names[:r % len(names)]:
            t = time.perf_counter()
            outs[k] = tasks[k]()
            times[k].append(time.perf_counter() - t)
    return {"backend": args.worker, "load_s": round(load_s, 1), "seconds": times,
            "tokens": {k: [list(g.token_ids) for g in outs[k]] for k in ("generate", "edit", "sweep")},
            "generated_tokens": sum(g.n_new_tokens for g in outs["generate"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--n", type=int, default=32, help="prompts (demo tool_wrong episodes, repeated)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16, help="hf batch size (vLLM schedules its own)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (benchmarks/gpu_check.sh is the GPU check)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
    ap.add_argument("--worker", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        Path(args.worker_out).write_text(json.dumps(worker(args)))
        return 0
    sys.path.insert(0, str(HERE))
    import _guard

    if not Path(args.vllm_python).exists():
        print(f"bench_vllm: {args.vllm_python} is missing; build it with `make vllm`", file=sys.stderr)
        return 2
    common = ["--model", args.model, "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
              "--batch-size", str(args.batch_size), "--rounds", str(args.rounds), "--device", args.device,
              "--dtype", args.dtype]
    results = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}     # vLLM's default engine: multiprocess
    with _guard.Guard("bench_vllm") as guard:
        for name, py in (("hf", sys.executable), ("vllm", args.vllm_python)):
            out = Path(args.output or "bench_vllm.json").with_suffix(f".{name}.json")
            subprocess.run([py, str(Path(__file__).resolve()), "--worker", name, "--worker-out", str(out), *common],
                           cwd=REPO, env=env, check=True)
            results[name] = json.loads(out.read_text())
    v = results["vllm"]["seconds"]
    med = {b: {k: _guard.summarize(t)["median"] for k, t in results[b]["seconds"].items()} for b in results}
    gen_ratio = _guard.summarize([med["hf"]["generate"] / x for x in v["generate"]])
    sweep_ratio = _guard.summarize([med["hf"]["sweep"] / x for x in v["sweep"]])
    cap_over = {b: _guard.ratios(results[b]["seconds"]["capture"], results[b]["seconds"]["forward"]) for b in results}
    edit_over = {b: _guard.ratios(results[b]["seconds"]["edit"], results[b]["seconds"]["generate"]) for b in results}
    grid = {b: {k: _guard.ratios(t, results[b]["seconds"]["forward"]) for k, t in results[b]["seconds"].items()
                if k.startswith("capture_")} for b in results}
    agree = {k: sum(a == b for a, b in zip(results["hf"]["tokens"][k], results["vllm"]["tokens"][k]))
             for k in ("generate", "edit", "sweep")}
    res = {"model": args.model, "n_prompts": args.n, "max_new_tokens": args.max_new_tokens,
           "hf_batch_size": args.batch_size, "median_seconds": med,
           "load_seconds": {b: results[b]["load_s"] for b in results},
           "generate_hf_over_vllm": gen_ratio, "sweep4_hf_over_vllm": sweep_ratio,
           "capture_overhead": cap_over, "edit_overhead": edit_over, "capture_grid_over_forward": grid,
           "identical_token_ids": {k: f"{n}/{len(results['hf']['tokens'][k])}" for k, n in agree.items()},
           "generated_tokens": results["hf"]["generated_tokens"]}
    guard.finish(res, [
        _guard.figure(f"generate: hf batched s / vllm s ({args.n} x {args.max_new_tokens} tok)", gen_ratio),
        _guard.figure("4-strength sweep: hf (4 passes) s / vllm (1 pass) s", sweep_ratio),
        _guard.figure("vllm capture (all sites, last_input) / plain forward", cap_over["vllm"]),
        _guard.figure("vllm edited / untreated generation", edit_over["vllm"]),
        _guard.figure("hf capture / plain forward", cap_over["hf"]),
        _guard.figure("hf edited / untreated generation", edit_over["hf"]),
        *[_guard.figure(f"{b} {k} / plain forward", r) for b in ("vllm", "hf") for k, r in grid[b].items()]])
    print(json.dumps(res, indent=1))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
