"""``memtoc codeexec evaluate``: run the agent loop over problems x conditions x repetitions, resumably.

The run is the code-executor task (``memtoc.tasks.codeexec.task``) through the one evaluate job
(:func:`memtoc.jobs.evaluate.evaluate`, entry :func:`memtoc.jobs.codeexec.evaluate_codeexec`); this module holds its
config, plan and table. The run directory (``run.json``, ``trials.jsonl`` appended and fsynced as trials finish,
``summary.json``) is described in docs/codeexec.md: a different identity is refused, while conditions,
``--limit`` and ``--repetitions`` may change between invocations (the plan grows, finished trials are kept).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Sequence

from memtoc.tasks.codeexec.agent import AgentConfig, TrialSpec
from memtoc.tasks.codeexec.conditions import CONDITIONS
from memtoc.tasks.codeexec.metrics import ConditionSummary, Trial
from memtoc.tasks.codeexec.problems import SPLITS, Problem, generate_problems
from memtoc.tasks.codeexec.prompts import POLICIES
from memtoc.tasks.codeexec.protocol import not_given, paper_helps
from memtoc.core.config import MODEL_AS_GIVEN, CodeexecTask, ConfigError, JobSettings, ModelSpec
from memtoc.core.options import here, opt, option

__all__ = ["CodeexecRunConfig", "SandboxCheck", "resolve_run_protocol", "parse_conditions", "select_problems",
           "plan_trials", "trials_from_records", "format_table"]

RUN_SCHEMA = "memtoc-codeexec-run-v1"


def parse_conditions(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"all"`` or a comma list of conditions, in :data:`CONDITIONS` order, without repeats."""
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [c.strip() for c in items if c.strip()]
    if items == ["all"]:
        return CONDITIONS
    bad = [c for c in items if c not in CONDITIONS]
    if bad:
        raise ConfigError(f"--conditions: unknown condition {bad[0]!r}; choose from {', '.join(CONDITIONS)} or all")
    if not items:
        raise ConfigError("--conditions: no condition given")
    return tuple(c for c in CONDITIONS if c in items)


def check_task(task: CodeexecTask) -> CodeexecTask:
    """The task with its conditions parsed; every value checked (one line naming the option)."""
    conditions = parse_conditions(task.conditions)
    if task.policy not in POLICIES:
        raise ConfigError(f"--policy: unknown policy {task.policy!r}; choose from {', '.join(POLICIES)}")
    if task.split is not None and task.split not in (*SPLITS, "all"):   # None: not given (resolve_run_protocol)
        raise ConfigError(f"--split must be one of {', '.join([*SPLITS, 'all'])}, not {task.split!r}")
    if task.repetitions is not None and task.repetitions < 1:
        raise ConfigError(f"--repetitions must be at least 1, got {task.repetitions}")
    if task.limit is not None and task.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {task.limit}")
    return replace(task, conditions=conditions)


@dataclass(frozen=True)
class SandboxCheck:
    """What the sandbox must enforce before a code-executor job starts (not part of a run's identity)."""

    require_isolation: bool = field(default=False, metadata=opt(
        "refuse to run unless the sandbox's kernel isolation (Landlock, network namespace, seccomp) is all in force "
        "here (see docs/sandbox.md)"))


@dataclass
class CodeexecRunConfig:
    """``memtoc codeexec evaluate``: model, task (conditions, policy, split, ...), agent loop and sandbox.

    ``job.seed`` seeds the problems and their corruption factors, ``task.bootstrap_seed`` the intervals. The fields
    the run protocol fills are None (not given) until the job resolves them (:func:`resolve_run_protocol`).
    """
    #: the flat record (memtoc.core.config.flat_record) keeps the agent settings whole
    RECORD_NESTED: ClassVar[tuple[str, ...]] = ("agent",)
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output-run", "edit": "input", "adapter": "input-dir"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = MODEL_AS_GIVEN
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        **paper_helps(max_new_tokens="generation budget per model turn"),
        "seed": here("problem and corruption-factor seed"), "batch_size": here("trials per backend call"),
        "out": here("run directory (resumed if it exists with the same settings)", required=True)}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=lambda: not_given(CodeexecTask))
    #: 2,000 bootstrap draws: overreliance paper seed 002 L111 ("2,000 item-bootstrap resamples")
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/codeexec", n_boot=2000))
    agent: AgentConfig = field(default_factory=lambda: not_given(AgentConfig))
    #: ``paper``: the overreliance paper's main evaluation where an option is not given
    #: (:mod:`memtoc.tasks.codeexec.protocol`); the fields it filled are in ``protocol_filled``
    protocol: str = field(default="none", metadata=opt(
        "paper: the overreliance paper's main evaluation (3 repetitions, override on problems correct in 2 of 3 "
        "no-tool runs, 50 tool calls and 16k output tokens per run, the model's own calls, all 300 problems, "
        "sampled); options not given take the paper's value", name="codeexec_protocol", flag="--protocol",
        choices=("none", "paper")))
    #: loaded by the evaluate job
    edit: str | None = field(default=None, metadata=option(
        "edit", help="edit spec applied to every model turn (hf backend)"))
    sandbox: SandboxCheck = field(default_factory=SandboxCheck)
    TASK_NAME: ClassVar[str] = "codeexec"     #: the task the jobs run for this config (memtoc.core.tasks)

    def __post_init__(self) -> None:
        from memtoc.tasks.codeexec.protocol import RUN_PROTOCOLS

        if self.protocol not in RUN_PROTOCOLS:
            raise ConfigError(f"--protocol must be one of {', '.join(RUN_PROTOCOLS)}, not {self.protocol!r}")
        self.protocol_filled: list[str] = []       # set by resolve_run_protocol
        self.task = check_task(self.task)
        check_verify(self)


