"""The GPU check: hf on CUDA, then vLLM on CUDA where it is installed, each in its own process; it asserts.

    benchmarks/gpu_check.sh [MODEL] [OUT.json]         (MODEL: default, or a local 8B checkpoint directory)

Sized for one lease: at most 8 minutes on an H100-class GPU with the default model or an 8B checkpoint
(``--n`` prompts x ``--max-new-tokens``; the defaults fit). Each half loads its model once and:

- **hf** (always): untreated greedy generation (timed), capture of every site at ``last_input`` (kept for the
  vLLM half), and a 4-strength sweep of a direction edit as rows of ONE batch (timed); asserts the strength-0
  rows equal the untreated generation token for token and that the edit changes something.
- **vLLM** (when ``--vllm-python`` imports vllm; the GPU machines this project borrows have none, and the check
  then says so and ends after the hf half): the same untreated generation (timed), the same capture, compared
  with hf's row by row within the bf16 bound (``CAPTURE_RTOL``), and the 4-strength sweep in ONE engine pass (a
  strength per request); asserts the bound, strength 0 equal to vLLM's untreated tokens, and the one pass.

The figures (seconds, hf/vLLM throughput ratios, capture errors, what ran) go to ``OUT.json``. An assertion
failing exits 1 naming it. ``--device cpu --dtype float32`` runs the same on CPU at a CPU size (``SIZES``: 16
prompts x 32 tokens unless ``--n`` / ``--max-new-tokens`` say otherwise; its hf half is meant to take under 2
minutes on two cores with the default model); the test suite runs the hf half that way with a tiny budget.
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
#: the default size per device: (prompts, new tokens per prompt). cuda: one lease of an H100-class GPU with an 8B
#: model; cpu: the hf half in under 2 minutes on two cores with the default model.
SIZES = {"cuda": (64, 64), "cpu": (16, 32)}
#: hf-CUDA vs vLLM-CUDA residual stream at bf16, relative error per captured row: both round every block's output
#: to bf16 (8 bits of mantissa, 2^-8 = 0.4 % per rounding) and their kernels sum in different orders; the error
#: compounds over the blocks. The maximum over rows must stay below the first bound, the median below the second.
CAPTURE_RTOL = {"bfloat16": (0.08, 0.02), "float16": (0.04, 0.01), "float32": (1e-4, 1e-5)}


def _prompts(n: int):
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",), conditions=("tool_wrong",))
    eps = (eps * (n // max(len(eps), 1) + 1))[:n]
    return [e.prompt for e in eps], [e.tool_output_span for e in eps]


def _edit(d: int, site: int, norm: float):
    """A random direction at ``site`` whose unit strength is the stream's own mean norm there (any model size)."""
    import torch

    from steering.kinds.direction import DirectionEdit

    u = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return DirectionEdit.build(name="gpu-check", layers=[site], vectors={site: u / u.norm()}, scale={site: norm},
                               positions="from_tool_return", strength=1.0)


def half(args: argparse.Namespace) -> dict:
    """One backend's half, in this process (which holds only that backend)."""
    import numpy as np
    import torch

    from activations.capture import ResidualCapture
    from memtoc.core.runtime import GenerationConfig
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    prompts, spans = _prompts(args.n)
    spec = ModelSpec(model=args.model, backend=args.half, dtype=args.dtype, device=args.device)
    if args.half == "vllm":
        from dataclasses import replace

        from memtoc.backends.vllm import max_model_len_for

        spec = replace(spec, max_model_len=max_model_len_for(args.longest_prompt, args.max_new_tokens))
    t = time.perf_counter()
    b = load_backend(spec)
    out: dict = {"backend": args.half, "load_s": round(time.perf_counter() - t, 1),
                 "dtype": b.site_info.dtype, "device": b.site_info.device}
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_at_final_line=False,
                           batch_size=len(prompts))
    b.generate(prompts[:2], GenerationConfig(max_new_tokens=2))          # warm-up (kernels, allocator)
    if args.device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    plain = b.generate(prompts, cfg)
    out["generate_s"] = time.perf_counter() - t
    out["generated_tokens"] = sum(g.n_new_tokens for g in plain)
    sites = list(range(b.site_info.n_sites))
    t = time.perf_counter()
    cap = ResidualCapture(sites, "last_input", prompts=prompts)
    b.forward(prompts, capture=cap)
    out["capture_s"] = time.perf_counter() - t
    np.savez(args.capture_out, **{str(s): cap.values[s].float().numpy() for s in sites})
    mid = b.site_info.n_sites // 2
    scale = args.edit_scale or float(cap.values[mid].float().norm(dim=-1).mean())    # vLLM: hf's, the same edit
    out["edit_scale"] = scale
    edit = _edit(b.site_info.d_model, mid, scale)
    P, S = prompts * len(STRENGTHS), spans * len(STRENGTHS)
    strengths = [x for x in STRENGTHS for _ in prompts]
    t = time.perf_counter()
    swept = b.generate(P, cfg, edit=edit.bind(P, S, strengths=strengths))      # one batch / one engine pass
    out["sweep4_s"] = time.perf_counter() - t
    out["longest_prompt"] = max(g.n_prompt_tokens for g in plain)
    n = len(prompts)
    out["tokens"] = {"plain": [list(g.token_ids) for g in plain], "sweep": [list(g.token_ids) for g in swept]}
    out["checks"] = {
        "strength 0 equals untreated": [g.token_ids for g in swept[:n]] == [g.token_ids for g in plain],
        "the edit changes tokens": any(a.token_ids != g.token_ids for a, g in zip(swept[n:], plain * 3)),
    }
    return out


