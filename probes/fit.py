"""Fitting the averaged Jacobian lens (``memtoc lens fit``): the batched-cotangent future-sum estimator.

For every corpus sequence (BOS prepended, at most ``max_seq_len`` tokens) and every source site ``s``::

    Jbar_s[i, :] += mean_{p in P} sum_{p' in P} d x_L[p', i] / d x_s[p, :]

with ``P`` the valid positions ``skip_first .. T-2`` and ``x_L`` the raw output of the last block, averaged over
the sequences used. One backward pass with a cotangent one-hot in output coordinate ``i`` at every valid target
position gives row ``i`` for all source sites at once; ``batch_rows`` such cotangents share a backward (over a
replicated forward, or vmapped with ``mode="vmap"``; ``one_row``: one per backward). Which is fastest depends
on the device, so ``mode="auto"`` times each on the corpus's median-length sequence (:func:`calibrate_estimator`)
and records the choice in the lens's metadata.

Resumable: the float64 sums are checkpointed to ``OUT.partial`` at most every ``checkpoint_seconds`` and
whenever the job stops; re-running the same command gives the same lens as an uninterrupted fit.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn
from tqdm import tqdm

from probes.lens import LENS_FORMAT, JacobianLens, lens_key
from memtoc.backends.plans import HookPlan
from probes.model import LensMismatchError, ModelParts, ProbeError

STATE_FORMAT = "memtoc-jacobian-lens-partial-v1"


#: the shipped corpora, by name (``--corpus NAME``); ``default`` is used when no corpus is given
CORPORA = {"default": "lens_corpus.txt", "quick": "lens_corpus_quick.txt"}
#: lines of the default corpus fitted when no ``--limit`` is given: about 30 min on 2 CPU cores for the default
#: model with the one-row estimator (docs/probes.md, "Fitting the lens on a CPU"); ``--limit 0`` fits all lines
DEFAULT_CORPUS_LINES = 24


def default_corpus_path(name: str = "default") -> Path:
    """A corpus shipped with the package (``probes/data/lens_corpus.txt``; ``quick``: two short lines)."""
    return Path(__file__).resolve().parent / "data" / CORPORA[name]


def resolve_limit(corpus: str | Path | None, limit: int | None) -> int | None:
    """The number of lines to fit: ``limit`` if given (0 = all), else ``DEFAULT_CORPUS_LINES`` for the shipped
    default corpus and every line of any other."""
    if limit is not None:
        return None if int(limit) <= 0 else int(limit)
    return DEFAULT_CORPUS_LINES if corpus in (None, "", "default") else None


def read_corpus(path: str | Path | None) -> tuple[list[str], str, str]:
    """``(sequences, sha256 of the file bytes, file name)``: one sequence per non-empty line, ``#`` lines skipped.

    ``path`` is a file, a shipped corpus's name (``default``, ``quick``) or None (the default corpus)."""
    p = default_corpus_path(str(path) if path else "default") if not path or str(path) in CORPORA else Path(path)
    if not p.exists():
        raise ProbeError(f"corpus file {p} not found")
    raw = p.read_bytes()
    lines = [ln.strip() for ln in raw.decode("utf-8").splitlines()]
    seqs = [ln for ln in lines if ln and not ln.startswith("#")]
    if not seqs:
        raise ProbeError(f"corpus file {p} holds no text lines")
    return seqs, hashlib.sha256(raw).hexdigest(), p.name


