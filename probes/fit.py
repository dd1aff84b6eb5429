"""Fitting the averaged Jacobian lens (``memtoc lens fit``): the batched-cotangent future-sum estimator.

For every corpus sequence (BOS prepended, at most ``max_seq_len`` tokens) and every source site ``s``::

    Jbar_s[i, :] += mean_{p in P} sum_{p' in P} d x_L[p', i] / d x_s[p, :]

with ``P`` the valid positions ``skip_first .. T-2`` (the attention-sink region and the last token are left
out) and ``x_L`` the raw output of the last block; the sum over sequences is divided by the number of
sequences used. One backward pass with a cotangent that is one-hot in output coordinate ``i`` at every valid
target position gives row ``i`` for *all* source sites at once; a batch of ``batch_rows`` such cotangents is
pushed through one backward (the forward is replicated ``batch_rows`` times, as in the Anthropic ``jlens``
fitting code; ``mode="vmap"`` instead vmaps one forward's backward over the cotangents). The earliest source site
is made a fresh leaf so nothing below it enters the graph; parameters are frozen.

Resumable: the running float64 sums and the number of sequences done are checkpointed to ``OUT.partial``
(safetensors) at most every ``checkpoint_seconds`` and whenever the job stops (also on an exception or Ctrl-C);
re-running the same command continues from there and gives the same lens as an uninterrupted fit.
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

from probes.lens import LENS_FORMAT, JacobianLens, lens_key
from probes.model import LensMismatchError, ModelParts, ProbeError, base_model, frozen_parameters, model_fingerprint, \
    site_hooks

STATE_FORMAT = "memtoc-jacobian-lens-partial-v1"


def default_corpus_path() -> Path:
    """The small plain-English corpus shipped with the package (``probes/data/lens_corpus.txt``)."""
    return Path(__file__).resolve().parent / "data" / "lens_corpus.txt"


def read_corpus(path: str | Path | None) -> tuple[list[str], str, str]:
    """``(sequences, sha256 of the file bytes, file name)``: one sequence per non-empty line, ``#`` lines skipped."""
    p = Path(path) if path else default_corpus_path()
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


def sequence_jacobians(parts: ModelParts, input_ids: torch.Tensor, sites: Sequence[int], *, skip_first: int,
                       batch_rows: int = 32, rows: Sequence[int] | None = None,
                       mode: str = "replicate") -> dict[int, torch.Tensor] | None:
    """One sequence's contribution ``site -> [n_rows, d]`` (float64) to ``Jbar`` (None if it is too short).

    ``input_ids`` is ``[T]`` or ``[1, T]``. ``rows`` restricts the output coordinates (default: all ``d``);
    ``batch_rows`` cotangents go through each backward pass (``batch_rows=1`` is the naive one-row loop).
    """
    model = parts.model
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
    if mode not in ("replicate", "vmap"):
        raise ProbeError(f"unknown estimator mode {mode!r}")
    B = max(1, min(int(batch_rows), len(rows)))
    n_rep = B if mode == "replicate" else 1
    first = sources[0]
    got: dict[int, torch.Tensor] = {}

    def hook(s: int, h: torch.Tensor) -> torch.Tensor | None:
        if s == first:
            leaf = h.detach().requires_grad_(True)
            got[s] = leaf
            if s == L:
                got[L] = leaf
            return leaf
        got[s] = h
        return None

    out = {s: torch.zeros(len(rows), d, dtype=torch.float64) for s in sources}
    pos_t = torch.tensor(pos, device=ids.device)
    with frozen_parameters(model), torch.enable_grad(), site_hooks(model, sorted(set(sources) | {L}), hook):
        batch = ids.expand(n_rep, T)
        base_model(model)(input_ids=batch, attention_mask=torch.ones_like(batch), use_cache=False)
        target = got[L]
        src = [got[s] for s in sources]
        for c0 in range(0, len(rows), B):
            chunk = rows[c0:c0 + B]
            nb = len(chunk)
            if mode == "replicate":
                cot = torch.zeros(n_rep, T, d, dtype=target.dtype, device=target.device)
                for b, c in enumerate(chunk):
                    cot[b, pos_t, c] = 1
                grads = torch.autograd.grad(target, src, grad_outputs=cot, retain_graph=True, allow_unused=True)
                for s, g in zip(sources, grads):
                    if g is not None:
                        out[s][c0:c0 + nb] = g[:nb, pos_t].mean(1).double().cpu()
            else:
                cot = torch.zeros(nb, 1, T, d, dtype=target.dtype, device=target.device)
                for b, c in enumerate(chunk):
                    cot[b, 0, pos_t, c] = 1
                grads = torch.autograd.grad(target, src, grad_outputs=cot, retain_graph=True, allow_unused=True,
                                            is_grads_batched=True)
                for s, g in zip(sources, grads):
                    if g is not None:
                        out[s][c0:c0 + nb] = g[:, 0, pos_t].mean(1).double().cpu()
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


