"""The agent task: MemToC episodes replayed through the agent loop, one arm per tool-choice protocol.

Registered as task ``agent`` (:mod:`memtoc.core.tasks`), so ``memtoc agent evaluate`` runs through the one evaluate
job (:func:`memtoc.jobs.evaluate.evaluate`, over :func:`memtoc.tasks.evaluation.evaluate_task`): identity checked
before the model loads, resumable, the summary written atomically.

The replayed slice (``--slice``): by default the *memory-right* slice (paper App. G), the episodes of the
selected conditions (default ``tool_right``) whose question the model answers correctly closed-book; ``all``
replays every selected episode. Memory comes from a finished ``memtoc evaluate`` run (``--run DIR``: its
episode records, so the slice is exactly that run's) or, without ``--run``, from a closed-book pass made here
with the evaluator's forced closed-book prompts and ``memory_status`` (``agent_closed_book.jsonl``).

Run directory: ``run.json`` (identity), ``agent_closed_book.jsonl``, ``agent_episodes.jsonl`` (one record per
episode x protocol x repetition: every turn, the raw calls, their validation errors, the mechanism class, the
score), ``summary.json`` (:func:`memtoc.tasks.agent.metrics.summarize_agent`). Protocols are not part of the identity:
running ``--protocol auto`` then ``--tool-choice guided`` into the same directory adds an arm, and the summary
(and the paired contrasts) cover every arm the directory holds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import memtoc
from memtoc.tasks.agent.loop import (CALL_PARSER, AgentItem, AgentSpec, LoopSettings, detect_tool_protocol,
                                    run_agent_episodes)
from memtoc.tasks.agent.metrics import format_per_seed, format_table7, summarize_agent
from memtoc.tasks.agent.protocols import DECODINGS, load_agent_prompts, parse_protocols
from memtoc.tasks.agent.schemas import tool_schemas
from memtoc.core.backend_kinds import BACKEND_NAMES, TOOL_PARSERS, backend_kind
from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.conditions import set_default
from memtoc.core.config import MODEL_AS_GIVEN, ConfigError, EpisodeSelection, JobSettings, ModelSpec, flat_record
from memtoc.bench.episodes import build_episodes, parse_conditions, parse_formulations
from memtoc.core.errors import RunStoreError
from memtoc.core.options import here, opt, option
from memtoc.core.provenance import git_revision
from memtoc.runs.result import RunResult, read_records, read_summary
from memtoc.runs.runstore import JsonlLog, open_run_dir, read_run_info
from memtoc.scoring import memory_status
from memtoc.core.tasks import register_task

__all__ = ["AgentSettings", "AgentRunConfig", "AgentEvaluation", "SLICES", "evaluate_agent"]

SLICES = ("memory-right", "all")


@dataclass(frozen=True)
class AgentSettings:
    """The agent-task options: tool-choice protocols, decoding, sampled repetitions, and the replayed slice (the
    sampling temperature is the generation piece's ``--temperature``)."""

    tool_choice: str = field(default="auto", metadata=opt(
        "tool-choice protocol(s), comma list of guided,auto,two-stage, or all (paper App. G: a1 named schema-guided "
        "call, a2 free choice, a4 decide-then-call)"))
    decoding: str = field(default="auto", metadata=opt(
        "call turns: auto (constrained for guided, free otherwise), free, or constrained to the tool's schema "
        "(xgrammar on hf, vLLM guided decoding on vllm)", choices=("auto", "free", "constrained")))
    repetitions: int = field(default=1, metadata=option(
        "repetitions", help="sampled repetitions per episode and protocol (needs --temperature > 0)"))
    sample_seed: int = field(default=0, metadata=option("sample_seed"))
    slice: str = field(default="memory-right", metadata=opt(
        "episodes replayed: the memory-right slice (closed-book answer correct) or all",
        choices=("memory-right", "all")))
    tool_call_parser: str = field(default="memtoc", metadata=opt(
        "how call turns are parsed: memtoc (any JSON call object in the turn), or the name of a vLLM tool-call parser "
        "(hermes, llama3_json, pythonic, ...: as vllm serve --tool-call-parser reads a served model's calls; "
        "--backend vllm)"))
    run: str | None = field(default=None, metadata=option("run", help=(
        "finished memtoc evaluate run whose memory labels define the slice (default: a closed-book pass is made "
        "here)")))


@dataclass
class AgentRunConfig:
    """``memtoc agent evaluate``: model, episodes, generation budget, run settings, agent settings."""
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-run", "run": "input-run", "adapter": "input-dir"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = (*MODEL_AS_GIVEN, "stop_at_final_line")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        "conditions": here("conditions whose episodes are replayed (default tool_right)"),
        "max_new_tokens": here("generation budget per agent turn"),
        "out": here("run directory (resumed if it exists with the same settings; another --protocol adds an arm)",
                    required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    selection: EpisodeSelection = field(default_factory=lambda: EpisodeSelection(conditions=set_default("agent")))
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=96))
    #: App. G: "Intervals are percentile bootstrap, B = 2,000"
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/agent", n_boot=2000))
    agent: AgentSettings = field(default_factory=AgentSettings)
    TASK_NAME: ClassVar[str] = "agent"

    def __post_init__(self) -> None:
        a = self.agent
        temperature = self.generation.temperature      # --temperature: the generation piece's, as in every job
        parse_protocols(a.tool_choice)
        if a.decoding not in DECODINGS:
            raise ConfigError(f"--decoding must be one of {', '.join(DECODINGS)}, not {a.decoding!r}")
        if a.slice not in SLICES:
            raise ConfigError(f"--slice must be one of {', '.join(SLICES)}, not {a.slice!r}")
        for name, ok, need in (("temperature", temperature >= 0, ">= 0"), ("repetitions", a.repetitions >= 1, ">= 1"),
                               ("max_new_tokens", self.generation.max_new_tokens >= 1, ">= 1")):
            if not ok:
                raise ConfigError(f"--{name.replace('_', '-')} must be {need}")
        if temperature == 0 and a.repetitions > 1:
            raise ConfigError("--repetitions > 1 needs --temperature > 0 (greedy repetitions are identical)")
        if a.tool_call_parser != CALL_PARSER and not backend_kind(self.model_spec.backend).offers(TOOL_PARSERS):
            with_parsers = [n for n in BACKEND_NAMES if backend_kind(n).offers(TOOL_PARSERS)]
            raise ConfigError(f"--tool-call-parser {a.tool_call_parser} is an engine's tool-call parser: it needs a "
                              f"backend with one (--backend {' or '.join(with_parsers)}; the "
                              f"{self.model_spec.backend} backend reads calls with {CALL_PARSER})")
        parse_conditions(self.selection.conditions)
        parse_formulations(self.selection.formulations)
        if self.agent.run is not None and not (Path(self.agent.run) / "episodes.jsonl").is_file():
            raise ConfigError(f"--run {self.agent.run}: not a finished memtoc evaluate run (no episodes.jsonl)")


