"""MemToC's evaluation pieces: the config of ``memtoc evaluate``, its protocol, the run identity, the scored record.

The evaluation itself runs through the one evaluate job of every task (:func:`memtoc.jobs.evaluate.evaluate`, over
:func:`memtoc.tasks.evaluation.evaluate_task`); MemToC's closed-book pass then tool-conditioned pass, scored by the
one scorer, is ``memtoc.tasks.memtoc.task``, which uses these pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from memtoc.backends.base import Generation
from memtoc.core.backend_kinds import backend_kind
from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import Benchmark
from memtoc.bench.conditions import selection_identity
from memtoc.core.config import ConfigError, EpisodeSelection, Intervention, JobSettings, ModelSpec, field_value
from memtoc.core.options import here, opt, option
from memtoc.bench.protocol import fill_values, paper_helps, protocol_settings
from memtoc.bench.episodes import Episode, parse_conditions, parse_formulations
from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.core.fileio import sha256_json
from memtoc.bench.prompts import load_prompt_set, prompt_identity
from memtoc.scoring import assign_cell, is_trivial_hop, memory_status, score_response


#: The fields a protocol fills (memtoc.bench.protocol) -> the piece that holds each. In a job config whose protocol
#: fills them they default to None (not given); the job resolves each to its protocol's value, else the piece's
#: own default (:func:`resolve_protocol`), so an option given at its default value keeps it.
FILLED_FIELDS: dict[str, str] = {"question_set": "selection", "formulations": "selection",
                                 "closed_book": "intervention", "stop_at_final_line": "generation",
                                 "max_new_tokens": "generation"}


@dataclass
class EvaluationConfig:
    """Everything ``memtoc evaluate`` takes, as pieces (``EvaluationConfig(selection=EpisodeSelection(limit=4))``).

    Identity fields decide whether an existing run can be resumed.
    """
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-run", "closed_book_from": "input-run", "edit": "input",
        "adapter": "input-dir"}
    #: read before the weights load (memtoc.jobs.preflight): a missing model path or a corrupt GGUF is one line
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = ("temperature", "n_boot")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        **paper_helps("formulations", "question_set", "closed_book"),
        "batch_size": here("prompts per backend call (default 8 on hf, 256 on vllm)"),
        "out": here("run directory (resumed if it exists with the same settings)", required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    # the protocol-filled fields (FILLED_FIELDS) are None: not given; the job resolves them (resolve_protocol)
    selection: EpisodeSelection = field(
        default_factory=lambda: EpisodeSelection(formulations=None, question_set=None))
    intervention: Intervention = field(default_factory=lambda: Intervention(closed_book=None))
    # batch_size None: the backend kind's default (8 on hf; 256 on vllm, which schedules its own batches)
    generation: GenerationConfig = field(
        default_factory=lambda: GenerationConfig(max_new_tokens=None, stop_at_final_line=None))
    job: JobSettings = field(default_factory=JobSettings)
    # the evaluate job's own options: a protocol (memtoc.bench.protocol) and a shared closed-book source
    protocol: str = field(default="none", metadata=option("protocol"))
    closed_book_from: str | None = field(default=None, metadata=opt(
        "reuse the closed-book answers of this run directory (same model, weights, chat template, prompt version, "
        "closed-book mode; its formulations must cover this run's): every arm then has identical cells",
        metavar="RUN_DIR", path=True))

    def effective_batch_size(self) -> int:
        if self.generation.batch_size is not None:
            if self.generation.batch_size < 1:
                raise ConfigError(f"--batch-size must be at least 1, got {self.generation.batch_size}")
            return self.generation.batch_size
        return backend_kind(self.model_spec.backend).default_batch_size

    def check(self) -> None:
        """Option values that cannot run, refused before anything loads (one line naming the option)."""
        self.effective_batch_size()
        for name, value in (("max_new_tokens", self.generation.max_new_tokens),
                            ("tensor_parallel_size", self.model_spec.tensor_parallel_size),
                            ("pipeline_parallel_size", self.model_spec.pipeline_parallel_size),
                            ("max_model_len", self.model_spec.max_model_len)):
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if not 0 < self.model_spec.gpu_memory_utilization <= 1:
            raise ConfigError("--gpu-memory-utilization must be in (0, 1], got "
                              f"{self.model_spec.gpu_memory_utilization}")


#: The config fields a protocol may set or is compared on (memtoc.bench.protocol).
PROTOCOL_FIELDS: tuple[str, ...] = ("question_set", "limit", "formulations", "closed_book", "stop_at_final_line",
                                    "max_new_tokens", "frame")


def resolve_protocol(cfg: Any) -> Any:
    """``cfg`` with every protocol-filled field the user did not give (None) set to its protocol's value, else to
    its piece's own default: what the job runs and records (``run.json``'s ``config`` holds resolved values).
    ``cfg``: a job config with the ``selection``, ``intervention`` and ``generation`` pieces and a ``protocol``
    (``EvaluationConfig``, ``CrossfitConfig``); returned as it is when nothing is None, so resolving twice
    changes nothing."""
    protocol_settings(cfg.protocol)  # an unknown name is refused here, naming the option
    unset = [n for n, piece in FILLED_FIELDS.items() if getattr(getattr(cfg, piece), n) is None]
    if not unset:
        return cfg
    fill = fill_values(cfg.protocol, (), unset)
    changes: dict[str, dict[str, Any]] = {}
    for name in unset:
        piece = FILLED_FIELDS[name]
        default = getattr(type(getattr(cfg, piece))(), name)
        changes.setdefault(piece, {})[name] = fill.get(name, default)
    return replace(cfg, **{p: replace(getattr(cfg, p), **kw) for p, kw in changes.items()})


def given_protocol_fields(cfg: EvaluationConfig) -> list[str]:
    """The paper settings an unresolved ``cfg`` sets itself (``run.json``'s ``protocol.explicit``): each
    protocol-filled field not None, ``limit`` when set, ``frame`` other than auto."""
    names = [n for n, piece in FILLED_FIELDS.items() if getattr(getattr(cfg, piece), n) is not None]
    if cfg.selection.limit is not None:
        names.append("limit")
    if cfg.intervention.frame != "auto":
        names.append("frame")
    return names


def batches_of(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size`` (the generation batches)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def generation_fields(gen: Generation) -> dict[str, Any]:
    """The fields of an episode record that come from its generation."""
    return {"response": gen.text, "n_prompt_tokens": gen.n_prompt_tokens, "n_new_tokens": gen.n_new_tokens,
            "stop_reason": gen.stop_reason}


def closed_book_key(question_id: str, formulation: str) -> str:
    return f"{question_id}|{formulation}"


def closed_book_record(ep: Episode, gen: Generation, bench: Benchmark, closed_book_mode: str) -> dict[str, Any]:
    """The closed-book record of ``ep``'s question and formulation: the answer and the memory status it gives.

    The memory status is the family's own (``bench.scorer``: the transfer set's MC matcher) or the one string
    scorer's. Every runner of the closed-book pass (``memtoc evaluate``, the Inspect task) writes it with this."""
    q = ep.question
    scorer = bench.scorer
    mem = (scorer.memory_status(q, gen.text) if scorer is not None
           else memory_status(gen.text, q.gold_answer, q.aliases))
    return {"key": closed_book_key(q.id, ep.formulation), "question_id": q.id, "formulation": ep.formulation,
            "closed_book_mode": closed_book_mode, "prompt": ep.closed_book_prompt, **generation_fields(gen),
            "memory_span": mem.span, "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct}


def scored_record(ep: Episode, gen: Generation, memory: dict[str, Any], bench: Benchmark,
                  edit_name: str | None = None) -> dict[str, Any]:
    """The scored record of one tool-pass answer (what a run's ``episodes.jsonl`` holds): :func:`score_episode`,
    the family's own rescoring where it has one, the generation's fields and the edit's name. Every runner of
    the tool pass (``memtoc evaluate``, the Inspect task's scorer) scores with this."""
    rec = score_episode(ep, gen.text, memory)
    if bench.scorer is not None:        # a family's own scorer (the transfer MC matcher)
        rec = bench.scorer.rescore(rec)
    rec.update(generation_fields(gen))
    rec["edit"] = edit_name
    return rec


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


#: The question selection: a run folder holds one (its ``run.json`` ``config`` records the first invocation's).
#: Conditions and formulations may grow a folder: each added arm runs on the same questions, so every metric's
#: support stays one question set.
SELECTION_FIELDS: tuple[str, ...] = ("question_set", "limit")


def _selection(sel: Mapping[str, Any]) -> dict[str, Any]:
    """The selection fields of ``sel`` (a flat config record) in one spelling: list order does not matter."""
    out = {k: sel[k] for k in SELECTION_FIELDS if k in sel}
    if "formulations" in out:
        out["formulations"] = ",".join(sorted(parse_formulations(out["formulations"])))
    if "conditions" in out:
        out["conditions"] = ",".join(sorted(parse_conditions(out["conditions"])))
    return out


def check_run_selection(cfg: EvaluationConfig, planned: Sequence[Episode] = ()) -> None:
    """Refuse, before the model loads, to add records to a run folder made with another question selection
    (``--limit``, ``--question-set``): its records, summary and ``run.json`` would each describe another plan.
    A selection the folder already holds entirely only re-reads it (a cross-fit's rerun on fewer conditions) and
    passes; a merged folder (``memtoc merge``: a union of shards) is not checked."""
    from memtoc.runs.runstore import read_jsonl, read_run_info

    root = Path(cfg.job.out)
    if not (root / "run.json").is_file():
        return
    info = read_run_info(root)
    recorded = info.get("config")
    if not isinstance(recorded, dict) or info.get("merged_from"):
        return
    try:
        old = _selection(recorded)
    except BenchmarkDataError:
        return                                  # a selection this version no longer knows: the identity decides
    now = _selection({k: field_value(cfg, k) for k in SELECTION_FIELDS})
    diff = [k for k in SELECTION_FIELDS if k in old and old[k] != now[k]]
    if not diff:
        return
    held = {r.get("episode_id") for _, r in read_jsonl(root / "episodes.jsonl", missing_ok=True).records
            if isinstance(r, dict)}
    held_cb = {r.get("key") for _, r in read_jsonl(root / "closed_book.jsonl", missing_ok=True).records
               if isinstance(r, dict)}
    if planned and all(ep.episode_id in held and closed_book_key(ep.question.id, ep.formulation) in held_cb
                       for ep in planned):
        return                                  # nothing would be written: a subset re-read
    items = "; ".join(f"{k}: {old[k]!r} in the folder, {now[k]!r} now" for k in diff)
    raise RunStoreError(f"{cfg.job.out} holds a run made with another episode selection ({items}); use another "
                        "--out directory, or delete this one to start over")


def settings_identity(cfg: EvaluationConfig, bench: Benchmark, frame: str, edit_spec: dict[str, Any] | None,
                      *, existing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The identity fields known before the model loads: benchmark, the prompt templates used, edit, budget."""
    prompts = load_prompt_set()
    used = prompts.templates_sha256(frame=frame, intervention=cfg.intervention.prompt_intervention,
                                    closed_book=cfg.intervention.closed_book)
    identity = {
        "benchmark_files": bench.files, "prompt_version": prompts.prompt_version,
        **prompt_identity(prompts, used, existing, where=str(cfg.job.out)),
        "closed_book": cfg.intervention.closed_book, "prompt_intervention": cfg.intervention.prompt_intervention,
        "frame": frame,
        "max_new_tokens": cfg.generation.max_new_tokens, "stop_at_final_line": cfg.generation.stop_at_final_line,
        "edit_sha256": sha256_json(edit_spec) if edit_spec else None,
    }
    if edit_spec and edit_spec.get("function_sha256"):  # a callable edit: its source hash, named on a refusal
        identity["edit_function_sha256"] = edit_spec["function_sha256"]
    # a selected condition with data of its own (the control arms: controls_sha256); nothing for the release's, so
    # other runs keep their identity
    identity.update(selection_identity(parse_conditions(cfg.selection.conditions)))
    if cfg.model_spec.adapter:  # only when set, so runs made before adapters existed keep their identity
        from memtoc.core.adapter import adapter_sha256

        identity["adapter_sha256"] = adapter_sha256(cfg.model_spec.adapter)
    return identity


def run_identity(cfg: EvaluationConfig, bench: Benchmark, provenance: dict[str, Any], frame: str,
                 edit_spec: dict[str, Any] | None, *, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings that decide what a record means; a run directory never mixes two of these."""
    model = {
        "model": provenance.get("model"), "weights_sha256": (provenance.get("weights") or {}).get("sha256"),
        "backend": provenance.get("backend", cfg.model_spec.backend), "dtype": provenance.get("dtype"),
        "device_type": str(provenance.get("device", "")).split(":")[0],
        "chat_template_sha256": provenance.get("chat_template_sha256"),
    }
    return {**model, **(settings if settings is not None else settings_identity(cfg, bench, frame, edit_spec))}


def bind_episodes(edit: Any, episodes: Sequence[Episode], *, with_tool: bool) -> Any:
    """Give the edit the batch's user prompts and tool-output spans (``tool_span`` positions need them)."""
    if edit is None:
        return None
    if with_tool:
        return edit.bind([ep.prompt for ep in episodes], [ep.tool_output_span for ep in episodes])
    return edit.bind([ep.closed_book_prompt for ep in episodes], [None] * len(episodes))
