"""The assertions of the GPU check (``benchmarks/gpu_check.py``), one function per claim, each returning a record
``{"ok": bool, "bound": str, ...figures}``.

Every reference is computed independently of the code under check: the residual stream is read with plain PyTorch
hooks (:class:`StreamReader`: the input of block ``s`` is site ``s``, the input of the final norm the last site),
or with transformers' own ``output_hidden_states``; an edit's expected stream is the unhooked stream plus the
documented arithmetic. Strengths and scales are powers of two, so ``strength * scale * u`` is exact in float32
and every path that computes it (scalar or per-row) rounds the same value to the model's dtype.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
#: The default model's config and tokenizer (SmolLM2-135M-Instruct as memtoc converts it; no weights).
MODEL_DIR = HERE / "gpu_check_model"
STRENGTHS = (0.0, 1.0, 2.0, 4.0)
#: bf16/fp16 sweep bound: strength-0 rows of the 4-strength batch against the untreated batch, max |delta| of the
#: last-token logits over the logits' own max |value| (batches of other shapes run other kernels, whose bf16
#: roundings differ; measured on CPU bf16 ~1e-2 of that scale). float32: the generated tokens are equal.
SWEEP_LOGIT_REL_BOUND = {"bfloat16": 0.05, "float16": 0.02}
#: SAE clamp: the SAE runs in float32 on the selected rows; its result may differ from the reference's by the
#: float32 sum order of another GEMM shape, which can flip one rounding to the model's dtype: one ulp of the
#: largest edited value (2^-7 relative in bf16, 2^-10 in fp16, 2^-23 in float32).
ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}


# -- the model ----------------------------------------------------------------------------------------------------

def build_backend(device: str, dtype: torch.dtype, seed: int, model_dir: Path = MODEL_DIR) -> Any:
    """An hf backend over a seeded random-weight model of ``model_dir``'s config (built on ``device``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from memtoc.backends.hf import HFBackend

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    with torch.device(device):                 # initialised in the config's float32, then cast (any version)
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return HFBackend(model.eval(), tokenizer)