def _items_from_run(run: str, conditions: Sequence[str], formulations: Sequence[str], memory_right: bool,
                    schemas: Mapping[str, Any]) -> list[AgentItem]:
    """The selected episodes of a finished run (its records carry question, gold, return and memory) whose
    question has one of ``schemas`` (the selected questions')."""
    recs = JsonlLog.read(Path(run) / "episodes.jsonl", "episode_id").records()
    recs = [r for r in recs if r.get("arm", r.get("condition")) in conditions and r.get("formulation") in formulations
            and r.get("tool_output") is not None and (r.get("memory_correct") is True or not memory_right)]
    return [_item(r, schemas[r["question_id"]]) for r in recs if r["question_id"] in schemas]


def _item(r: Mapping[str, Any], schema: Mapping[str, Any]) -> AgentItem:
    """An agent item from an episode record with its closed-book memory (a run's, or one planned here)."""
    return AgentItem(episode_id=r["episode_id"], question_id=r["question_id"], formulation=r["formulation"],
                     question=r["question"], gold=r["gold_answer"], aliases=tuple(r.get("aliases") or ()),
                     tool_output=dict(r["tool_output"]), memory_span=r.get("memory_span") or "",
                     mem_absent=bool(r.get("mem_absent")), memory_correct=r.get("memory_correct"),
                     schema=schema, condition=str(r.get("arm", r.get("condition")) or ""))


