"""The code-executor task: problems x conditions trials, the agent loop as solver, the grader, its metrics.

Its evaluation is the code executor's implementation of the task hooks (:mod:`memtoc.core.tasks`), run by the same
job as MemToC's: :func:`memtoc.jobs.evaluate.evaluate` (over :func:`memtoc.tasks.evaluation.evaluate_task`). Its
capture and sweep are job bodies of their own (:func:`memtoc.jobs.codeexec.extract_codeexec`,
:func:`memtoc.jobs.codeexec.run_codeexec_sweep`) over the family's data (:mod:`memtoc.tasks.codeexec.capture`,
:mod:`memtoc.tasks.codeexec.sweep`).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import memtoc
from memtoc.tasks.codeexec.agent import formatter_for, run_trials
from memtoc.tasks.codeexec.metrics import MetricsConfig, summarize
from memtoc.tasks.codeexec.problems import generate_problems, problems_sha256
from memtoc.tasks.codeexec.run import (RUN_SCHEMA, CodeexecRunConfig, format_table, plan_trials,
                                       resolve_run_protocol, select_problems, trials_from_records)
from memtoc.tasks.codeexec.sandbox import ExecutionResult
from memtoc.core.backend_kinds import EDITS, backend_kind
from memtoc.core.config import ConfigError
from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import sha256_json
from memtoc.runs.result import RunResult, read_records, read_summary
from memtoc.runs.runstore import JsonlLog, open_run_dir, read_run_info
from memtoc.core.tasks import register_task

__all__ = ["CodeexecTaskFamily", "CodeexecEvaluation"]


class CodeexecEvaluation:
    """One code-executor evaluation: problems x conditions x repetitions, each trial one agent-loop run."""

    run_kind = "codeexec"
    done_text = "trials already run"

    def __init__(self, cfg: CodeexecRunConfig, edit: Any = None, *, formatter: Any = None,
                 executor: Callable[..., ExecutionResult] | None = None) -> None:
        if edit is not None and not backend_kind(cfg.model_spec.backend).offers(EDITS):
            raise ConfigError(f"edits need a backend that applies them in generation; the {cfg.model_spec.backend} "
                              "backend does not (use --backend hf)")
        cfg = resolve_run_protocol(cfg)      # the run protocol's values where the user gave none (None)
        self.cfg, self.edit, self.formatter, self.executor = cfg, edit, formatter, executor
        self.all_problems = generate_problems(cfg.job.seed)

    def settings(self) -> dict[str, Any]:
        cfg = self.cfg
        known = {"problems_sha256": problems_sha256(self.all_problems), "problem_seed": cfg.job.seed,
                 "policy": cfg.task.policy, "agent": cfg.agent.to_dict()}
        if self.edit is not None:
            known["edit_sha256"] = sha256_json(self.edit.spec)
        return known

    def open(self, backend: Any, settings: Mapping[str, Any]) -> Path:
        cfg, edit = self.cfg, self.edit
        self.fmt = fmt = self.formatter or formatter_for(backend, cfg.agent.call_format)
        self.problems = select_problems(cfg.job.seed, cfg.task.split, cfg.task.limit)
        provenance = backend.provenance()
        identity = {"model": provenance.get("model", cfg.model_spec.model), "weights": provenance.get("weights"),
                    "chat_template_sha256": provenance.get("chat_template_sha256"),
                    "problems_sha256": settings["problems_sha256"], "problem_seed": cfg.job.seed,
                    "policy": cfg.task.policy,
                    "agent": cfg.agent.to_dict(), "protocol": fmt.protocol}
        if edit is not None:
            identity["edit_sha256"] = settings["edit_sha256"]
        info = {"schema_version": RUN_SCHEMA, "model_spec": cfg.model_spec.model, "provenance": provenance,
                "problems_sha256": identity["problems_sha256"],
                "conditions": list(cfg.task.conditions), "policy": cfg.task.policy, "seed": cfg.job.seed,
                "bootstrap_seed": cfg.task.bootstrap_seed, "n_boot": cfg.job.n_boot, "split": cfg.task.split,
                "limit": cfg.task.limit,
                "repetitions": cfg.task.repetitions, "n_problems": len(self.problems), "agent": cfg.agent.to_dict(),
                "protocol": fmt.protocol, "package_version": memtoc.__version__, "backend": cfg.model_spec.backend,
                "edit": None if edit is None else edit.spec,
                "run_protocol": {"name": getattr(cfg, "protocol", "none"),
                                 "filled": list(getattr(cfg, "protocol_filled", []))},
                "decoding": (f"sampled (temperature {cfg.agent.temperature}, seed {cfg.agent.sample_seed}; each "
                             "turn seeded by trial key and turn index)" if cfg.agent.temperature > 0 else
                             "greedy (repetitions of a trial are identical on the hf backend)")}
        self.root = open_run_dir(cfg.job.out, identity=identity, run_info=info, keep_existing=False, kind="codeexec")
        self.log = JsonlLog(self.root / "trials.jsonl", "key")
        self.plan = plan_trials(self.problems, cfg.task.conditions, cfg.task.policy, cfg.task.repetitions)
        return self.root

    def solve(self, backend: Any, edit: Any) -> int:
        """The agent loop over the unfinished trials; records appended (and fsynced) as batches finish."""
        log, cfg = self.log, self.cfg
        todo = [s for s in self.plan if s.key not in log]
        n_new = 0

        def on_done(batch: list) -> None:
            nonlocal n_new
            n_new += log.append([r.to_record() for r in batch])
            if cfg.job.progress:
                print(f"  {len(log)} trials done ({n_new} new of {len(todo)} to run)", flush=True)

        if todo:
            kwargs = {"executor": self.executor} if self.executor is not None else {}
            run_trials(backend, todo, cfg.agent, formatter=self.fmt, on_done=on_done, edit=edit, **kwargs)
        return n_new

    def records(self) -> list[dict[str, Any]]:
        records = [self.log.get(s.key) for s in self.plan]
        missing = [s.key for s, r in zip(self.plan, records) if r is None]
        if missing:  # pragma: no cover - run_trials returns every trial
            raise RunStoreError(f"{len(missing)} trials missing after the run, e.g. {missing[0]}")
        return records

    def header_lines(self) -> list[str]:
        return []

    def resume_line(self) -> None:
        return None

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        mcfg = metrics_config(cfg.task.repetitions, cfg.job.n_boot, cfg.task.bootstrap_seed)
        self.rows = rows = summarize(trials_from_records(records), mcfg)
        return {"schema_version": "memtoc-codeexec-summary-v1", "n_trials": len(records),
                "n_problems": len(self.problems), "conditions": list(cfg.task.conditions), "policy": cfg.task.policy,
                "repetitions": cfg.task.repetitions, "metrics_config": asdict(mcfg),
                "mean_tool_calls": {c: sum(r["tool_calls"] for r in records if r["condition"] == c) /
                                    max(1, sum(1 for r in records if r["condition"] == c))
                                    for c in cfg.task.conditions},
                "rows": [r.to_dict() for r in rows]}

    def result(self, records: list[dict[str, Any]], summary: dict[str, Any], n_new: int) -> RunResult:
        return RunResult(root=self.root, records=records, summary=summary, table_text=format_table(self.rows),
                         n_new=n_new, new={"trials": n_new}, table=self.rows, family="codeexec")


def metrics_config(repetitions: int, n_boot: int, seed: int) -> MetricsConfig:
    """The metrics settings of a run: the paper's support is correct in at least 2 of the 3 no-tool runs (fewer
    runs: every one of them)."""
    from memtoc.tasks.codeexec.protocol import main_settings

    return MetricsConfig(repetitions=repetitions, min_known_correct=min(main_settings()["min_known_correct"],
                                                                        repetitions), n_boot=n_boot, seed=seed)


class CodeexecTaskFamily:
    """The corrupted code-executor family (``memtoc codeexec ...``, ``memtoc codeexec sweep``)."""

    name = "codeexec"

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> CodeexecEvaluation:
        return CodeexecEvaluation(cfg, edit, **options)

    def read_run(self, root: Path) -> RunResult:
        """A code-executor run directory read back: its trials, ``summary.json`` and the condition rows
        recomputed from the trials with the metrics settings the summary records (else the run's)."""
        root = Path(root)
        records = read_records(root, "codeexec")
        summary = read_summary(root)
        if summary.get("metrics_config"):
            mcfg = MetricsConfig(**summary["metrics_config"])
        else:
            info = read_run_info(root)
            mcfg = metrics_config(int(info.get("repetitions", 1)), int(info.get("n_boot", 1000)),
                                  int(info.get("bootstrap_seed", 0)))
        rows = summarize(trials_from_records(records), mcfg) if records else []
        return RunResult(root=root, records=records, summary=summary, table_text=format_table(rows),
                         new={"trials": 0}, table=rows, family="codeexec")


register_task(CodeexecTaskFamily())
