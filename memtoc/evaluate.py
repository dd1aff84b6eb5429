"""The evaluator: closed-book elicitation first, then the tool-conditioned episodes, scored by the one scorer.

Every model evaluation of the toolkit (untreated, prompted, edited) runs through ``evaluate``, so its
records and metrics are directly comparable.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tqdm import tqdm

import memtoc
from memtoc.backends.base import Backend, Generation, GenerationConfig
from memtoc.benchmark import Benchmark, load_benchmark
from memtoc.episodes import Episode, build_episodes, parse_conditions, parse_formulations
from memtoc.errors import MemtocError
from memtoc.fileio import sha256_json
from memtoc.metrics import metric_table
from memtoc.prompts import load_prompt_set
from memtoc.runstore import RunStore, refuse_if_written
from memtoc.scoring import assign_cell, is_trivial_hop, memory_status, score_response


@dataclass
class EvaluationConfig:
    """Everything ``memtoc evaluate`` takes. Identity fields decide whether an existing run can be resumed."""

    model: str = "default"
    benchmark: str = "demo"
    out: str = "runs/demo"
    formulations: str = "reference"
    conditions: str = "all"
    question_set: str = "all"
    limit: int | None = None
    backend: str = "hf"
    batch_size: int | None = None      # None: 8 on hf; 256 on vllm (it schedules its own batches)
    max_new_tokens: int = 128
    closed_book: str = "forced"
    prompt_intervention: str = "none"
    frame: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    edit: str | None = None
    adapter: str | None = None         # LoRA adapter directory (memtoc finetune), applied to the whole model
    seed: int = 0
    progress: bool = True
    tensor_parallel_size: int = 1      # vllm only
    gpu_memory_utilization: float = 0.9  # vllm only
    max_model_len: int | None = None   # vllm only

    def effective_batch_size(self) -> int:
        if self.batch_size is not None:
            if self.batch_size < 1:
                raise MemtocError(f"--batch-size must be at least 1, got {self.batch_size}")
            return self.batch_size
        return 256 if self.backend == "vllm" else 8


@dataclass
class EvaluationResult:
    store: RunStore
    n_closed_book_new: int
    n_episodes_new: int
    table_text: str
    summary: dict[str, Any] = field(default_factory=dict)


def git_revision() -> dict[str, Any]:
    root = Path(memtoc.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            return {"commit": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None}


def load_backend(cfg: EvaluationConfig) -> Backend:
    if cfg.backend == "hf":
        from memtoc.backends.hf import HFBackend

        backend = HFBackend.load(cfg.model, device=cfg.device, dtype=cfg.dtype)
        if cfg.adapter:
            from memtoc.finetune.adapter import apply_adapter

            backend.model = apply_adapter(backend.model, cfg.adapter)  # PeftModel.from_pretrained, merged
        return backend
    if cfg.adapter:
        raise MemtocError("--adapter is supported on the hf backend only")
    if cfg.backend == "vllm":
        from memtoc.backends.vllm import VLLMBackend

        return VLLMBackend.load(cfg.model, dtype=cfg.dtype, tensor_parallel_size=cfg.tensor_parallel_size,
                                gpu_memory_utilization=cfg.gpu_memory_utilization, max_model_len=cfg.max_model_len)
    raise MemtocError(f"unknown backend {cfg.backend!r}; choose hf or vllm")


def _batches(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _generation_fields(gen: Generation) -> dict[str, Any]:
    return {"response": gen.text, "n_prompt_tokens": gen.n_prompt_tokens, "n_new_tokens": gen.n_new_tokens,
            "stop_reason": gen.stop_reason}


def closed_book_key(question_id: str, formulation: str) -> str:
    return f"{question_id}|{formulation}"


def score_episode(ep: Episode, response: str, memory: dict[str, Any]) -> dict[str, Any]:
    """One scored record: the episode, the raw response, the memory status of its question and every label."""
    q = ep.question
    score = score_response(response, gold=q.gold_answer, tool_value=ep.tool_value,
                           memory_span=memory["memory_span"] if not memory["mem_absent"] else "",
                           aliases=q.aliases)
    rec = ep.to_dict()
    prompts = rec.pop("prompts")
    rec["prompt"] = ep.prompt
    rec["closed_book_prompt"] = prompts["closed_book"]
    rec["response"] = response
    rec.update({
        "memory_span": memory["memory_span"], "mem_absent": memory["mem_absent"],
        "memory_correct": memory["memory_correct"],
        "cell": assign_cell(memory["memory_correct"], memory["mem_absent"], ep.tool_correct),
        "trivial_hop": is_trivial_hop(q.gold_answer, q.question),
    })
    rec.update(score.to_dict())
    return rec


def plan_episodes(cfg: EvaluationConfig, bench: Benchmark) -> list[Episode]:
    frame = bench.default_frame if cfg.frame == "auto" else cfg.frame
    questions = bench.select(cfg.question_set, cfg.limit)
    return build_episodes(questions, formulations=parse_formulations(cfg.formulations),
                          conditions=parse_conditions(cfg.conditions), frame=frame,
                          intervention=cfg.prompt_intervention, closed_book=cfg.closed_book)


def run_identity(cfg: EvaluationConfig, bench: Benchmark, provenance: dict[str, Any], frame: str,
                 edit_spec: dict[str, Any] | None) -> dict[str, Any]:
    """The settings that decide what a record means; a run directory never mixes two of these."""
    prompts = load_prompt_set()
    identity = {
        "model": provenance.get("model"), "weights_sha256": (provenance.get("weights") or {}).get("sha256"),
        "backend": provenance.get("backend", cfg.backend), "dtype": provenance.get("dtype"),
        "device_type": str(provenance.get("device", "")).split(":")[0],
        "chat_template_sha256": provenance.get("chat_template_sha256"),
        "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        "prompts_sha256": prompts.sha256, "closed_book": cfg.closed_book,
        "prompt_intervention": cfg.prompt_intervention, "frame": frame,
        "max_new_tokens": cfg.max_new_tokens, "stop_at_final_line": True,
        "edit_sha256": sha256_json(edit_spec) if edit_spec else None,
    }
    if cfg.adapter:  # only when set, so runs made before adapters existed keep their identity
        from memtoc.finetune.adapter import adapter_sha256

        identity["adapter_sha256"] = adapter_sha256(cfg.adapter)
    return identity


def load_edit(path: str) -> Any:
    """An edit spec file (JSON) turned into an edit object by ``steering`` (validated before any model loads)."""
    from steering import load_edit as _load

    return _load(path)


def _bind(edit: Any, episodes: Sequence[Episode], *, with_tool: bool) -> Any:
    """Give the edit the batch's user prompts and tool-output spans (``tool_span`` positions need them)."""
    if edit is None:
        return None
    if with_tool:
        return edit.bind([ep.prompt for ep in episodes], [ep.tool_output_span for ep in episodes])
    return edit.bind([ep.closed_book_prompt for ep in episodes], [None] * len(episodes))