class AgentEvaluation:
    """One agent evaluation (the :class:`memtoc.core.tasks.TaskEvaluation` of task ``agent``)."""

    run_kind = "agent"
    done_text = "agent episodes already run"

    def __init__(self, cfg: AgentRunConfig, edit: Any = None) -> None:
        if edit is not None:
            raise ConfigError("edits are not supported by the agent task yet")
        self.cfg = cfg
        self.protocols = parse_protocols(cfg.agent.tool_choice)
        self.conditions = parse_conditions(cfg.selection.conditions)
        self.formulations = parse_formulations(cfg.selection.formulations)
        self.bench = load_benchmark(cfg.selection.benchmark)
        self.questions = self.bench.select(cfg.selection.question_set, cfg.selection.limit)
        # Every question's schema is checked now: nothing loads on a missing or malformed one.
        self.schemas, self.schemas_sha = tool_schemas(self.bench, [q.id for q in self.questions])
        self.prompts = load_agent_prompts()

    def settings(self) -> dict[str, Any]:
        """What a record means (as the evaluator's identity, the question set and --limit are not in it: a
        larger --limit extends a run, and the summary covers the current selection)."""
        cfg, a = self.cfg, self.cfg.agent
        source = None
        if a.run is not None:
            info = read_run_info(Path(a.run))
            source = {"run": str(Path(a.run).resolve()), "identity_sha256": info.get("identity_sha256")}
        return {"benchmark_files": self.bench.files, "tool_schemas_sha256": self.schemas_sha,
                "agent_prompts_sha256": self.prompts.sha256, "formulations": list(self.formulations),
                "conditions": list(self.conditions), "slice": a.slice, "memory_source": source, "decoding": a.decoding,
                "temperature": cfg.generation.temperature, "sample_seed": a.sample_seed,
                "max_new_tokens": cfg.generation.max_new_tokens,
                "batch_size": cfg.generation.batch_size if cfg.generation.temperature > 0 else None,
                **({"call_parser": a.tool_call_parser} if a.tool_call_parser != CALL_PARSER else {})}

    def open(self, backend: Any, settings: Mapping[str, Any]) -> Path:
        cfg = self.cfg
        prov = backend.provenance()
        first = next(iter(self.schemas.values()))
        self.tool_protocol = detect_tool_protocol(backend.tokenizer, backend.chat, first)
        identity = {"model": prov.get("model"), "weights_sha256": (prov.get("weights") or {}).get("sha256"),
                    "backend": prov.get("backend", cfg.model_spec.backend), "dtype": prov.get("dtype"),
                    "chat_template_sha256": prov.get("chat_template_sha256"), "tool_protocol": self.tool_protocol,
                    **settings}
        if cfg.agent.run is not None:     # its memory labels are the closed-book answers of the same weights
            src = (read_run_info(Path(cfg.agent.run)).get("identity") or {}).get("weights_sha256")
            here = identity["weights_sha256"]
            if src is not None and here is not None and src != here:
                raise ConfigError(f"--run {cfg.agent.run}: field identity.weights_sha256 is {src!r}, this agent "
                                  f"run's is {here!r}; the memory slice must come from a run of the same model")
        info = {"schema_version": "memtoc-agent-run-v1", "config": flat_record(cfg), "model_spec": cfg.model_spec.model,
                "provenance": prov, "package_version": memtoc.__version__, "git": git_revision(),
                "decoding_note": "greedy unless --temperature > 0"}
        self.root = open_run_dir(cfg.job.out, identity=identity, run_info=info, keep_existing=False, kind="agent")
        self.closed = JsonlLog(self.root / "agent_closed_book.jsonl", "key")
        self.log = JsonlLog(self.root / "agent_episodes.jsonl", "key")
        return self.root

    def _closed_book_items(self, backend: Any) -> list[AgentItem]:
        """Closed-book pass (forced prompts, as the evaluator) for the questions not yet answered; the items."""
        cfg = self.cfg
        eps = build_episodes(self.questions, formulations=self.formulations, conditions=self.conditions)
        need = {}
        for ep in eps:
            need.setdefault(f"{ep.question.id}|{ep.formulation}", ep)
        todo = [(k, ep) for k, ep in need.items() if k not in self.closed]
        gen_cfg = GenerationConfig(max_new_tokens=max(cfg.generation.max_new_tokens, 64))
        size = cfg.generation.batch_size or 8
        for lo in range(0, len(todo), size):
            chunk = todo[lo:lo + size]
            gens = backend.generate([ep.closed_book_prompt for _, ep in chunk], gen_cfg)
            recs = []
            for (key, ep), g in zip(chunk, gens):
                q = ep.question
                mem = memory_status(g.text, q.gold_answer, q.aliases)
                recs.append({"key": key, "question_id": q.id, "formulation": ep.formulation, "response": g.text,
                             "memory_span": mem.span, "mem_absent": mem.mem_absent,
                             "memory_correct": mem.memory_correct})
            self.closed.append(recs)
        memory_right = self.cfg.agent.slice == "memory-right"
        items = []
        for ep in eps:
            if ep.tool_output is None:
                continue
            m = self.closed.get(f"{ep.question.id}|{ep.formulation}")
            if memory_right and m["memory_correct"] is not True:
                continue
            items.append(_item({**ep.to_dict(), **m}, self.schemas[ep.question.id]))
        return items

    def solve(self, backend: Any, edit: Any) -> int:
        cfg, a = self.cfg, self.cfg.agent
        if a.run is not None:     # a run may hold more questions than --limit selects
            items = _items_from_run(a.run, self.conditions, self.formulations, a.slice == "memory-right",
                                    self.schemas)
        else:
            items = self._closed_book_items(backend)
        self.items = items
        self.plan = [AgentSpec(it, p, r) for p in self.protocols for r in range(a.repetitions) for it in items]
        todo = [s for s in self.plan if s.key not in self.log]
        n_new = 0

        def on_done(batch: list[dict[str, Any]]) -> None:
            nonlocal n_new
            n_new += self.log.append(batch)
            if cfg.job.progress:
                print(f"  {len(self.log)} agent episodes done ({n_new} new of {len(todo)})", file=sys.stderr,
                      flush=True)

        settings = LoopSettings(max_new_tokens=cfg.generation.max_new_tokens, batch_size=cfg.generation.batch_size or 8,
                                decoding=a.decoding, temperature=cfg.generation.temperature, sample_seed=a.sample_seed,
                                tool_protocol=self.tool_protocol, call_parser=a.tool_call_parser)
        run_agent_episodes(backend, todo, settings, prompts=self.prompts, on_done=on_done)
        return n_new

    def records(self) -> list[dict[str, Any]]:
        """Every arm the directory holds for the current items (a protocol run earlier stays in the summary)."""
        ids = {it.episode_id for it in self.items}
        missing = [s.key for s in self.plan if s.key not in self.log]
        if missing:  # pragma: no cover - run_agent_episodes returns every episode
            raise RunStoreError(f"{len(missing)} agent episodes missing after the run, e.g. {missing[0]}")
        reps = self.cfg.agent.repetitions
        return [r for r in self.log.records() if r["episode_id"] in ids and r["repetition"] < reps]

    def header_lines(self) -> list[str]:
        return []

    def resume_line(self) -> None:
        return None

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        s = summarize_agent(records, n_boot=self.cfg.job.n_boot, seed=self.cfg.job.seed)
        s.update({"n_items": len(self.items), "slice": self.cfg.agent.slice, "tool_protocol": self.tool_protocol,
                  "model": self.cfg.model_spec.model})
        return s

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> RunResult:
        return RunResult(root=self.root, records=records, summary=summary, n_new=n_new,
                         new={"agent_episodes": n_new}, table_text=_table_text(str(self.cfg.model_spec.model), summary),
                         family="agent")


