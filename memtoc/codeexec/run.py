"""``memtoc codeexec evaluate``: run the agent loop over problems x conditions x repetitions, resumably.

The run directory holds:

- ``run.json``: provenance (model, weights hash and the rest of ``backend.provenance()``, problems SHA-256,
  conditions, policy, seeds, agent settings, package version) and the *identity*: the settings that decide
  what a trial record means (model and weights, problems hash, policy, agent and sandbox settings, protocol).
  Reopening a directory with a different identity is refused; conditions, ``--limit`` and ``--repetitions``
  may change between invocations (the plan grows, finished trials are kept).
- ``trials.jsonl``: one record per problem x condition x repetition (key ``"<id>|<condition>|<policy>|<rep>"``):
  the full transcript (messages and per-turn generations, executions, tool returns), the final text, the graded
  answer and the tool-call count. Appended and fsynced as trials finish (:class:`memtoc.runstore.JsonlLog`),
  so a killed run resumes where it stopped.
- ``summary.json``: :func:`memtoc.codeexec.metrics.summarize` over the trials of the current plan (accuracy,
  adoption, override, tool-call ratio with problem-bootstrap intervals), also printed as a table.

Decoding is greedy, so with the hf backend every repetition of a trial is identical to the first; the
``--repetitions`` option is kept for sampled backends (and the override rate's "known" threshold uses it:
``min_known_correct = min(2, repetitions)``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from memtoc.codeexec.agent import AgentConfig, TrialSpec, formatter_for, run_trials
from memtoc.codeexec.conditions import CONDITIONS
from memtoc.codeexec.metrics import ConditionSummary, MetricsConfig, Trial, summarize
from memtoc.codeexec.problems import SPLITS, Problem, generate_problems, problems_sha256
from memtoc.codeexec.prompts import POLICIES
from memtoc.config import CodeexecTask, ConfigError, JobSettings, ModelSpec, composed
from memtoc.errors import RunStoreError
from memtoc.fileio import write_json_atomic
from memtoc.runstore import JsonlLog, open_run_dir
from memtoc.validate import check_edit_for_model, check_run_dir
from memtoc.vocab import BACKENDS

__all__ = ["CodeexecRunConfig", "CodeexecRunResult", "parse_conditions", "select_problems", "plan_trials",
           "evaluate_codeexec", "load_codeexec_backend", "trials_from_records", "format_table"]

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
    if task.split not in (*SPLITS, "all"):
        raise ConfigError(f"--split must be one of {', '.join([*SPLITS, 'all'])}, not {task.split!r}")
    if task.repetitions < 1:
        raise ConfigError(f"--repetitions must be at least 1, got {task.repetitions}")
    if task.limit is not None and task.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {task.limit}")
    return replace(task, conditions=conditions)


def check_backend(spec: ModelSpec) -> None:
    if spec.backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, not {spec.backend!r}")


@composed(nested=("agent",))
@dataclass
class CodeexecRunConfig:
    """``memtoc codeexec evaluate``: model, task (conditions, policy, split, ...), agent loop and sandbox.

    ``job.seed`` is the seed of the problems and of their corruption factors; ``task.bootstrap_seed`` the seed
    of the bootstrap intervals. Values are checked on construction (:class:`~memtoc.config.ConfigError`).
    """

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=CodeexecTask)
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/codeexec"))
    agent: AgentConfig = field(default_factory=AgentConfig)

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        check_backend(self.model_spec)


@dataclass
class CodeexecRunResult:
    root: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    table_text: str
    n_new: int


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


def _package_version() -> str:
    from memtoc import __version__

    return __version__


def load_codeexec_backend(cfg: CodeexecRunConfig) -> Any:
    from memtoc.backends.factory import load_backend

    return load_backend(cfg.model_spec)


def evaluate_codeexec(cfg: CodeexecRunConfig, backend: Any = None, *, formatter: Any = None,
                      executor: Any = None, edit: Any = None) -> CodeexecRunResult:
    """Run (or resume) the evaluation described by ``cfg``; ``backend`` is loaded from ``cfg.model`` if None.

    ``edit`` (a ``steering.edits.Edit``) is applied to every model turn, bound per call to the rows' first tool
    returns (:func:`memtoc.codeexec.agent.run_trials`); its spec is part of the run identity.
    """
    if edit is not None and cfg.backend != "hf":
        raise ConfigError("edits run on the hf backend (hooks on the decoder blocks); use --backend hf")
    all_problems = generate_problems(cfg.seed)
    known = {"problems_sha256": problems_sha256(all_problems), "problem_seed": cfg.seed, "policy": cfg.policy,
             "agent": cfg.agent.to_dict()}
    if edit is not None:
        from memtoc.fileio import sha256_json

        known["edit_sha256"] = sha256_json(edit.spec)
    check_run_dir(cfg.out, known, kind="codeexec")      # before the model loads
    if backend is None:
        check_edit_for_model(edit, cfg.model)
        backend = load_codeexec_backend(cfg)
    fmt = formatter or formatter_for(backend, cfg.agent.protocol)
    problems = select_problems(cfg.seed, cfg.split, cfg.limit)
    provenance = backend.provenance()
    weights = provenance.get("weights")
    identity = {"model": provenance.get("model", cfg.model), "weights": weights,
                "chat_template_sha256": provenance.get("chat_template_sha256"),
                "problems_sha256": problems_sha256(all_problems), "problem_seed": cfg.seed, "policy": cfg.policy,
                "agent": cfg.agent.to_dict(), "protocol": fmt.protocol}
    if edit is not None:
        from memtoc.fileio import sha256_json

        identity["edit_sha256"] = sha256_json(edit.spec)
    info = {"schema_version": RUN_SCHEMA, "model_spec": cfg.model, "provenance": provenance,
            "problems_sha256": identity["problems_sha256"],
            "conditions": list(cfg.conditions), "policy": cfg.policy, "seed": cfg.seed,
            "bootstrap_seed": cfg.bootstrap_seed, "n_boot": cfg.n_boot, "split": cfg.split, "limit": cfg.limit,
            "repetitions": cfg.repetitions, "n_problems": len(problems), "agent": cfg.agent.to_dict(),
            "protocol": fmt.protocol, "package_version": _package_version(), "backend": cfg.backend,
            "edit": None if edit is None else edit.spec,
            "decoding": "greedy (repetitions of a trial are identical on the hf backend)"}
    root = open_run_dir(cfg.out, identity=identity, run_info=info, keep_existing=False, kind="codeexec")
    log = JsonlLog(root / "trials.jsonl", "key")
    plan = plan_trials(problems, cfg.conditions, cfg.policy, cfg.repetitions)
    todo = [s for s in plan if s.key not in log]
    n_new = 0

    def on_done(batch: list) -> None:
        nonlocal n_new
        n_new += log.append([r.to_record() for r in batch])
        if cfg.progress:
            print(f"  {len(log)} trials done ({n_new} new of {len(todo)} to run)", flush=True)

    if todo:
        kwargs = {"executor": executor} if executor is not None else {}
        run_trials(backend, todo, cfg.agent, formatter=fmt, on_done=on_done, edit=edit, **kwargs)
    records = [log.get(s.key) for s in plan]
    missing = [s.key for s, r in zip(plan, records) if r is None]
    if missing:  # pragma: no cover - run_trials returns every trial
        raise RunStoreError(f"{len(missing)} trials missing after the run, e.g. {missing[0]}")
    mcfg = MetricsConfig(repetitions=cfg.repetitions, min_known_correct=min(2, cfg.repetitions),
                         n_boot=cfg.n_boot, seed=cfg.bootstrap_seed)
    rows = summarize(trials_from_records(records), mcfg)
    summary = {"schema_version": "memtoc-codeexec-summary-v1", "n_trials": len(records),
               "n_problems": len(problems), "conditions": list(cfg.conditions), "policy": cfg.policy,
               "repetitions": cfg.repetitions, "metrics_config": asdict(mcfg),
               "mean_tool_calls": {c: sum(r["tool_calls"] for r in records if r["condition"] == c) /
                                   max(1, sum(1 for r in records if r["condition"] == c)) for c in cfg.conditions},
               "rows": [r.to_dict() for r in rows]}
    write_json_atomic(root / "summary.json", summary)
    return CodeexecRunResult(root=root, records=records, summary=summary, table_text=format_table(rows),
                             n_new=n_new)