def tokenize_sequence(tokenizer: Any, text: str, *, max_seq_len: int, force_bos: bool) -> list[int]:
    """Token ids of a corpus line: the tokenizer's own special tokens, BOS forced in front, truncated."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    if force_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [int(bos)] + ids
    return ids[:max_seq_len]


# -- the estimator -------------------------------------------------------------------------------------------

def valid_positions(n_tokens: int, skip_first: int) -> list[int]:
    return list(range(skip_first, n_tokens - 1))


#: estimator name -> (sequence_jacobians mode, batch_rows or None for the fit's --batch-rows)
ESTIMATORS: dict[str, tuple[str, int | None]] = {"replicate": ("replicate", None), "vmap": ("vmap", None),
                                                 "one_row": ("replicate", 1)}
MODES = ("auto", *ESTIMATORS)


@dataclass
class EstimatorChoice:
    """The estimator a fit runs with, and (for ``auto``) the calibration that chose it."""

    name: str
    mode: str
    batch_rows: int
    seconds_per_row: dict[str, float] = field(default_factory=dict)   # measured, per candidate
    calibration_rows: int = 0
    calibration_tokens: int = 0
    calibration_s: float = 0.0

    def meta(self) -> dict[str, Any]:
        return {"estimator_mode": self.name, "estimator_batch_rows": self.batch_rows,
                "estimator_calibration": {"seconds_per_row": self.seconds_per_row, "rows": self.calibration_rows,
                                          "tokens": self.calibration_tokens, "seconds": self.calibration_s}
                if self.seconds_per_row else None}


def fixed_estimator(name: str, batch_rows: int) -> EstimatorChoice:
    if name not in ESTIMATORS:
        raise ProbeError(f"unknown estimator {name!r}; choose from {', '.join(MODES)}")
    mode, b = ESTIMATORS[name]
    return EstimatorChoice(name, mode, int(b or batch_rows))


def calibrate_estimator(parts: ModelParts, input_ids: torch.Tensor, sites: Sequence[int], *, skip_first: int,
                        batch_rows: int = 32, candidates: Sequence[str] = tuple(ESTIMATORS), rounds: int = 2,
                        measure: Callable[[EstimatorChoice], float] | None = None,
                        on_step: Callable[[int, int], None] | None = None) -> EstimatorChoice:
    """Time ``batch_rows`` output rows of each candidate estimator on one sequence; return the fastest.

    Rounds are interleaved and each candidate's minimum kept. ``measure(choice) -> seconds per row`` replaces
    the timing (tests); ``on_step(done, total)`` is called after each warm-up and timing (a progress display)."""
    n_rows = max(1, min(int(batch_rows), parts.d_model))
    cands = [fixed_estimator(c, batch_rows) for c in candidates]
    rounds = max(1, int(rounds))
    total = (len(cands) if measure is None else 0) + rounds * len(cands)
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if on_step is not None:
            on_step(done, total)

    def timed(c: EstimatorChoice) -> float:
        t0 = time.perf_counter()
        sequence_jacobians(parts, input_ids, sites, skip_first=skip_first, batch_rows=c.batch_rows,
                           rows=range(n_rows), mode=c.mode)
        return (time.perf_counter() - t0) / n_rows

    if measure is None:
        for c in cands:                    # warm-up: allocator and autograd caches, outside the timing
            sequence_jacobians(parts, input_ids, sites, skip_first=skip_first, batch_rows=min(c.batch_rows, 2),
                               rows=range(min(2, n_rows)), mode=c.mode)
            step()
    t0 = time.perf_counter()
    best: dict[str, float] = {}
    for r in range(rounds):
        for c in cands[r % len(cands):] + cands[:r % len(cands)]:
            sec = float(measure(c) if measure is not None else timed(c))
            best[c.name] = min(best.get(c.name, sec), sec)
            step()
    pick = min(cands, key=lambda c: best[c.name])
    pick.seconds_per_row = {k: round(v, 6) for k, v in best.items()}
    pick.calibration_rows = n_rows
    pick.calibration_tokens = int(input_ids.numel())
    pick.calibration_s = round(time.perf_counter() - t0, 3)
    return pick


def backward_flops(parts: ModelParts, n_tokens: int, first_site: int = 0) -> float:
    """FLOPs of one backward pass for one output row, weights frozen (the compute bound of the fit per row):
    ``2 T n_params`` for each block's linear maps and ``8 T^2 d`` for its attention, blocks ``first_site..L-1``."""
    T = int(n_tokens)
    blocks = range(int(first_site), parts.n_layers)
    lin = sum(sum(p.numel() for p in parts.layers[k].parameters() if p.dim() == 2) for k in blocks)
    return 2.0 * T * lin + 8.0 * T * T * parts.d_model * len(blocks)