def fit_lens(model: nn.Module, tokenizer: Any, out: str | Path, *, corpus: str | Path | None = None,
             model_name: str = "in-memory", sites: Sequence[int] | None = None, max_seq_len: int = 128,
             skip_first: int = 16, force_bos: bool = True, batch_rows: int = 32, mode: str = "replicate",
             limit: int | None = None, stop_after: int | None = None, checkpoint_seconds: float = 60.0,
             save_dtype: torch.dtype = torch.float32,
             on_sequence: Callable[[int, int], None] | None = None, progress: bool = False) -> FitResult:
    """Fit (or resume) the averaged Jacobian lens of ``model`` on a corpus and write it to ``out``.

    ``sites`` are the source sites (default: every site below the last, ``0..L-1``); ``limit`` uses only the
    first N corpus lines; ``stop_after`` processes at most N further lines in this call and leaves a resumable
    partial state (used by tests and for time-boxed jobs). ``on_sequence(i, n_planned)`` is called after each
    line is done and checkpointed in memory (an exception it raises interrupts the fit like Ctrl-C would).
    """
    t0 = time.perf_counter()
    out = Path(out)
    parts = ModelParts.of(model, len(tokenizer))
    L = parts.n_layers
    srcs = sorted(set(int(s) for s in (range(L) if sites is None else sites) if int(s) != L))
    if not srcs or any(not 0 <= s < L for s in srcs):
        raise ProbeError(f"lens sites must lie in 0..{L - 1} (site {L}, the last block's output, is the identity)")
    texts, corpus_sha, corpus_name = read_corpus(corpus)
    if limit is not None:
        texts = texts[:int(limit)]
    identity = {"model_fingerprint": model_fingerprint(model), "n_layers": L, "d_model": parts.d_model,
                "corpus_sha256": corpus_sha, "max_seq_len": int(max_seq_len), "skip_first": int(skip_first),
                "force_bos": bool(force_bos), "sites": srcs, "estimator": "future_sum"}
    meta_common = {**identity, "format": LENS_FORMAT, "model": model_name, "architecture": type(model).__name__,
                   "corpus": corpus_name, "n_vocab": parts.n_vocab,
                   "torch": torch.__version__, "transformers": _tf_version()}

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
    last_save = time.perf_counter()
    processed_now = 0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(texts), initial=n_done, desc="lens fit", unit="seq", file=sys.stderr)
    try:
        while n_done < len(texts):
            if stop_after is not None and processed_now >= stop_after:
                break
            ids = tokenize_sequence(tokenizer, texts[n_done], max_seq_len=max_seq_len, force_bos=force_bos)
            contrib = sequence_jacobians(parts, torch.tensor(ids), srcs, skip_first=skip_first,
                                         batch_rows=batch_rows, mode=mode)
            if contrib is not None:
                for s in srcs:
                    sums[s] += contrib[s]
                n_used += 1
            n_done += 1
            processed_now += 1
            if bar is not None:
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
        if bar is not None:
            bar.close()

    complete = n_done >= len(texts)
    if not complete:
        _save_state(state_path(out), identity, sums, n_done, n_used)
        return FitResult(out, False, n_done, n_used, len(texts), time.perf_counter() - t0, None, notes)
    if n_used == 0:
        raise ProbeError(f"no corpus line is longer than skip_first + 1 = {skip_first + 1} tokens; "
                         "use a corpus of longer sequences or a smaller --skip-first")
    lens = JacobianLens(matrices={s: (sums[s] / n_used) for s in srcs},
                        meta={**meta_common, "n_sequences": n_used, "n_sequences_planned": len(texts),
                              "complete": True, "dtype": str(save_dtype).replace("torch.", "")})
    lens.save(out, dtype=save_dtype)
    state_path(out).unlink(missing_ok=True)
    lens = JacobianLens.load(out)
    return FitResult(out, True, n_done, n_used, len(texts), time.perf_counter() - t0, lens, notes)


def _tf_version() -> str:
    try:
        import transformers
        return transformers.__version__
    except ImportError:  # pragma: no cover
        return "unknown"


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