def check_verify(cfg: CodeexecRunConfig) -> None:
    rounds = cfg.agent.max_tool_rounds          # None: not given (resolve_run_protocol checks again)
    if cfg.task.policy == "Verify" and rounds is not None and rounds < 2:
        raise ConfigError("--policy Verify asks the model to verify a conflicting return with additional tool "
                          f"calls; --max-tool-rounds {cfg.agent.max_tool_rounds} leaves no second call (give 2+)")


def resolve_run_protocol(cfg: CodeexecRunConfig) -> CodeexecRunConfig:
    """``cfg`` with the run protocol's value in every protocol field the user did not give (None), else the
    ordinary default (:func:`~memtoc.tasks.codeexec.protocol.apply_run_protocol`); the fields whose value the
    protocol set are in ``protocol_filled``. A resolved config (no field None) is returned as it is."""
    import copy

    from memtoc.tasks.codeexec.protocol import apply_run_protocol

    task, agent, filled = apply_run_protocol(cfg.protocol, cfg.task, cfg.agent)
    if task is cfg.task and agent is cfg.agent:
        return cfg
    out = copy.copy(cfg)
    out.task, out.agent, out.protocol_filled = check_task(task), agent, filled
    check_verify(out)
    return out


def select_problems(seed: int, split: str, limit: int | None) -> list[Problem]:
    """The split's problems (all 300 for ``"all"``) in generation order, the first ``limit`` of them.

    Problems are ordered by operation, so a small ``limit`` covers few operations; that is fine for smoke runs.
    """
    problems = [p for p in generate_problems(seed) if split == "all" or p.split == split]
    return problems[:limit] if limit is not None else problems


def plan_trials(problems: Sequence[Problem], conditions: Sequence[str], policy: str,
                repetitions: int) -> list[TrialSpec]:
    return [TrialSpec(problem=p, condition=c, policy=policy, repetition=r)
            for r in range(repetitions) for c in conditions for p in problems]


def trials_from_records(records: Sequence[dict[str, Any]]) -> list[Trial]:
    return [Trial(problem_id=r["problem_id"], condition=r["condition"], repetition=int(r["repetition"]),
                  correct=bool(r["correct"]), adopted=r["adopted"], tool_calls=int(r["tool_calls"]),
                  policy=r["policy"]) for r in records]


def _fmt(est: Any, pct: bool = True) -> str:
    if est is None:
        return "-"
    v, lo, hi = est.value, est.ci.low, est.ci.high
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if pct:
        return f"{100 * v:5.1f}% [{100 * lo:.0f},{100 * hi:.0f}]"
    return f"{v:.2f} [{lo:.2f},{hi:.2f}]"


def format_table(rows: Sequence[ConditionSummary]) -> str:
    head = (f"{'policy':8s} {'condition':9s} {'n':>4s}  {'accuracy':18s} {'adoption':18s} {'override':18s} "
            "tool-call ratio")
    lines = [head, "-" * len(head)]
    for s in rows:
        lines.append(f"{s.policy:8s} {s.condition:9s} {s.accuracy.n_trials:4d}  {_fmt(s.accuracy):18s} "
                     f"{_fmt(s.adoption):18s} {_fmt(s.override):18s} {_fmt(s.tool_call_ratio, pct=False)}")
    return "\n".join(lines)
