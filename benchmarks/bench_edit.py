"""Cost of edits during batched greedy generation with the hf backend, edited vs unedited in one run.

    .venv/bin/python benchmarks/bench_edit.py --model default --n 8 --max-new-tokens 48 --rounds 4

Variants (interleaved, ``--rounds`` times each, the order rotated every round; medians are reported, of wall time
and of process CPU time, which is less disturbed by other jobs on a shared machine):

- ``plain``: no edit;
- ``direction_last_input``: a direction edit at 3 sites on the last prompt token (prompt pass only);
- ``sae_clamp_from_tool_return``: a SpARE clamp at 4 sites through random sae-lens ``StandardSAE`` of width
  ``4 x d_model`` (64 features removed, 64 added per site), applied to every prompt token from the tool output on
  and to every generated token (an SAE encode per edited position per site per step);
- ``*_full_prefill``: the same two edits the way edited calls ran before issue 31 (``share_edited_prefix =
  False``: the whole left-padded prompt prefilled under the edit, no shared prefix), side by side.

The headline is the **edited / unedited wall ratio** per edit (goals: direction <= 1.10x, SAE clamp <= 1.25x),
printed last as ``HEADLINE``. The timed edits run at strength 0 (same hooks and the same arithmetic as any
strength, and the same tokens as ``plain``; the script checks it). End-of-sequence stopping is switched off
(``--keep-eos`` keeps it), so every row generates ``--max-new-tokens`` tokens and the per-step cost of a
``from_tool_return`` edit is fully exercised. ``edit_code_s`` is the time spent inside the edit's own code (row
layout and position plan, and every hook call that edits something). One edited run at a non-zero strength is
timed too. Targets: direction < 10 % extra, SAE clamp < 50 % extra (the edit's own code, apart from the decoding
path it runs on).

On a shared, loaded CPU the end-to-end medians swing by tens of percent between identical runs (other jobs take
the cores; OpenMP spin-waiting inflates CPU time too); ``edit_code_pct_of_plain_wall`` is then the reliable
figure, since it times the edit's own work directly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from steering.edits import BoundEdit

try:
    from benchmarks import _guard
except ImportError:          # run as a script: benchmarks/ is on sys.path
    import _guard

from memtoc.core.runtime import GenerationConfig, ModelSpec
from memtoc.backends import device_ops
from memtoc.backends.factory import load_backend
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from steering import DirectionEdit, SAEClampEdit


def _unit(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def _sae_edit(d: int, sites: list[int], n_feat: int, seed: int = 0) -> SAEClampEdit:
    from sae_lens import StandardSAE, StandardSAEConfig

    torch.manual_seed(seed)
    saes, feats = {}, {}
    g = torch.Generator().manual_seed(seed)
    for s in sites:
        sae = StandardSAE(StandardSAEConfig(d_in=d, d_sae=4 * d))
        with torch.no_grad():
            for p in sae.parameters():
                p.normal_(0, 0.05)
        saes[s] = sae.eval()
        ids = torch.randperm(4 * d, generator=g)[: 2 * n_feat].tolist()
        feats[str(s)] = {"remove": ids[:n_feat], "remove_targets": [0.5] * n_feat,
                         "add": ids[n_feat:], "add_targets": [1.0] * n_feat}
    spec = {"schema_version": "memtoc-edit-v1", "name": "bench-sae", "kind": "sae_clamp", "layers": sites,
            "positions": "from_tool_return", "strength": 0.0, "sae": {str(s): {"path": "in-memory"} for s in sites},
            "features": feats, "steer_toward": "memory", "force": True}
    return SAEClampEdit(spec, saes=saes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--n", type=int, default=8, help="prompts (one batch)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sae-features", type=int, default=64, help="features removed and added per site")
    ap.add_argument("--keep-eos", action="store_true", help="stop rows at end-of-sequence (default: generate "
                                                            "exactly --max-new-tokens per row)")
    ap.add_argument("--out", "--output", dest="output", help="write the figures as JSON")
    args = ap.parse_args()

    backend = load_backend(ModelSpec(model=args.model, backend="hf", device=args.device, dtype=args.dtype))
    if not args.keep_eos:
        backend.parts.model.generation_config.eos_token_id = None
    n_layers = backend.parts.n_layers
    d = backend.parts.d_model
    eps = build_episodes(load_benchmark("demo").questions, formulations=("reference",),
                         conditions=("tool_wrong", "tool_right"))[: args.n]
    prompts = [e.prompt for e in eps]
    spans = [e.tool_output_span for e in eps]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_at_final_line=False)
    mid = n_layers // 2
    dir_sites = [mid - 1, mid, mid + 1]
    sae_sites = [mid - 1, mid, mid + 1, mid + 2]
    direction = DirectionEdit.build(name="bench-direction", layers=dir_sites,
                                    vectors={s: _unit(d, s) for s in dir_sites}, scale={s: 4.0 for s in dir_sites},
                                    positions="last_input", strength=0.0)
    sae = _sae_edit(d, sae_sites, args.sae_features)
    variants = {
        "plain": lambda: None,
        "direction_last_input": lambda: direction.bind(prompts, spans),
        "sae_clamp_from_tool_return": lambda: sae.bind(prompts, spans),
        "direction_last_input_full_prefill": lambda: direction.bind(prompts, spans),
        "sae_clamp_from_tool_return_full_prefill": lambda: sae.bind(prompts, spans),
    }
    edited = ("direction_last_input", "sae_clamp_from_tool_return")
    def sync() -> None:
        device_ops.synchronize(args.device)

    live_edits = {"direction_last_input": direction.with_strength(8.0),
                  "sae_clamp_from_tool_return": sae.with_strength(2.0)}   # copies made before the timing wrappers
    # time spent inside the edit's own code: the row layout / position plan and every edit applied by a hook
    edit_clock = [0.0]
    make_plan = BoundEdit.make_plan

    def timed_make_plan(self, backend_, batch):
        t = time.perf_counter()
        try:
            return make_plan(self, backend_, batch)
        finally:
            edit_clock[0] += time.perf_counter() - t
    BoundEdit.make_plan = timed_make_plan
    for edit in (direction, sae):
        orig = edit.appliers

        def appliers(model, _orig=orig):
            out = {}
            for site, fn in _orig(model).items():
                def timed(h, rows, cols, _fn=fn, **kw):
                    t = time.perf_counter()
                    try:
                        return _fn(h, rows, cols, **kw)
                    finally:
                        edit_clock[0] += time.perf_counter() - t
                out[site] = timed
            return out
        edit.appliers = appliers

    backend.generate(prompts[:2], GenerationConfig(max_new_tokens=4, stop_at_final_line=False))  # warm-up
    backend.generate(prompts[:2], GenerationConfig(max_new_tokens=4, stop_at_final_line=False),
                     edit=sae.bind(prompts[:2], spans[:2]))
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    edit_s: dict[str, list[float]] = {k: [] for k in variants}
    outputs: dict[str, list] = {}
    names = list(variants)
    guard = _guard.Guard("bench_edit").__enter__()
    for r in range(_guard.check_rounds(args.rounds)):
        for name in names[r % len(names):] + names[:r % len(names)]:
            edit_clock[0] = 0.0
            sync()
            backend.share_edited_prefix = not name.endswith("_full_prefill")
            t0, c0 = time.perf_counter(), time.process_time()
            gens = backend.generate(prompts, cfg, edit=variants[name]())
            sync()
            backend.share_edited_prefix = True
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            edit_s[name].append(edit_clock[0])
            outputs[name] = [g.token_ids for g in gens]
    guard.__exit__(None, None, None)
    n_tok = len(prompts) * args.max_new_tokens if not args.keep_eos else sum(len(t) for t in outputs["plain"])
    identical = {k: outputs[k] == outputs["plain"] for k in variants}
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    # one non-zero-strength run of each edit
    live = {}
    for name, edit in live_edits.items():
        sync()
        t0 = time.perf_counter()
        gens = backend.generate(prompts, cfg, edit=edit.bind(prompts, spans))
        sync()
        dt = time.perf_counter() - t0
        live[name] = {"s": round(dt, 3), "changed_outputs": [g.token_ids for g in gens] != outputs["plain"]}
    res = {
        "model": args.model, "device": args.device, "dtype": args.dtype, "n_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens, "eos_stopping": bool(args.keep_eos),
        "generated_tokens_per_run": n_tok, "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(), "n_layers": n_layers, "d_model": d,
        "direction_sites": dir_sites, "sae_sites": sae_sites, "sae_width": 4 * d, "sae_features": args.sae_features,
        "wall_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "cpu_s": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
        "median_wall_s": {k: round(v, 3) for k, v in med.items()},
        "median_cpu_s": {k: round(v, 3) for k, v in med_cpu.items()},
        "overhead_wall_pct": {k: round(100 * (med[k] / med["plain"] - 1), 1) for k in variants if k != "plain"},
        "overhead_cpu_pct": {k: round(100 * (med_cpu[k] / med_cpu["plain"] - 1), 1) for k in variants
                             if k != "plain"},
        "edit_code_s": {k: round(statistics.median(v), 3) for k, v in edit_s.items() if k != "plain"},
        "edit_code_pct_of_plain_wall": {k: round(100 * statistics.median(v) / med["plain"], 1)
                                        for k, v in edit_s.items() if k != "plain"},
        "targets_pct": {"direction_last_input": 10, "sae_clamp_from_tool_return": 50},
        "wall_ratio_goals": {"direction_last_input": 1.10, "sae_clamp_from_tool_return": 1.25},
        "identical_tokens_at_strength_0": identical,
        "nonzero_strength_runs": live,
    }
    figs = []
    for k in variants:
        if k != "plain":
            res.setdefault("wall_ratio_rounds", {})[k] = _guard.ratios(times[k], times["plain"])
    for k in edited:       # the headline first: edited / unedited wall, then the path before and the edit's code
        figs.append(_guard.figure(f"wall ratio, {k} vs unedited", res["wall_ratio_rounds"][k],
                                  goal="≤ 1.10" if k.startswith("direction") else "≤ 1.25"))
        figs.append(_guard.figure(f"wall ratio, {k} vs unedited, before (full prefill)",
                                  res["wall_ratio_rounds"][k + "_full_prefill"]))
        figs.append(_guard.figure(f"edit code, {k} (% of unedited wall)",
                                  _guard.summarize([100 * e / p for e, p in zip(edit_s[k], times["plain"])]),
                                  unit="%", goal="< 10%" if k.startswith("direction") else "< 50%"))
    guard.finish(res, figs)
    print(json.dumps(res, indent=1))
    load = res["load"]
    print(f"HEADLINE edited / unedited wall ({load['status']}, load {load['before']['load_1m']} -> "
          f"{load['after']['load_1m']} on {load['before']['cpus']} CPUs): " +
          ", ".join(f"{k} {res['wall_ratio_rounds'][k]['median']:.3f}x (before "
                    f"{res['wall_ratio_rounds'][k + '_full_prefill']['median']:.3f}x)" for k in edited))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
