"""``memtoc judge RUN_DIR --judge-model M``: the run's judge requests through a toolkit backend, resumable.

Greedy, ``max_new_tokens`` from the prompt file (32, paper App. B). The judge is built in one place,
:func:`load_judge_backend`, so it is a backend like any other (hf on CPU/GPU, vllm for a 7-9B judge).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from memtoc.backends.base import Backend, GenerationConfig
from memtoc.core.errors import RunStoreError
from memtoc.scoring.judge.prompts import JudgePrompts, load_judge_prompts
from memtoc.scoring.judge.requests import JudgeRequest, build_requests
from memtoc.scoring.judge.rules import parse_record
from memtoc.scoring.judge.store import JUDGE_FILE, IDENTITY_FIELDS, identity_diff, judge_identity_of, read_judge_records
from memtoc.runs.runstore import JsonlLog, RunStore


@dataclass
class JudgeConfig:
    """Everything ``memtoc judge`` takes."""

    run_dir: str
    judge_model: str = "default"
    backend: str = "hf"
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int | None = None      # None: 8 on hf, 256 on vllm
    prompts: str | None = None         # a judge prompt file; None = the packaged release prompts
    output: str = JUDGE_FILE           # file name inside the run directory
    progress: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None


@dataclass
class JudgeResult:
    path: Path
    n_requests: int
    n_new: int
    counts: dict[str, int]


def load_judge_backend(cfg: JudgeConfig) -> Backend:
    """The judge model, built by the one backend factory like every other model of the toolkit."""
    from memtoc.backends.factory import load_backend
    from memtoc.backends.spec import ModelSpec

    return load_backend(ModelSpec(model=cfg.judge_model, backend=cfg.backend, device=cfg.device, dtype=cfg.dtype,
                                  tensor_parallel_size=cfg.tensor_parallel_size,
                                  gpu_memory_utilization=cfg.gpu_memory_utilization,
                                  max_model_len=cfg.max_model_len))


def judge_identity(provenance: dict[str, Any], prompts: JudgePrompts) -> dict[str, Any]:
    ident = {"model": provenance.get("model"), "weights_sha256": (provenance.get("weights") or {}).get("sha256"),
             "backend": provenance.get("backend"), "dtype": provenance.get("dtype"),
             "chat_template_sha256": provenance.get("chat_template_sha256"),
             "prompt_version": prompts.prompt_version, "prompts_sha256": prompts.sha256,
             "max_new_tokens": prompts.max_new_tokens}
    assert tuple(ident) == IDENTITY_FIELDS
    return ident


def _refuse(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    diff = identity_diff(old, new)
    raise RunStoreError(
        f"{path} holds a judge pass of another judge (field {', '.join(diff)}: {old.get(diff[0])!r} vs "
        f"{new.get(diff[0])!r}); write this judge to its own file with --output judge_<name>.jsonl, or delete "
        f"{path.name} to start over")


def _batches(items: Sequence[Any], size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def run_judge(cfg: JudgeConfig, *, backend: Backend | None = None,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> JudgeResult:
    """Build the run's requests, skip those already in the judge file, judge the rest in fsynced batches."""
    store = RunStore.read(cfg.run_dir)
    prompts = load_judge_prompts(cfg.prompts)
    requests = build_requests(store.episodes.records(), prompts)
    path = store.root / cfg.output
    existing = read_judge_records(path) if path.exists() else {}
    old_ident = judge_identity_of(existing, path)
    todo = [r for r in requests if r.request_id not in existing]
    cheap = {"prompt_version": prompts.prompt_version, "prompts_sha256": prompts.sha256}
    if old_ident is not None and backend is None:
        # refuse before loading a model when the spec or the prompts already differ
        mismatch = {k: v for k, v in cheap.items() if old_ident.get(k) != v}
        if old_ident.get("model") != cfg.judge_model:
            mismatch["model"] = cfg.judge_model
        if mismatch:
            _refuse(path, old_ident, {**old_ident, **mismatch})
    counts = {k: sum(r.kind == k for r in requests) for k in ("extract_final", "extract_closed_book", "ack")}
    if not todo:
        log(f"{path}: nothing left to judge ({len(requests)} requests already judged)")
        return JudgeResult(path, len(requests), 0, counts)
    backend = backend or load_judge_backend(cfg)
    ident = judge_identity(backend.provenance(), prompts)
    if old_ident is not None and identity_diff(old_ident, ident):
        _refuse(path, old_ident, ident)
    judge_log = JsonlLog(path, "request_id")  # repairs a torn last line before appending
    gen_cfg = GenerationConfig(max_new_tokens=prompts.max_new_tokens, stop_at_final_line=False)
    size = cfg.batch_size or (256 if cfg.backend == "vllm" else 8)
    parse_kw = {"max_words": prompts.max_words, "abstain_token": prompts.abstain_token,
                "strip_chars": prompts.strip_chars}
    n_new = 0
    bar = tqdm(total=len(todo), desc="judge", unit="request", disable=not cfg.progress, file=sys.stderr)
    try:
        for batch in _batches(sorted(todo, key=lambda r: len(r.prompt)), size):
            recs = []
            # A failing backend call raises (the pass resumes from the last batch); ``error`` stays for
            # judges whose calls can fail per request (a served judge), whose replies are then discarded.
            gens = backend.generate([r.prompt for r in batch], gen_cfg)
            replies = [(g.text, None) for g in gens]
            for req, (text, err) in zip(batch, replies):
                rec = {**_request_fields(req), "reply": text, "error": err, "judge": ident}
                rec["verdict"] = parse_record(rec, **({} if req.kind == "ack" else parse_kw))
                recs.append(rec)
            n_new += judge_log.append(recs)
            bar.update(len(batch))
    finally:
        bar.close()
    return JudgeResult(path, len(requests), n_new, counts)


def _request_fields(req: JudgeRequest) -> dict[str, Any]:
    return req.to_dict()