def sequence_jacobians(parts: ModelParts, input_ids: torch.Tensor, sites: Sequence[int], *, skip_first: int,
                       batch_rows: int = 32, rows: Sequence[int] | None = None,
                       mode: str = "replicate") -> dict[int, torch.Tensor] | None:
    """One sequence's contribution ``site -> [n_rows, d]`` (float64) to ``Jbar`` (None if it is too short).

    ``input_ids`` is ``[T]`` or ``[1, T]``. ``rows`` restricts the output coordinates (default: all ``d``);
    ``batch_rows`` cotangents go through each backward pass (``batch_rows=1`` is the naive one-row loop).
    """
    L = parts.n_layers
    ids = input_ids.reshape(1, -1).to(parts.lm_head.weight.device)
    T = ids.shape[1]
    pos = valid_positions(T, skip_first)
    if not pos:
        return None
    sources = sorted(set(int(s) for s in sites if int(s) != L))
    if not sources:
        return {}
    if any(not 0 <= s < L for s in sources):
        raise ProbeError(f"source sites must lie in 0..{L - 1}; got {sources}")
    d = parts.d_model
    rows = list(range(d)) if rows is None else [int(r) for r in rows]
    if mode not in ("replicate", "vmap") and mode in ESTIMATORS:
        mode, batch_rows = ESTIMATORS[mode][0], ESTIMATORS[mode][1] or batch_rows
    if mode not in ("replicate", "vmap"):
        raise ProbeError(f"unknown estimator mode {mode!r}")
    B = max(1, min(int(batch_rows), len(rows)))
    n_rep = B if mode == "replicate" else 1
    first = sources[0]
    got: dict[int, torch.Tensor] = {}

    def hook(s: int, h: torch.Tensor) -> torch.Tensor | None:
        if s == first:
            got[s] = h.detach().requires_grad_(True)
            return got[s]
        got[s] = h
        return None

    out = {s: torch.zeros(len(rows), d, dtype=torch.float64) for s in sources}
    pos_t = torch.tensor(pos, device=ids.device)
    with parts.frozen(), torch.enable_grad(), parts.intervene(None, HookPlan(hook, sites=sorted(set(sources) | {L}))):
        batch = ids.expand(n_rep, T)
        parts.forward(decoder_only=True, input_ids=batch, attention_mask=torch.ones_like(batch))
        target = got[L]
        src = [got[s] for s in sources]
        for c0 in range(0, len(rows), B):
            chunk = rows[c0:c0 + B]
            nb = len(chunk)
            shape = (n_rep, T, d) if mode == "replicate" else (nb, 1, T, d)     # vmap: a batch of [1, T, d]
            cot = torch.zeros(shape, dtype=target.dtype, device=target.device)
            for b, c in enumerate(chunk):
                cot[b, ..., pos_t, c] = 1
            grads = torch.autograd.grad(target, src, grad_outputs=cot, retain_graph=True, allow_unused=True,
                                        is_grads_batched=mode == "vmap")
            for s, g in zip(sources, grads):
                if g is not None:
                    out[s][c0:c0 + nb] = g.reshape(-1, T, d)[:nb, pos_t].mean(1).double().cpu()
        got.clear()
    return out


# -- the resumable fit -----------------------------------------------------------------------------------------

@dataclass
class FitResult:
    path: Path
    complete: bool
    n_done: int                  # corpus lines processed (used or skipped as too short)
    n_used: int                  # sequences that contributed
    n_planned: int
    seconds: float
    lens: JacobianLens | None = None
    notes: list[str] = field(default_factory=list)


def state_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".partial")


