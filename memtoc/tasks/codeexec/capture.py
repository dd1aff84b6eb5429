"""``memtoc codeexec extract``: the residual stream at the final prompt token after the first tool return.

The job body is :func:`memtoc.jobs.codeexec.extract_codeexec` (the capture library of ``activations.batches``, as
``memtoc extract``); this module holds its config and the family's data: the items, their store settings
(:func:`capture_plan`), the prompts and rows of a batch and the labels of ``--run`` (docs/codeexec.md).

Without ``--run`` each problem x condition is the conversation a ``--first-call scripted`` trial shows the model
after its first tool return (:func:`memtoc.tasks.codeexec.agent.scripted_conversation`, the call really
executed); no model turn is generated. With ``--run RUN_DIR`` (the overreliance paper's protocol) the prompts are
that run's own trajectories cut after the first tool return, labelled by outcome
(:mod:`memtoc.tasks.codeexec.trajectories`), and ``episode_id`` is the trial key. The index columns put the
problem id in ``question_id`` (probe folds and direction pairs group by problem) and the policy in
``formulation``, so ``memtoc probe`` and ``memtoc direction`` read the store like any MemToC store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

from memtoc.tasks.codeexec.agent import (AgentConfig, ScriptedConversation, TrialSpec, scripted_conversation)
from memtoc.tasks.codeexec.conditions import TOOL_CONDITIONS
from memtoc.tasks.codeexec.run import SandboxCheck, check_task
from memtoc.tasks.codeexec.sandbox import ExecutionResult
from memtoc.core.config import MODEL_AS_GIVEN, CaptureSettings, CodeexecTask, ConfigError, JobSettings, ModelSpec
from memtoc.core.options import here, option

if TYPE_CHECKING:  # torch and h5py: loaded when a block is captured, not by the config (read by --help)
    from activations.positions import PositionSelector
    from activations.store import RowBlock

__all__ = ["CodeexecExtractConfig", "FirstReturnPrompt", "CodeexecCapturePlan",
           "capture_plan", "capture_block", "trajectory_labels"]


@dataclass
class CodeexecExtractConfig:
    """``memtoc codeexec extract``: the run's pieces (tool conditions only, scripted first call) plus capture."""
    #: the flat record (memtoc.core.config.flat_record) keeps the agent settings whole
    RECORD_NESTED: ClassVar[tuple[str, ...]] = ("agent",)
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-store", "run": "input-run", "adapter": "input-dir"}
    #: options checked against the model's shape before its weights load (memtoc.jobs.preflight)
    PRELOAD: ClassVar[dict[str, str]] = {"model": "model", "layers": "sites"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = (*MODEL_AS_GIVEN, "repetitions", "bootstrap_seed", "n_boot",
                                             "max_new_tokens", "first_call", "temperature", "sample_seed",
                                             "max_total_new_tokens")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        "conditions": here("comma list of P0,P1+,P1-,P2+,P2-"),
        "layers": here("sites: all | last | N | N-M, comma separated (0 = embedding output)"),
        "position_kinds": here("last_input,tool_span,from_tool_return"),
        "max_tool_rounds": here("as in the runs the activations describe"),
        "out": here("HDF5 store (resumed if it exists with the same settings)", required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=lambda: CodeexecTask(conditions=("P0", "P1+", "P1-"), split="dev"))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="codeexec_acts.h5"))
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(first_call="scripted"))
    capture: CaptureSettings = field(default_factory=CaptureSettings)
    #: labelled by memtoc.tasks.codeexec.trajectories
    run: str | None = field(default=None, metadata=option("run", help=(
        "a 'codeexec evaluate' run directory: capture its own (model-initiated) trajectories after each trial's "
        "first tool return, labelled in the outcome column (accepted / adopted / rejected / no_answer / ambiguous) "
        "-- the overreliance paper's probe protocol; without it, scripted first calls labelled by condition")))
    sandbox: SandboxCheck = field(default_factory=SandboxCheck)
    TASK_NAME: ClassVar[str] = "codeexec"     #: the task the jobs run for this config (memtoc.core.tasks)

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        if "no_tool" in self.task.conditions:
            raise ConfigError("--conditions: no_tool has no tool return to capture after; choose from "
                              f"{', '.join(TOOL_CONDITIONS)}")
        if self.run is None and self.agent.first_call != "scripted":
            raise ConfigError("without --run the capture builds the first tool return from the scripted call "
                              "(first_call=scripted); give --run RUN_DIR to capture a run's own trajectories")


@dataclass(frozen=True)
class FirstReturnPrompt:
    """One problem x condition: the rendered conversation up to the model's reply to the first tool return."""

    spec: TrialSpec
    conversation: ScriptedConversation

    @property
    def text(self) -> str:
        return self.conversation.text

    @property
    def return_span(self) -> tuple[int, int] | None:
        return self.conversation.return_span

    @property
    def episode_id(self) -> str:
        s = self.spec
        return f"{s.problem.id}|{s.condition}|{s.policy}"