def _vllm_importable(python: str) -> str | None:
    """None when ``python`` imports vllm; else why not (one line)."""
    if not Path(python).exists():
        return f"{python} does not exist"
    r = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["import vllm failed"])[-1]


def _run_half(python: str, name: str, args: argparse.Namespace, extra: list[str]) -> dict:
    out = Path(args.output).with_suffix(f".{name}.json")
    cap = Path(args.output).with_suffix(f".{name}.npz")
    cmd = [python, str(Path(__file__).resolve()), "--half", name, "--half-out", str(out), "--capture-out", str(cap),
           "--model", args.model, "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
           "--device", args.device, "--dtype", args.dtype, *extra]
    subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    res = json.loads(out.read_text())
    res["capture_file"] = str(cap)
    return res


def _capture_error(a: str, b: str) -> dict:
    import numpy as np

    x, y = np.load(a), np.load(b)
    worst, medians = 0.0, []
    for s in x.files:
        u, v = x[s].astype(np.float64), y[s].astype(np.float64)
        rel = np.linalg.norm(u - v, axis=-1) / np.maximum(np.linalg.norm(u, axis=-1), 1e-12)
        worst = max(worst, float(rel.max()))
        medians.append(float(np.median(rel)))
    return {"max": worst, "median": float(np.median(medians)), "sites": len(x.files)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="default, or a local checkpoint directory (8B-class)")
    ap.add_argument("--n", type=int, default=None,
                    help="prompts (demo tool_wrong episodes, repeated); default per device: " + ", ".join(
                        f"{k} {v[0]}" for k, v in SIZES.items()))
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default per device: " + ", ".join(
        f"{k} {v[1]}" for k, v in SIZES.items()))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--hf-python", default=sys.executable)
    ap.add_argument("--out", "--output", dest="output", default="bench_out/gpu_check.json")
    ap.add_argument("--half", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    ap.add_argument("--half-out", help=argparse.SUPPRESS)
    ap.add_argument("--capture-out", help=argparse.SUPPRESS)
    ap.add_argument("--longest-prompt", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--edit-scale", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n, new = SIZES.get(args.device, SIZES["cuda"])
    args.n = n if args.n is None else args.n
    args.max_new_tokens = new if args.max_new_tokens is None else args.max_new_tokens
    if args.half:
        Path(args.half_out).write_text(json.dumps(half(args)))
        return 0
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]           # a figure taken on a busy machine says so
    t0 = time.perf_counter()
    hf = _run_half(args.hf_python, "hf", args, [])
    res: dict = {"model": args.model, "device": args.device, "dtype": args.dtype, "n_prompts": args.n,
                 "max_new_tokens": args.max_new_tokens, "hf": {k: v for k, v in hf.items() if k != "tokens"}}
    failed = [f"hf: {k}" for k, ok in hf["checks"].items() if not ok]
    why = _vllm_importable(args.vllm_python)
    if why is not None:
        res["vllm"] = f"not run: vLLM is not installed here ({why}); this was the hf half only"
        print(f"gpu_check: vLLM is not installed here ({why}): ran the hf half only", file=sys.stderr)
    else:
        v = _run_half(args.vllm_python, "vllm", args, ["--longest-prompt", str(hf["longest_prompt"]),
                                                          "--edit-scale", str(hf["edit_scale"])])
        err = _capture_error(hf["capture_file"], v["capture_file"])
        bound = CAPTURE_RTOL.get(args.dtype, CAPTURE_RTOL["bfloat16"])
        v["checks"]["capture within the bound of hf"] = err["max"] < bound[0] and err["median"] < bound[1]
        failed += [f"vllm: {k}" for k, ok in v["checks"].items() if not ok]
        same = sum(a == b for a, b in zip(hf["tokens"]["plain"], v["tokens"]["plain"]))
        res["vllm"] = {k: val for k, val in v.items() if k != "tokens"}
        res["capture_rel_error"] = {**err, "bound_max": bound[0], "bound_median": bound[1]}
        res["ratios_hf_over_vllm"] = {k: hf[k] / v[k] for k in ("generate_s", "capture_s", "sweep4_s") if v[k]}
        res["identical_untreated_generations"] = f"{same}/{len(hf['tokens']['plain'])}"
    res["failed"] = failed
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["load_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2),
                        "cpus": os.cpu_count()}
    Path(args.output).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    if failed:
        print("gpu_check FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