def fit_lens(model: nn.Module | ModelParts, tokenizer: Any, out: str | Path, *, corpus: str | Path | None = None,
             model_name: str = "in-memory", sites: Sequence[int] | None = None, max_seq_len: int = 128,
             skip_first: int = 16, force_bos: bool = True, batch_rows: int = 32, mode: str = "auto",
             limit: int | None = None, stop_after: int | None = None, checkpoint_seconds: float = 60.0,
             save_dtype: torch.dtype = torch.float32,
             on_sequence: Callable[[int, int], None] | None = None, progress: bool = False,
             measure: Callable[[EstimatorChoice], float] | None = None,
             on_calibration: Callable[[int, int], None] | None = None) -> FitResult:
    """Fit (or resume) the averaged Jacobian lens of ``model`` (a transformers model, or a backend's ``parts``) on
    a corpus and write it to ``out``.

    ``sites``: the source sites (default ``0..L-1``); ``limit``: only the first N corpus lines; ``stop_after``:
    at most N further lines in this call, leaving a resumable partial state. ``on_sequence(i, n_planned)`` is
    called after each line (an exception it raises interrupts the fit like Ctrl-C), ``on_calibration(step,
    n_steps)`` after each calibration step. ``mode``: an estimator or ``auto`` (``measure`` replaces the timing,
    for tests); every estimator gives the same lens up to rounding, so a fit may be resumed with another.
    """
    import transformers

    t0 = time.perf_counter()
    out = Path(out)
    parts = ModelParts.of(model, len(tokenizer)) if isinstance(model, nn.Module) else model
    L = parts.n_layers
    srcs = sorted(set(int(s) for s in (range(L) if sites is None else sites) if int(s) != L))
    if not srcs or any(not 0 <= s < L for s in srcs):
        raise ProbeError(f"lens sites must lie in 0..{L - 1} (site {L}, the last block's output, is the identity)")
    texts, corpus_sha, corpus_name = read_corpus(corpus)
    if limit is not None:
        texts = texts[:int(limit)]
    identity = {"model_fingerprint": parts.fingerprint(), "n_layers": L, "d_model": parts.d_model,
                "corpus_sha256": corpus_sha, "max_seq_len": int(max_seq_len), "skip_first": int(skip_first),
                "force_bos": bool(force_bos), "sites": srcs, "estimator": "future_sum"}
    meta_common = {**identity, "format": LENS_FORMAT, "model": model_name, "architecture": parts.architecture,
                   "corpus": corpus_name, "n_vocab": parts.n_vocab,
                   "torch": torch.__version__, "transformers": transformers.__version__}

    if out.exists():
        try:
            existing = JacobianLens.load(out, allow_partial=True)
        except LensMismatchError:
            existing = None
        if existing is not None and all(existing.meta.get(k) == v for k, v in identity.items()) \
                and existing.meta.get("complete") and existing.meta.get("n_sequences_planned") == len(texts):
            return FitResult(out, True, len(texts), int(existing.meta.get("n_sequences", 0)), len(texts),
                             time.perf_counter() - t0, existing, ["already complete; nothing to do"])
        raise ProbeError(f"{out} exists and is not this fit (other model, corpus or settings); "
                         "choose another --out or delete it")

    sums, n_done, n_used = _load_state(state_path(out), identity, srcs, parts.d_model)
    notes = [f"resumed after {n_done} of {len(texts)} sequences"] if n_done else []
    calibration_bar = None

    def calibrated(step: int, total: int) -> None:
        nonlocal calibration_bar
        if progress and calibration_bar is None:
            calibration_bar = tqdm(total=total, desc="lens fit: calibrating the estimator", unit="step",
                                   file=sys.stderr)
        if calibration_bar is not None:
            calibration_bar.update(1)
        if on_calibration is not None:
            on_calibration(step, total)

    # ``auto`` times the estimators on the median-length line still to do (none left: nothing is timed)
    todo = texts[n_done:] if mode == "auto" else []
    seqs = [ids for ids in (tokenize_sequence(tokenizer, t, max_seq_len=max_seq_len, force_bos=force_bos)
                            for t in todo) if valid_positions(len(ids), skip_first)]
    try:
        choice = (calibrate_estimator(parts, torch.tensor(sorted(seqs, key=len)[len(seqs) // 2]), srcs,
                                      skip_first=skip_first, batch_rows=batch_rows, measure=measure, on_step=calibrated)
                  if seqs else fixed_estimator("one_row" if mode == "auto" else mode, batch_rows))
    finally:
        if calibration_bar is not None:
            calibration_bar.close()
    if choice.seconds_per_row:
        notes.append(f"estimator {choice.name} (calibrated, s per output row: "
                     + ", ".join(f"{k} {v:.4g}" for k, v in choice.seconds_per_row.items()) + ")")
    t_loop = time.perf_counter()
    done_before, used_before = n_done, n_used
    last_save = time.perf_counter()
    bar = tqdm(total=len(texts), initial=n_done, desc="lens fit", unit="seq", file=sys.stderr, disable=not progress)
    try:
        while n_done < len(texts):
            if stop_after is not None and n_done - done_before >= stop_after:
                break
            ids = tokenize_sequence(tokenizer, texts[n_done], max_seq_len=max_seq_len, force_bos=force_bos)
            contrib = sequence_jacobians(parts, torch.tensor(ids), srcs, skip_first=skip_first,
                                         batch_rows=choice.batch_rows, mode=choice.mode)
            if contrib is not None:
                for s in srcs:
                    sums[s] += contrib[s]
                n_used += 1
            n_done += 1
            bar.update(1)
            if on_sequence is not None:
                on_sequence(n_done, len(texts))
            if time.perf_counter() - last_save >= checkpoint_seconds and n_done < len(texts):
                _save_state(state_path(out), identity, sums, n_done, n_used)
                last_save = time.perf_counter()
    except BaseException:
        _save_state(state_path(out), identity, sums, n_done, n_used)
        raise
    finally:
        bar.close()

    if n_done < len(texts):
        _save_state(state_path(out), identity, sums, n_done, n_used)
        return FitResult(out, False, n_done, n_used, len(texts), time.perf_counter() - t0, None, notes)
    if n_used == 0:
        raise ProbeError(f"no corpus line is longer than skip_first + 1 = {skip_first + 1} tokens; "
                         "use a corpus of longer sequences or a smaller --skip-first")
    lens = JacobianLens(matrices={s: (sums[s] / n_used) for s in srcs},
                        meta={**meta_common, "n_sequences": n_used, "n_sequences_planned": len(texts),
                              "complete": True, "dtype": str(save_dtype).replace("torch.", ""), **choice.meta(),
                              "device": str(parts.lm_head.weight.device), "torch_threads": torch.get_num_threads(),
                              "fit_seconds_last_call": round(time.perf_counter() - t0, 1),
                              "seconds_per_sequence": round((time.perf_counter() - t_loop) / (n_used - used_before), 2)
                              if n_used > used_before else None})
    lens.save(out, dtype=save_dtype)
    state_path(out).unlink(missing_ok=True)
    lens = JacobianLens.load(out)
    return FitResult(out, True, n_done, n_used, len(texts), time.perf_counter() - t0, lens, notes)


def _save_state(path: Path, identity: dict[str, Any], sums: dict[int, torch.Tensor], n_done: int,
                n_used: int) -> None:
    from safetensors.torch import save_file

    meta = {"format": STATE_FORMAT, "identity": json.dumps(identity, sort_keys=True), "n_done": str(n_done),
            "n_used": str(n_used)}
    tmp = path.with_name(path.name + ".tmp")
    save_file({lens_key(s): m.contiguous() for s, m in sums.items()}, str(tmp), metadata=meta)
    tmp.replace(path)


def _load_state(path: Path, identity: dict[str, Any], sites: Sequence[int],
                d: int) -> tuple[dict[int, torch.Tensor], int, int]:
    fresh = {s: torch.zeros(d, d, dtype=torch.float64) for s in sites}
    if not path.exists():
        return fresh, 0, 0
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if meta.get("format") != STATE_FORMAT:
            raise ProbeError(f"{path} is not a partial lens fit; delete it")
        theirs = json.loads(meta.get("identity", "{}"))
        if theirs != json.loads(json.dumps(identity, sort_keys=True)):
            diff = sorted(k for k in set(theirs) | set(identity) if theirs.get(k) != identity.get(k))
            raise LensMismatchError(f"{path} is a partial fit with other settings ({', '.join(diff)}); delete it "
                                    "or choose another --out to start over")
        sums = {s: fh.get_tensor(lens_key(s)).to(torch.float64) for s in sites}
        return sums, int(meta["n_done"]), int(meta["n_used"])