def run_once_per_code(executor: Callable[..., ExecutionResult]) -> Callable[..., ExecutionResult]:
    """Run each distinct code once (every condition of a problem runs the same scripted code)."""
    cache: dict[tuple, ExecutionResult] = {}

    def run(code: str, **kw: Any) -> ExecutionResult:
        key = (code, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = executor(code, **kw)
        return cache[key]
    return run


def capture_block(backend: Any, items: Sequence[FirstReturnPrompt], sites: Sequence[int],
                  selector: PositionSelector) -> RowBlock:
    """The store rows of ``items``: one forward of their first-return prompts, captured at ``sites``."""
    from activations.batches import captured_rows
    from activations.capture import ResidualCapture

    texts = [it.text for it in items]
    cap = ResidualCapture(sites, selector, prompts=texts, tool_spans=[it.return_span for it in items])
    backend.preformatted().forward(texts, capture=cap)
    return captured_rows(backend, cap, [{"episode_id": it.episode_id, "question_id": it.spec.problem.id,
                                         "condition": it.spec.condition, "arm": "codeexec",
                                         "formulation": it.spec.policy} for it in items])


@dataclass
class CodeexecCapturePlan:
    """What ``memtoc codeexec extract`` captures: ``items`` in capture order (trial specs, or with ``--run`` the
    run's trial records that have a first tool return) under their store ``keys``, and the store-identity fields
    known before the model loads. ``source``: the ``--run`` directory's run.json (None for scripted prompts)."""

    items: list
    keys: list[str]
    settings: dict[str, Any]
    source: dict[str, Any] | None = None
    by_id: dict[str, Any] = field(default_factory=dict)     #: problem id -> problem (``--run``)


def capture_plan(cfg: CodeexecExtractConfig, selector: PositionSelector) -> CodeexecCapturePlan:
    """The items of ``cfg`` and their settings; refuses (one line) positions a prompt capture cannot have and a
    ``--run`` made on another problem set."""
    from activations import ActivationStoreError
    from memtoc.tasks.codeexec.problems import generate_problems, problems_sha256
    from memtoc.tasks.codeexec.run import select_problems

    if selector.needs_generation or "all" in selector.kinds:
        raise ActivationStoreError("codeexec extract captures prompt positions: last_input, tool_span, "
                                   "from_tool_return")
    problems = select_problems(cfg.job.seed, cfg.task.split, cfg.task.limit)
    settings = {"family": "codeexec", "problems_sha256": problems_sha256(generate_problems(cfg.job.seed)),
                "problem_seed": cfg.job.seed, "policy": cfg.task.policy, "agent": cfg.agent.to_dict(),
                "positions": list(selector.kinds)}
    if cfg.run is None:
        specs = [TrialSpec(problem=p, condition=c, policy=cfg.task.policy) for p in problems
                 for c in cfg.task.conditions]
        return CodeexecCapturePlan(items=specs, keys=[f"{s.problem.id}|{s.condition}|{s.policy}" for s in specs],
                                   settings=settings)
    from memtoc.tasks.codeexec.trajectories import read_trials, run_identity, trial_outcome

    info = run_identity(cfg.run)
    if int(info.get("seed", -1)) != cfg.job.seed:
        raise ConfigError(f"--run {cfg.run} was made with problem seed {info.get('seed')}, not --seed {cfg.job.seed}")
    if info.get("problems_sha256") != settings["problems_sha256"]:
        raise ConfigError(f"--run {cfg.run} was made on another problem set (problems_sha256 differs)")
    by_id = {p.id: p for p in problems}
    records = [r for r in read_trials(cfg.run)
               if r.get("problem_id") in by_id and r.get("condition") in cfg.task.conditions
               and r.get("policy") == cfg.task.policy]
    records = [r for r in records if trial_outcome(r, by_id[r["problem_id"]]) is not None]
    # the run's own agent settings; its identity names the trajectories
    settings.update(agent=info.get("agent"), source_run=info.get("identity_sha256"), capture="trajectories")
    return CodeexecCapturePlan(items=records, keys=[str(r["key"]) for r in records], settings=settings,
                               source=info, by_id=by_id)


def batch_prompts(plan: CodeexecCapturePlan, batch: Sequence[Any], fmt: Any, config: AgentConfig,
                  executor: Callable[..., ExecutionResult]) -> list[Any]:
    """The prompts of a batch of ``plan.items``: the scripted conversation up to the first tool return (its call
    run by ``executor``), or with ``--run`` the trajectory cut after it."""
    if plan.source is None:
        return [FirstReturnPrompt(s, scripted_conversation(s, fmt, config, executor=executor)) for s in batch]
    from memtoc.tasks.codeexec.trajectories import trajectory_prompt

    prompts = [trajectory_prompt(r, plan.by_id[r["problem_id"]], fmt) for r in batch]
    return [p for p in prompts if p is not None]


def trajectory_labels(plan: CodeexecCapturePlan, run: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``--run``: the outcome (accepted / adopted / rejected / no_answer / ambiguous) and the answer's grading of
    every trajectory, by trial key, and the labels' source."""
    from memtoc.tasks.codeexec.trajectories import answer_cell, trial_outcome

    labels = {str(r["key"]): {"outcome": trial_outcome(r, plan.by_id[r["problem_id"]]), "cell": answer_cell(r)}
              for r in plan.items}
    return labels, {"run": str(run), "run_identity_sha256": (plan.source or {}).get("identity_sha256"),
                    "labels": "memtoc.tasks.codeexec.trajectories.trial_outcome"}