def evaluate(cfg: EvaluationConfig, *, backend: Backend | None = None, edit: Any = None,
             log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> EvaluationResult:
    """Run (or resume) an evaluation into ``cfg.out`` and return its metric table.

    An edit (``cfg.edit``, a spec file, or ``edit``, an object from ``steering``) acts on the tool-conditioned
    pass; the closed-book pass that defines each question's memory stays untreated unless the spec says
    ``"apply_to_closed_book": true``, so an edited run's cells equal the untreated run's and a strength-0
    edit reproduces it exactly.
    """
    if edit is None and cfg.edit:
        edit = load_edit(cfg.edit)
    edit_spec = edit.spec if edit is not None else None
    edit_closed_book = bool(edit_spec and edit_spec.get("apply_to_closed_book"))
    bench = load_benchmark(cfg.benchmark)
    episodes = plan_episodes(cfg, bench)
    refuse_if_written(cfg.out)          # a live writer on --out: refuse before the model loads
    backend = backend or load_backend(cfg)
    provenance = backend.provenance()
    frame = episodes[0].frame if episodes else cfg.frame
    identity = run_identity(cfg, bench, provenance, frame, edit_spec)
    store = RunStore.open(cfg.out, identity=identity, run_info={
        "config": asdict(cfg), "provenance": provenance, "edit": edit_spec,
        "package_version": memtoc.__version__, "git": git_revision(), "seed": cfg.seed,
        "benchmark": {"name": bench.name, "files": bench.files}, "status": "running"})
    gen_cfg = GenerationConfig(max_new_tokens=cfg.max_new_tokens)
    batch_size = cfg.effective_batch_size()

    # 1. Closed-book pass: one answer per (question, formulation), shared by all of its episodes.
    cb_needed: dict[str, Episode] = {}
    for ep in episodes:
        cb_needed.setdefault(closed_book_key(ep.question.id, ep.formulation), ep)
    cb_todo = [(k, ep) for k, ep in cb_needed.items() if k not in store.closed_book]
    todo = [ep for ep in episodes if ep.episode_id not in store.episodes]
    n_cb = n_ep = 0
    bar = tqdm(total=len(cb_todo) + len(todo), desc="evaluate", unit="prompt", disable=not cfg.progress,
               file=sys.stderr)
    try:
        for batch in _batches(sorted(cb_todo, key=lambda kv: len(kv[1].closed_book_prompt)), batch_size):
            gens = backend.generate([ep.closed_book_prompt for _, ep in batch], gen_cfg,
                                    edit=_bind(edit, [ep for _, ep in batch], with_tool=False)
                                    if edit_closed_book else None)
            recs = []
            for (key, ep), gen in zip(batch, gens):
                q = ep.question
                mem = memory_status(gen.text, q.gold_answer, q.aliases)
                recs.append({"key": key, "question_id": q.id, "formulation": ep.formulation,
                             "closed_book_mode": cfg.closed_book, "prompt": ep.closed_book_prompt,
                             **_generation_fields(gen), "memory_span": mem.span, "mem_absent": mem.mem_absent,
                             "memory_correct": mem.memory_correct})
            n_cb += store.closed_book.append(recs)
            bar.update(len(batch))
        # 2. Tool-conditioned pass, scored against the closed-book memory of the same formulation.
        for batch in _batches(sorted(todo, key=lambda e: len(e.prompt)), batch_size):
            gens = backend.generate([ep.prompt for ep in batch], gen_cfg,
                                    edit=_bind(edit, batch, with_tool=True))
            recs = []
            for ep, gen in zip(batch, gens):
                mem = store.closed_book.get(closed_book_key(ep.question.id, ep.formulation))
                rec = score_episode(ep, gen.text, mem)
                rec.update(_generation_fields(gen))
                rec["edit"] = edit_spec.get("name") if edit_spec else None
                recs.append(rec)
            n_ep += store.episodes.append(recs)
            bar.update(len(batch))
    finally:
        bar.close()
    planned = {ep.episode_id for ep in episodes}
    records = [r for r in store.episodes.records() if r["episode_id"] in planned]
    table = metric_table(records, seed=cfg.seed)
    summary = {"n_episodes": {"planned": len(planned), "done": len(records)},
               "n_closed_book": len(cb_needed), "metrics": table.to_dict()}
    store.write_summary(summary)
    store.update_run_info(status="complete" if len(records) == len(planned) else "partial")
    if n_cb == 0 and n_ep == 0:
        log(f"{store.root}: nothing left to run ({len(records)} episodes already scored)")
    return EvaluationResult(store=store, n_closed_book_new=n_cb, n_episodes_new=n_ep,
                            table_text=table.format_text(), summary=summary)
