"""The evaluator: closed-book elicitation first, then the tool-conditioned episodes, scored by the one scorer.

Every model evaluation of the toolkit (untreated, prompted, edited) runs through ``evaluate``, so its
records and metrics are directly comparable.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from tqdm import tqdm

import memtoc
from memtoc.backends.base import Backend, Generation, GenerationConfig
from memtoc.benchmark import Benchmark, load_benchmark
from memtoc.controls import CONTROL_ARMS, load_controls
from memtoc.config import ConfigError, EpisodeSelection, Intervention, JobSettings, ModelSpec, composed
from memtoc.episodes import Episode, parse_conditions, plan_episodes  # noqa: F401 - plan_episodes re-exported
from memtoc.provenance import git_revision  # noqa: F401 - re-exported
from memtoc.fileio import sha256_json
from memtoc.metrics import metric_table
from memtoc.prompts import load_prompt_set, prompt_identity
from memtoc.runstore import RunStore, refuse_if_written
from memtoc.scoring import assign_cell, is_trivial_hop, memory_status, score_response
from memtoc.validate import check_edit_for_model, check_run_dir, recorded_identity
from memtoc.vocab import BACKENDS


@composed()
@dataclass
class EvaluationConfig:
    """Everything ``memtoc evaluate`` takes, as pieces (flat keywords reach them: ``EvaluationConfig(limit=4)``).

    Identity fields decide whether an existing run can be resumed.
    """

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    selection: EpisodeSelection = field(default_factory=EpisodeSelection)
    intervention: Intervention = field(default_factory=Intervention)
    # batch_size None: 8 on hf; 256 on vllm (it schedules its own batches)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    job: JobSettings = field(default_factory=JobSettings)

    def effective_batch_size(self) -> int:
        if self.batch_size is not None:
            if self.batch_size < 1:
                raise ConfigError(f"--batch-size must be at least 1, got {self.batch_size}")
            return self.batch_size
        return 256 if self.backend == "vllm" else 8

    def check(self) -> None:
        """Option values that cannot run, refused before anything loads (one line naming the option)."""
        self.effective_batch_size()
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        for name, value in (("max_new_tokens", self.max_new_tokens),
                            ("tensor_parallel_size", self.tensor_parallel_size), ("max_model_len", self.max_model_len)):
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")


@dataclass
class EvaluationResult:
    store: RunStore
    n_closed_book_new: int
    n_episodes_new: int
    table_text: str
    summary: dict[str, Any] = field(default_factory=dict)


def load_backend(cfg: EvaluationConfig) -> Backend:
    """The backend of ``cfg`` from the one factory (an adapter is applied as a view of the loaded model)."""
    from memtoc.backends.factory import load_backend as load

    return load(cfg.model_spec)


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
                           aliases=q.aliases, tool_conditioned=ep.tool_output is not None)
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


def settings_identity(cfg: EvaluationConfig, bench: Benchmark, frame: str, edit_spec: dict[str, Any] | None,
                      *, existing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The identity fields known before the model loads: benchmark, the prompt templates used, edit, budget."""
    prompts = load_prompt_set()
    used = prompts.templates_sha256(frame=frame, intervention=cfg.prompt_intervention, closed_book=cfg.closed_book)
    identity = {
        "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        **prompt_identity(prompts, used, existing, where=str(cfg.out)),
        "closed_book": cfg.closed_book, "prompt_intervention": cfg.prompt_intervention, "frame": frame,
        "max_new_tokens": cfg.max_new_tokens, "stop_at_final_line": cfg.generation.stop_at_final_line,
        "edit_sha256": sha256_json(edit_spec) if edit_spec else None,
    }
    if set(parse_conditions(cfg.conditions)) & set(CONTROL_ARMS):  # only then, so other runs keep their identity
        identity["controls_sha256"] = load_controls().sha256
    if cfg.adapter:  # only when set, so runs made before adapters existed keep their identity
        from memtoc.finetune.adapter import adapter_sha256

        identity["adapter_sha256"] = adapter_sha256(cfg.adapter)
    return identity


def run_identity(cfg: EvaluationConfig, bench: Benchmark, provenance: dict[str, Any], frame: str,
                 edit_spec: dict[str, Any] | None, *, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings that decide what a record means; a run directory never mixes two of these."""
    model = {
        "model": provenance.get("model"), "weights_sha256": (provenance.get("weights") or {}).get("sha256"),
        "backend": provenance.get("backend", cfg.backend), "dtype": provenance.get("dtype"),
        "device_type": str(provenance.get("device", "")).split(":")[0],
        "chat_template_sha256": provenance.get("chat_template_sha256"),
    }
    return {**model, **(settings if settings is not None else settings_identity(cfg, bench, frame, edit_spec))}


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
    # Everything that needs no weights is checked first: nothing loads and nothing is written on a user error.
    if edit is None and cfg.edit:
        edit = load_edit(cfg.edit)
    edit_spec = edit.spec if edit is not None else None
    edit_closed_book = bool(edit_spec and edit_spec.get("apply_to_closed_book"))
    cfg.check()
    batch_size = cfg.effective_batch_size()
    bench = load_benchmark(cfg.benchmark)
    episodes = plan_episodes(cfg, bench)
    refuse_if_written(cfg.out)          # a live writer on --out: refuse before the model loads
    frame = episodes[0].frame if episodes else cfg.frame
    settings = settings_identity(cfg, bench, frame, edit_spec, existing=recorded_identity(cfg.out))
    check_run_dir(cfg.out, settings)
    if backend is None:
        check_edit_for_model(edit, cfg.model)
        backend = load_backend(cfg)
    provenance = backend.provenance()
    identity = run_identity(cfg, bench, provenance, frame, edit_spec, settings=settings)
    store = RunStore.open(cfg.out, identity=identity, run_info={
        "config": cfg.flat(), "provenance": provenance, "edit": edit_spec,
        "package_version": memtoc.__version__, "git": git_revision(), "seed": cfg.seed,
        "benchmark": {"name": bench.name, "files": bench.files}, "status": "running"})
    gen_cfg = cfg.generation

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