def prompts(n: int) -> tuple[list[str], list[tuple[int, int] | None]]:
    """``n`` demo prompts: ``n - 1`` tool_wrong episodes (of different lengths: left padding) and one no_tool row
    (no tool span: the tool-span kinds select and edit nothing there)."""
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    qs = load_benchmark("demo").questions
    tool = build_episodes(qs, formulations=("reference",), conditions=("tool_wrong",))
    bare = build_episodes(qs[:1], formulations=("reference",), conditions=("no_tool",))
    eps = (tool * (n // max(len(tool), 1) + 1))[:max(n - 1, 1)] + bare
    return [e.prompt for e in eps], [e.tool_output_span for e in eps]


def _pow2(x: float) -> float:
    return 2.0 ** round(math.log2(max(x, 1e-30)))


# -- reading the stream without the toolkit -----------------------------------------------------------------------

@contextmanager
def stream_reader(b: Any, sites: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """The full stream ``[B, T, d]`` at ``sites`` of the next forward, read by plain PyTorch pre-hooks on the block
    that receives it (the final norm for the last site); registered before any toolkit hook, they still see the
    edited stream, since an edit at site ``s`` acts on block ``s - 1``'s output."""
    layers, norm = b.parts.layers, b.parts.final_norm
    out: dict[int, torch.Tensor] = {}
    handles = []

    def reader(site: int):
        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            out[site] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return pre

    try:
        for s in sites:
            module = layers[s] if s < len(layers) else norm
            handles.append(module.register_forward_pre_hook(reader(s), with_kwargs=True))
        yield out
    finally:
        for h in handles:
            h.remove()


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _real_before(n_pad: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, T]: real (non-padding) columns left of each row's first planned column (all real ones if none)."""
    B, T = mask.shape
    cols = np.arange(T)[None, :]
    first = np.where(mask.any(1), mask.argmax(1), T)[:, None]
    return (cols >= n_pad[:, None]) & (cols < first)


# -- (a) capture ---------------------------------------------------------------------------------------------------

def check_capture(b: Any, ps: list[str], spans: list) -> dict:
    """hf capture at every prompt position kind equals ``output_hidden_states`` of the same forward (exactly)."""
    from activations.capture import ResidualCapture
    from memtoc.core.vocab import PROMPT_KINDS

    model, L = b.parts.model, b.parts.n_layers
    sites = list(range(L + 1))
    batch = b.encode(ps)
    mask = batch["attention_mask"]
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)           # the backend's rule (hf.forward)
    with torch.inference_mode(), stream_reader(b, [L]) as raw:
        ref = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=pos, use_cache=False,
                    output_hidden_states=True, logits_to_keep=1)
    hs = list(ref.hidden_states[:L]) + [raw[L]]          # transformers' last entry is final-normed; ours is raw
    out: dict = {"bound": "exact (torch.equal), every site, every selected position", "kinds": {}}
    with torch.inference_mode():                # transformers' convention, recorded (the reference reads raw)
        out["hidden_states_last_is_final_normed"] = torch.equal(b.parts.final_norm(raw[L]), ref.hidden_states[L])
    ok = len(ref.hidden_states) == L + 1
    cap = ResidualCapture(sites, PROMPT_KINDS, prompts=ps, tool_spans=spans)      # every kind, one forward
    b.forward(ps, capture=cap)
    sel = cap.selection
    n_pad = (~mask.bool()).sum(1).cpu().numpy()
    T = int(mask.shape[1])
    for kind in PROMPT_KINDS:
        k = sel.kind == kind
        rows, cols = torch.as_tensor(sel.row[k]), torch.as_tensor(sel.column[k])
        worst, exact = 0.0, True
        for s in sites:
            want = hs[s][rows.to(hs[s].device), cols.to(hs[s].device)].cpu()
            got = cap.values[s][torch.as_tensor(k)]
            exact &= got.dtype == want.dtype and torch.equal(got, want)
            worst = max(worst, _max_abs(got, want))
        n_rows = np.bincount(sel.row[k], minlength=len(ps))
        where = {"last_input": np.array_equal(sel.column[k], np.full(len(ps), T - 1)),
                 "all": np.array_equal(n_rows, T - n_pad)}.get(kind, True)            # independent of positions.py
        selects = bool(n_rows[:-1].all()) and (kind in ("last_input", "all")) == bool(n_rows[-1]) and where
        out["kinds"][kind] = {"positions": int(k.sum()), "exact": exact, "max_abs": worst,
                              "selects_as_documented": selects}
        ok &= exact and selects
    out["ok"] = bool(ok)
    return out


# -- (b) direction edit ------------------------------------------------------------------------------------------

def read_plain(b: Any, ps: list[str], site: int) -> dict[int, torch.Tensor]:
    """The unedited stream at ``site - 1``, ``site`` and the last site (the edit checks' reference)."""
    with stream_reader(b, [site - 1, site, b.parts.n_layers]) as plain:
        b.forward(ps)
    return dict(plain)


def check_direction(b: Any, ps: list[str], spans: list, site: int, scale: float,
                    plain: dict[int, torch.Tensor]) -> dict:
    """A direction edit adds ``strength * scale * u`` at the planned positions of ``site`` and nowhere else
    (``plain``: :func:`read_plain`)."""
    from steering.kinds.direction import DirectionEdit

    L, dtype = b.parts.n_layers, b.parts.dtype
    u = torch.randn(b.parts.d_model, generator=torch.Generator().manual_seed(1))
    u = u / u.norm()
    read = [site - 1, site, L]
    out: dict = {"site": site, "scale": scale, "bound": "exact at the edited site and upstream; downstream, real "
                 "tokens left of a row's first edited token exactly unchanged", "positions": {}}
    ok = True
    for positions, strength in (("last_input", 1.0), ("tool_span", 2.0), ("from_tool_return", 0.5)):
        edit = DirectionEdit.build(name="gpu-check", layers=[site], vectors={site: u}, scale={site: scale},
                                   positions=positions, strength=strength)
        bound = edit.bind(ps, spans)
        with stream_reader(b, read) as edited:
            b.forward(ps, edit=bound)
        plan = bound.make_plan(b, b.encode(ps)).positions          # the columns the forward edited
        mask = plan.prompt_mask
        m = torch.as_tensor(mask, device=plain[site].device)
        v = (strength * scale * u).to(device=m.device, dtype=dtype)
        want = plain[site].clone()
        want[m] = plain[site][m] + v
        before = torch.as_tensor(_real_before(plan.n_pad, mask), device=m.device)
        rec = {"planned": int(mask.sum()), "rows_planned": int(mask.any(1).sum()),
               "site_exact": torch.equal(edited[site], want),
               "site_max_abs": _max_abs(edited[site], want),
               "upstream_unchanged": torch.equal(edited[site - 1], plain[site - 1]),
               "downstream_before_edit_unchanged": torch.equal(edited[L][before], plain[L][before]),
               "downstream_changed": not torch.equal(edited[L][m], plain[L][m])}
        expected_rows = len(ps) if positions == "last_input" else len(ps) - 1       # the no_tool row: none
        rec["ok"] = (rec["site_exact"] and rec["upstream_unchanged"] and rec["downstream_before_edit_unchanged"]
                     and rec["downstream_changed"] and rec["rows_planned"] == expected_rows)
        out["positions"][positions] = rec
        ok &= rec["ok"]
    out["ok"] = bool(ok)
    return out


# -- (c) SAE clamp --------------------------------------------------------------------------------------------

class RandomSAE(nn.Module):
    """A ReLU SAE with seeded random weights: ``z = relu((x - b_dec) W_enc + b_enc)``. The toolkit's SAEs are
    sae-lens objects (``steering.sae``), absent on the GPU machine; ``SAEClampEdit`` needs only ``encode`` and
    ``W_dec``, which this provides."""

    def __init__(self, d: int, d_sae: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        dec = torch.randn(d_sae, d, generator=g)
        self.W_dec = nn.Parameter(dec / dec.norm(dim=1, keepdim=True))
        self.W_enc = nn.Parameter(torch.randn(d, d_sae, generator=g) / d ** 0.5)
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.b_dec = nn.Parameter(torch.randn(d, generator=g) * 0.01)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)


def check_sae_clamp(b: Any, ps: list[str], spans: list, site: int, plain: dict[int, torch.Tensor],
                    d_sae: int = 1024) -> dict:
    """An SAE clamp edit on the model's device: ``h' = h - r W_dec[remove] + a W_dec[add]`` at the planned
    positions (``r = max(min(v, z), 0)``, ``a = max(v - z, 0)``, ``z`` the code of the unedited row), and the
    stream unchanged elsewhere."""
    from steering.kinds.sae_clamp import SAEClampEdit
    from steering.spec import SCHEMA_VERSION

    L, dtype, dev = b.parts.n_layers, b.parts.dtype, b.parts.device
    sae = RandomSAE(b.parts.d_model, d_sae, seed=2)
    with torch.no_grad():                    # targets near the typical code, so both clamp branches occur
        z = sae.encode(plain[site].float().cpu().reshape(-1, b.parts.d_model))
    typical = float(z[z > 0].median()) if bool((z > 0).any()) else 1.0
    remove, add = list(range(0, 16)), list(range(16, 32))
    rt = [typical * float(f) for f in np.linspace(0.25, 2.0, 16)]
    at = [typical * float(f) for f in np.linspace(0.5, 4.0, 16)]
    strength = 1.5
    spec = {"schema_version": SCHEMA_VERSION, "name": "gpu-check-clamp", "kind": "sae_clamp", "layers": [site],
            "positions": "from_tool_return", "strength": strength, "sae": {str(site): {"path": "in-memory"}},
            "features": {str(site): {"remove": remove, "remove_targets": rt, "add": add, "add_targets": at}},
            "steer_toward": "memory", "fvu": {str(site): 0.1}}
    edit = SAEClampEdit(spec, saes={site: sae})
    bound = edit.bind(ps, spans)
    with stream_reader(b, [site - 1, site, L]) as edited:
        b.forward(ps, edit=bound)
    plan = bound.make_plan(b, b.encode(ps)).positions              # the columns the forward edited
    mask = plan.prompt_mask
    m = torch.as_tensor(mask, device=dev)
    x = plain[site][m]
    W = sae.W_dec.detach().to(dev)
    with torch.no_grad():
        zz = sae.to(dev).encode(x.float())
        r = torch.minimum(strength * torch.tensor(rt, device=dev, dtype=torch.float32), zz[:, remove]).clamp_min(0)
        a = (strength * torch.tensor(at, device=dev, dtype=torch.float32) - zz[:, add]).clamp_min(0)
        delta = a @ W[add] - r @ W[remove]
    want = plain[site].clone()
    want[m] = x + delta.to(dtype)
    before = torch.as_tensor(_real_before(plan.n_pad, mask), device=dev)
    scale = float(want[m].abs().max()) if int(m.sum()) else 0.0
    tol = ULP.get(dtype, 0.0) * scale
    err = _max_abs(edited[site], want)
    out = {"site": site, "d_sae": d_sae, "device": str(dev), "planned": int(mask.sum()),
           "bound": f"max |h' - reference| <= one ulp of the largest edited value ({tol:.3g}); exact off the plan",
           "max_abs": err, "exact": torch.equal(edited[site], want),
           "unplanned_unchanged": torch.equal(edited[site][~m], plain[site][~m]),
           "upstream_unchanged": torch.equal(edited[site - 1], plain[site - 1]),
           "downstream_before_edit_unchanged": torch.equal(edited[L][before], plain[L][before]),
           "clamp_active": {"removed": int((r > 0).sum()), "added": int((a > 0).sum())}}
    out["ok"] = bool(err <= tol and out["unplanned_unchanged"] and out["upstream_unchanged"]
                     and out["downstream_before_edit_unchanged"] and out["planned"] > 0
                     and out["clamp_active"]["removed"] > 0 and out["clamp_active"]["added"] > 0)
    return out


# -- (d) the staged capture path through a fake vLLM worker ----------------------------------------------------

def _fake_reference(models: list, chunks: list[torch.Tensor], edit_site: int, edit_rows: list[torch.Tensor],
                    delta: torch.Tensor, n_layers: int) -> dict[int, torch.Tensor]:
    """The stream at every site of the un-split model, chunk by chunk as the workers ran it, with the edit written
    the dispatcher's way (``hidden = 0``, ``residual = new``)."""
    blocks = [blk for m in models for blk in m.model.layers[m.model.start_layer:m.model.end_layer]]
    out: dict[int, list[torch.Tensor]] = {s: [] for s in range(n_layers + 1)}
    with torch.inference_mode():
        for emb, rows in zip(chunks, edit_rows):
            out[0].append(emb.clone())
            h, r = emb, None
            for i, blk in enumerate(blocks):
                h, r = blk(None, h, r)
                s = h + r
                if i + 1 == edit_site and rows.numel():
                    h, r = h.clone(), r.clone()
                    h[rows] = 0
                    r[rows] = s[rows] + delta
                    s = h + r
                out[i + 1].append(s)
    return {s: torch.cat(v) for s, v in out.items()}


def check_staged_capture(device: str, dtype: torch.dtype, d: int, n_layers: int = 4) -> dict:
    """TokenCapture through the worker extension of ``fake_vllm``, forwards under ``torch.inference_mode()``,
    open/close (and so the final flush) outside it: tensor parallel 2 (both ranks edit, rank 0 captures) and
    pipeline parallel 2 (each stage captures the sites it owns); prefill chunked over two forwards, so rows
    staged by one forward are flushed at the next. Staging is asked for (``stage=True``), so every forward must
    leave staged rows (on CUDA in pinned host buffers, with an event per forward; on the CPU the same code with
    plain buffers)."""
    import fake_vllm
    from memtoc.backends import vllm_worker
    from memtoc.backends.plans import CapturePlan, PositionPlan
    from memtoc.backends.vllm_plans import PlanTokenHook, TokenCapture
    from memtoc.backends.vllm_rows import TAG
    from steering.kinds.direction import DirectionEdit

    dev = torch.device(device)
    n_tok = [5, 4]                       # request a: 5 prompt tokens, b: 4 (left-padded by 1 in the plan)
    tok = np.concatenate([np.arange(n) for n in n_tok])
    row = np.concatenate([np.full(n, i) for i, n in enumerate(n_tok)])
    column = tok + np.where(row == 1, 1, 0)
    edit_site, scale = 2, 4.0
    u = torch.ones(d) / d ** 0.5
    edit = DirectionEdit.build(name="gpu-check", layers=[edit_site], vectors={edit_site: u}, scale={edit_site: scale},
                               positions="last_input", strength=1.0)
    plan_mask = np.zeros((2, 5), bool)
    plan_mask[0, 4] = plan_mask[1, 4] = True                 # the last prompt token of each request
    plan = PositionPlan(prompt_mask=plan_mask, generated_rows=np.zeros(2, bool), n_pad=np.array([0, 1]))
    emb = torch.randn(9, d, generator=torch.Generator().manual_seed(7)).to(dev, dtype)
    # forward 1: a's tokens 0-2 and all of b; forward 2: a's tokens 3-4 (its edited last token)
    steps = [[("a-1", 0, 0, 3), ("b-2", 1, 0, 4)], [("a-1", 0, 3, 2)]]
    chunks = [torch.cat([emb[0:3], emb[5:9]]), emb[3:5]]
    edit_rows = [torch.zeros(0, dtype=torch.long, device=dev), torch.tensor([1], device=dev)]   # strength 0 for b
    delta = (1.0 * scale * u).to(dev, dtype)
    order = torch.tensor([0, 1, 2, 7, 8, 3, 4, 5, 6], device=dev)     # selection entry -> row of the chunks

    def full(start: int = 0, end: int | None = None) -> Any:
        return fake_vllm.Model(d, n_layers, start, end).to(dev, dtype)

    def run(workers: list, sites: tuple[int, ...], sid: str) -> tuple[dict, dict]:
        cap = TokenCapture(CapturePlan(tuple(sites), rows=row, columns=column, token_index=tok, n_tokens=n_tok),
                           d, dtype, stage=True)                          # the GPU's path on any device
        ed = PlanTokenHook(plan, edit, [1.0, 0.0], [0, 1], d)
        blob = vllm_worker.dumps([([edit_site], ed), (list(sites), cap)])
        staged: list[bool] = []
        replicas: list[bool] = []
        with fake_vllm.ranked() as call:
            for w in workers:
                call(w, "memtoc_open", sid, blob)
            for reqs in steps:
                tagged = [(rid, {TAG: {"s": [sid], "r": r}}, before, now) for rid, r, before, now in reqs]
                with torch.inference_mode():
                    for w in workers:
                        w.runner.schedule(tagged)
                    x = chunks[len(staged)]
                    if workers[0].pp == workers[-1].pp:                           # tensor parallel: replicas
                        outs = [w.model(torch.arange(x.shape[0]), x) for w in workers]
                        replicas.append(all(torch.equal(o[0], outs[0][0]) for o in outs))
                    else:                                                         # pipeline: stage by stage
                        h, r = workers[0].model(torch.arange(x.shape[0]), x)
                        workers[1].model(torch.arange(x.shape[0]), h, r)
                hook = workers[0]._memtoc_sessions[sid][1]        # rank 0's capture, as unpickled there
                staged.append(bool(hook.staged) and all(buf.is_pinned() == (dev.type == "cuda")
                                                        for buf in hook._pinned.values()))
            replies = [vllm_worker.loads(call(w, "memtoc_close", sid)) for w in workers]
        errors = [r["error"] for r in replies if r["error"]]
        if errors:
            raise RuntimeError(f"a worker hook raised: {errors[0]}")
        ed.absorb([(r, r["hooks"][0]) for r in replies], [0, 0])
        cap.absorb([(r, r["hooks"][1]) for r in replies], [0, 0])
        return cap.result(), {"staged_each_forward": staged, "tp_replicas_equal": all(replicas), "replies": [
            {"tp": r["tp_rank"], "pp": r["pp_rank"], "owned": r["owned"],
             "captured": sorted(int(s) for s in (r["hooks"][1] or {}))} for r in replies]}

    out: dict = {"device": device, "dtype": str(dtype).replace("torch.", ""), "d": d, "n_layers": n_layers,
                 "bound": "exact (torch.equal) against the un-split model run on the same chunks", "runs": {}}
    ok = True
    ref_model = full()
    for name, make, sites in (
            ("tp2", lambda: [fake_vllm.Worker(full(), tp=0), fake_vllm.Worker(full(), tp=1)], (0, 2, n_layers)),
            ("pp2", lambda: [fake_vllm.Worker(full(0, n_layers // 2), pp=0),
                             fake_vllm.Worker(full(n_layers // 2, n_layers), pp=1)], (0, 2, 3, n_layers))):
        rec: dict = {}
        try:
            got, info = run(make(), sites, f"gpu-check-{name}")
            ref = _fake_reference([ref_model], chunks, edit_site, edit_rows, delta, n_layers)
            rec.update(info)
            unedited = _fake_reference([ref_model], chunks, edit_site, edit_rows, delta * 0, n_layers)
            rec["exact"] = all(torch.equal(got[s].to(dev), ref[s][order]) for s in sites)
            rec["max_abs"] = max(_max_abs(got[s].to(dev), ref[s][order]) for s in sites)
            rec["edit_reached_capture"] = not torch.equal(got[n_layers][4].to(dev), unedited[n_layers][order[4]])
            rec["ok"] = bool(rec["exact"] and rec["edit_reached_capture"] and info["tp_replicas_equal"]
                             and all(info["staged_each_forward"]))
        except Exception as exc:  # noqa: BLE001 - the check reports what raised and goes on
            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        out["runs"][name] = rec
        ok &= rec["ok"]
    out["ok"] = bool(ok)
    return out


# -- (e) the 4-strength sweep ---------------------------------------------------------------------------------------

def check_sweep(b: Any, ps: list[str], spans: list, site: int, scale: float, max_new_tokens: int) -> dict:
    """Four strengths of a direction edit as rows of ONE batch: strength 0 within the stated bound of the untreated
    run (float32: equal tokens; bf16/fp16: last-token logits within ``SWEEP_LOGIT_REL_BOUND`` of the
    logit scale, and the first generated token equal wherever the untreated top-2 margin exceeds twice the observed
    logit difference and the bound itself); the edit changes tokens at some strength."""
    from memtoc.core.runtime import GenerationConfig
    from steering.kinds.direction import DirectionEdit

    dtype = str(b.parts.dtype).replace("torch.", "")
    u = torch.randn(b.parts.d_model, generator=torch.Generator().manual_seed(3))
    edit = DirectionEdit.build(name="gpu-check-sweep", layers=[site], vectors={site: u / u.norm()},
                               scale={site: scale}, positions="from_tool_return", strength=1.0)
    n = len(ps)
    P, S = ps * len(STRENGTHS), spans * len(STRENGTHS)
    strengths = [x for x in STRENGTHS for _ in ps]
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, stop_at_final_line=False, batch_size=len(P))
    t = time.perf_counter()
    plain = b.generate(ps, cfg)
    swept = b.generate(P, cfg, edit=edit.bind(P, S, strengths=strengths))
    gen_s = time.perf_counter() - t
    same = [a.token_ids == g.token_ids for a, g in zip(swept[:n], plain)]
    prefix = [next((i for i, (x, y) in enumerate(zip(a.token_ids, g.token_ids)) if x != y),
                   min(len(a.token_ids), len(g.token_ids))) for a, g in zip(swept[:n], plain)]
    changed = any(a.token_ids != g.token_ids for a, g in zip(swept[n:], plain * (len(STRENGTHS) - 1)))
    out = {"site": site, "scale": scale, "strengths": list(STRENGTHS), "rows": len(P), "generate_s": round(gen_s, 2),
           "strength0_identical_rows": f"{sum(same)}/{n}", "strength0_agreeing_prefix": prefix,
           "edit_changes_tokens": changed}
    if dtype not in SWEEP_LOGIT_REL_BOUND:
        out["bound"] = f"{dtype}: exact (identical generated tokens in every strength-0 row)"
        out["ok"] = bool(all(same) and changed)
        return out
    lp = b.forward(ps)["last_logits"].float()
    ls = b.forward(P, edit=edit.bind(P, S, strengths=strengths))["last_logits"].float()[:n]
    diff = float((lp - ls).abs().max())
    logit_scale = float(lp.abs().max())
    top2 = lp.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).cpu()
    rel = SWEEP_LOGIT_REL_BOUND[dtype]
    near_tie = max(2 * diff, rel * logit_scale)        # generate's own passes may differ by up to the bound
    first_ok = [(a.token_ids[:1] == g.token_ids[:1]) or float(m) <= near_tie
                for a, g, m in zip(swept[:n], plain, margin)]
    out.update(last_logit_max_abs_diff=diff, logit_scale=logit_scale, top2_margins=[float(m) for m in margin],
               first_token_exempt_rows=sum(float(m) <= near_tie for m in margin),
               bound=(f"{dtype}: strength-0 last-token logits within {rel} x the logit scale of the untreated "
                      "batch's; first generated token equal wherever the untreated top-2 margin exceeds that bound "
                      "(and twice the observed logit difference)"))
    out["ok"] = bool(diff <= rel * logit_scale and all(first_ok) and changed)
    return out