def _table_text(model: str, summary: Mapping[str, Any]) -> str:
    """Table 7, and for a sampled run the per-seed tables with the mean and sd across seeds (App. G)."""
    text = format_table7(model, summary["arms"])
    if summary.get("per_seed"):
        text += "\n\n" + format_per_seed(model, summary["per_seed"])
    return text


class AgentTaskFamily:
    """MemToC episodes as agent tasks (``memtoc agent evaluate``). Evaluation only: no extraction or sweep."""

    name = "agent"

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> AgentEvaluation:
        return AgentEvaluation(cfg, edit)

    def read_run(self, root: Path) -> RunResult:
        """An agent run directory read back: its agent episodes, ``summary.json`` and Table 7 from the summary."""
        root = Path(root)
        summary = read_summary(root)
        text = _table_text(str(summary["model"]), summary) if "arms" in summary else ""
        return RunResult(root=root, records=read_records(root, "agent"), summary=summary, table_text=text,
                         new={"agent_episodes": 0}, family="agent")


register_task(AgentTaskFamily())


def evaluate_agent(cfg: AgentRunConfig, *, backend: Any = None) -> RunResult:
    """Run (or resume) an agent evaluation into ``cfg.out`` through the one evaluate job; returns the run's
    :class:`memtoc.runs.result.RunResult`."""
    from memtoc.tasks.evaluation import evaluate_task

    return evaluate_task(cfg, task="agent", backend=backend)[1]
