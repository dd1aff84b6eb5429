"""The GPU check for the machine this project borrows (one GPU; torch, transformers, safetensors, numpy, h5py,
pandas, scikit-learn, peft, pytest; no vLLM, no gguf, no sae-lens, no network). It asserts and writes JSON:

    bash benchmarks/gpu_check.sh --out OUT.json            (docs/BENCHMARKS.md: the one device command)

The model is built there: seeded random weights in the default model's shape (SmolLM2-135M-Instruct, from the
config and tokenizer in ``benchmarks/gpu_check_model/``), bf16 on CUDA, float32 on CPU. Each claim is a function
of ``benchmarks/gpu_checks.py``:

- **capture**: hf capture at every prompt position kind equals ``output_hidden_states`` of the same forward,
  exactly;
- **direction**: a direction edit equals ``x + strength * scale * u`` at the planned positions (last_input,
  tool_span, from_tool_return) and nowhere else;
- **sae_clamp**: an SAE clamp edit (a random ReLU SAE, no sae-lens) on the device equals the clamp's arithmetic
  within one ulp at the planned positions, exactly elsewhere;
- **staged_capture**: vLLM's capture path (``TokenCapture``: pinned buffers, non-blocking copies, CUDA events,
  the last flush outside inference mode) through the worker extension over a fake vLLM worker, forwards under
  ``torch.inference_mode()``, tensor parallel 2 and pipeline parallel 2, against the un-split model;
- **sweep**: 4 strengths as rows of one batch; strength 0 within the bound the JSON states of the untreated run.

The JSON records what ran, each bound, the device, versions, timings and figures; a failed assertion exits 1
naming it. On CUDA where vLLM imports (``--vllm-python``), the older hf-vs-vLLM comparison runs as well, on the same
random model saved beside the JSON; without vLLM (the borrowed machine) the check says so and skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STRENGTHS = (0.0, 1.0, 2.0, 4.0)
#: the default size per device: (prompts, new tokens per prompt); cpu: under 2 minutes on two cores.
SIZES = {"cuda": (16, 32), "cpu": (2, 4)}
#: the vLLM comparison's size (one lease of an H100-class GPU with an 8B model fits it)
VLLM_SIZE = (64, 64)
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
    """One backend's half of the optional hf-vs-vLLM comparison, in this process (which holds only that backend)."""
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
    n, new = VLLM_SIZE
    cmd = [python, str(Path(__file__).resolve()), "--half", name, "--half-out", str(out), "--capture-out", str(cap),
           "--model", args.model, "--n", str(n), "--max-new-tokens", str(new),
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


def _versions() -> dict:
    import numpy
    import torch
    import transformers

    v = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
         "numpy": numpy.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        v["device_name"] = torch.cuda.get_device_name(0)
        v["driver_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return v


def run_checks(args: argparse.Namespace) -> dict:
    """Build the model and run every check (a check that raises is a failed check, named with its error)."""
    import torch

    import gpu_checks as C

    dtype = getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else (platform.processor() or platform.machine())
    res: dict = {"device": args.device, "device_name": name, "dtype": args.dtype, "versions": _versions(),
                 "seed": args.seed, "n_prompts": args.n, "max_new_tokens": args.max_new_tokens, "timings_s": {},
                 "cpu_s": {}, "checks": {}}
    t = time.perf_counter()
    if args.weights:                            # trained weights: the bf16 bounds meet real logit margins
        from memtoc.backends.factory import load_backend
        from memtoc.core.runtime import ModelSpec

        b = load_backend(ModelSpec(model=args.weights, backend="hf", dtype=args.dtype, device=args.device))
    else:
        b = C.build_backend(args.device, dtype, args.seed, Path(args.model_dir))
    if args.device == "cuda":
        torch.cuda.synchronize()
    res["timings_s"]["build_model"] = round(time.perf_counter() - t, 2)
    print(f"gpu_check: model built on {args.device} ({res['timings_s']['build_model']} s)", file=sys.stderr, flush=True)
    info = b.site_info
    source = args.weights or f"random weights, seed {args.seed}, config and tokenizer of {args.model_dir}"
    res["model"] = {"source": source,
                    "architecture": type(b.model).__name__, "n_layers": info.n_layers, "d_model": info.d_model,
                    "n_params": sum(p.numel() for p in b.model.parameters()), "dtype": info.dtype,
                    "device": info.device}
    ps, spans = C.prompts(args.n)
    site = info.n_layers // 2
    plain = C.read_plain(b, ps, site)                  # the edit checks' unedited stream
    real = b.encode(ps)["attention_mask"].bool()
    scale = C._pow2(float(plain[site][real].float().norm(dim=-1).mean()))    # the stream's own size, a power of 2
    res["edit"] = {"site": site, "scale": scale}
    checks = {
        "capture": lambda: C.check_capture(b, ps, spans),
        "direction": lambda: C.check_direction(b, ps, spans, site, scale, plain),
        "sae_clamp": lambda: C.check_sae_clamp(b, ps, spans, site, plain),
        "staged_capture": lambda: C.check_staged_capture(args.device, dtype, info.d_model),
        "sweep": lambda: C.check_sweep(b, ps, spans, site, scale, args.max_new_tokens),
    }
    for name, fn in checks.items():
        if args.only and name not in args.only:
            continue
        t, cpu = time.perf_counter(), time.process_time()
        try:
            res["checks"][name] = fn()
        except Exception as exc:  # noqa: BLE001 - one check's error fails that check, the others still run
            res["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if args.device == "cuda":
            torch.cuda.synchronize()
        res["timings_s"][name] = round(time.perf_counter() - t, 2)
        res["cpu_s"][name] = round(time.process_time() - cpu, 2)
        verdict = "ok" if res["checks"][name].get("ok") else "FAILED"
        print(f"gpu_check: {name} {verdict} ({res['timings_s'][name]} s)", file=sys.stderr, flush=True)
    if args.save_model:
        b.model.save_pretrained(args.save_model)
        b.tokenizer.save_pretrained(args.save_model)
    return res


def _vllm_comparison(args: argparse.Namespace, res: dict) -> list[str]:
    """The hf-vs-vLLM comparison on the saved random model, each half in its own process; failures by name."""
    hf = _run_half(args.hf_python, "hf", args, [])
    failed = [f"hf: {k}" for k, ok in hf["checks"].items() if not ok]
    v = _run_half(args.vllm_python, "vllm", args, ["--longest-prompt", str(hf["longest_prompt"]),
                                                      "--edit-scale", str(hf["edit_scale"])])
    err = _capture_error(hf["capture_file"], v["capture_file"])
    bound = CAPTURE_RTOL.get(args.dtype, CAPTURE_RTOL["bfloat16"])
    v["checks"]["capture within the bound of hf"] = err["max"] < bound[0] and err["median"] < bound[1]
    failed += [f"vllm: {k}" for k, ok in v["checks"].items() if not ok]
    same = sum(a == b for a, b in zip(hf["tokens"]["plain"], v["tokens"]["plain"]))
    res["vllm"] = {"hf": {k: val for k, val in hf.items() if k != "tokens"},
                   "vllm": {k: val for k, val in v.items() if k != "tokens"},
                   "capture_rel_error": {**err, "bound_max": bound[0], "bound_median": bound[1]},
                   "ratios_hf_over_vllm": {k: hf[k] / v[k] for k in ("generate_s", "capture_s", "sweep4_s") if v[k]},
                   "identical_untreated_generations": f"{same}/{len(hf['tokens']['plain'])}"}
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", "--output", dest="output", default="bench_out/gpu_check.json")
    ap.add_argument("--device", default="auto", help="auto (cuda when torch sees one), cuda or cpu")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on cuda, float32 on cpu) or a torch dtype")
    ap.add_argument("--n", type=int, default=None, help="prompts (demo episodes; the last one without a tool); "
                    "default per device: " + ", ".join(f"{k} {v[0]}" for k, v in SIZES.items()))
    ap.add_argument("--max-new-tokens", type=int, default=None, help="the sweep's; default per device: " + ", ".join(
        f"{k} {v[1]}" for k, v in SIZES.items()))
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--model-dir", default=str(HERE / "gpu_check_model"), help="config + tokenizer to build from")
    ap.add_argument("--weights", default="", help="a trained model (a .gguf file, a model directory or 'default') "
                    "instead of the random one; needs what loading it needs (gguf for a .gguf)")
    ap.add_argument("--only", default="", help="comma list of checks to run (default: all)")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"),
                    help="a python with vllm: runs the hf-vs-vLLM comparison too (skipped when vllm does not import)")
    ap.add_argument("--hf-python", default=sys.executable)
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)        # the comparison's halves
    ap.add_argument("--save-model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--half", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    ap.add_argument("--half-out", help=argparse.SUPPRESS)
    ap.add_argument("--capture-out", help=argparse.SUPPRESS)
    ap.add_argument("--longest-prompt", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--edit-scale", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.half:
        Path(args.half_out).write_text(json.dumps(half(args)))
        return 0
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype == "auto":
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    n, new = SIZES.get(args.device, SIZES["cuda"])
    args.n = n if args.n is None else args.n
    args.max_new_tokens = new if args.max_new_tokens is None else args.max_new_tokens
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    out = Path(args.output)
    if args.weights and Path(args.weights).exists():
        w = Path(args.weights).resolve()
        if out.resolve() == w or w in out.resolve().parents:
            ap.error(f"--out {args.output} is the model --weights {args.weights} reads, or inside it")
    out.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]           # a figure taken on a busy machine says so
    t0 = time.perf_counter()
    why = "it compares the backends on CUDA" if args.device != "cuda" else _vllm_importable(args.vllm_python)
    if why is None:
        args.save_model = args.model = str(out.with_suffix(".model"))
    res = run_checks(args)
    failed = [f"{name}: " + (c.get("error") or "assertion failed (see its record)")
              for name, c in res["checks"].items() if not c.get("ok")]
    if why is not None:
        res["vllm"] = f"not run: the hf-vs-vLLM comparison needs vLLM on CUDA ({why}); the checks above ran without it"
        print(f"gpu_check: the hf-vs-vLLM comparison did not run ({why})", file=sys.stderr)
    else:
        failed += _vllm_comparison(args, res)
    res["ran"] = list(res["checks"])
    res["bounds"] = {name: c.get("bound", "not reached: " + c.get("error", "")) for name, c in res["checks"].items()}
    res["failed"] = failed
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["load_1min"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2),
                        "cpus": os.cpu_count()}
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    if failed:
        print("gpu_check FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"gpu_check: all {len(res['checks'])} checks passed ({res['wall_s']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
