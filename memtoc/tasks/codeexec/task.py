"""The code-executor task: problems x conditions trials, the agent loop as solver, the grader, its metrics.

Its evaluation, extraction and sweep are the code executor's implementations of the task hooks
(:mod:`memtoc.core.tasks`), run by the same jobs as MemToC's: :func:`memtoc.jobs.evaluate.evaluate` (over
:func:`memtoc.tasks.evaluation.evaluate_task`), :func:`memtoc.jobs.extract.extract` and :func:`memtoc.jobs.sweep.sweep`.
The pieces they wrap stay where they were: the agent loop (:mod:`memtoc.tasks.codeexec.agent`), the plan and table
(:mod:`memtoc.tasks.codeexec.run`), the first-return prompts (:mod:`memtoc.tasks.codeexec.capture`) and the sweep
statistics (:mod:`memtoc.tasks.codeexec.sweep`). Run directories and stores keep their formats (see those modules).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import memtoc
from memtoc.tasks.codeexec.agent import TrialSpec, formatter_for, run_trials
from memtoc.tasks.codeexec.capture import CodeexecExtractConfig, capture_block, run_once_per_code, first_return_prompts
from memtoc.tasks.codeexec.metrics import MetricsConfig, summarize
from memtoc.tasks.codeexec.problems import generate_problems, problems_sha256
from memtoc.tasks.codeexec.run import (RUN_SCHEMA, CodeexecRunConfig, format_table, plan_trials, select_problems,
                                       trials_from_records)
from memtoc.tasks.codeexec.sandbox import ExecutionResult, run_python
from memtoc.tasks.codeexec.sweep import (CodeexecSweepConfig, csv_rows, format_markdown, strength_row,
                                         strength_run_config)
from memtoc.core.backend_kinds import EDITS, backend_kind
from memtoc.core.config import ConfigError
from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import sha256_json
from memtoc.core.provenance import git_revision
from memtoc.runs.result import RunResult, read_records, read_summary
from memtoc.runs.runstore import JsonlLog, open_run_dir, read_run_info
from memtoc.core.tasks import register_task

__all__ = ["CodeexecTaskFamily", "CodeexecEvaluation", "CodeexecExtraction", "CodeexecSweep"]


class CodeexecEvaluation:
    """One code-executor evaluation: problems x conditions x repetitions, each trial one agent-loop run."""

    run_kind = "codeexec"
    done_text = "trials already run"

    def __init__(self, cfg: CodeexecRunConfig, edit: Any = None, *, formatter: Any = None,
                 executor: Callable[..., ExecutionResult] | None = None) -> None:
        if edit is not None and not backend_kind(cfg.backend).offers(EDITS):
            raise ConfigError(f"edits need a backend that applies them in generation; the {cfg.backend} backend "
                              "does not (use --backend hf)")
        self.cfg, self.edit, self.formatter, self.executor = cfg, edit, formatter, executor
        self.all_problems = generate_problems(cfg.seed)

    def settings(self) -> dict[str, Any]:
        cfg = self.cfg
        known = {"problems_sha256": problems_sha256(self.all_problems), "problem_seed": cfg.seed,
                 "policy": cfg.policy, "agent": cfg.agent.to_dict()}
        if self.edit is not None:
            known["edit_sha256"] = sha256_json(self.edit.spec)
        return known

    def open(self, backend: Any, settings: Mapping[str, Any]) -> Path:
        cfg, edit = self.cfg, self.edit
        self.fmt = fmt = self.formatter or formatter_for(backend, cfg.agent.call_format)
        self.problems = select_problems(cfg.seed, cfg.split, cfg.limit)
        provenance = backend.provenance()
        identity = {"model": provenance.get("model", cfg.model), "weights": provenance.get("weights"),
                    "chat_template_sha256": provenance.get("chat_template_sha256"),
                    "problems_sha256": settings["problems_sha256"], "problem_seed": cfg.seed, "policy": cfg.policy,
                    "agent": cfg.agent.to_dict(), "protocol": fmt.protocol}
        if edit is not None:
            identity["edit_sha256"] = settings["edit_sha256"]
        info = {"schema_version": RUN_SCHEMA, "model_spec": cfg.model, "provenance": provenance,
                "problems_sha256": identity["problems_sha256"],
                "conditions": list(cfg.conditions), "policy": cfg.policy, "seed": cfg.seed,
                "bootstrap_seed": cfg.bootstrap_seed, "n_boot": cfg.n_boot, "split": cfg.split, "limit": cfg.limit,
                "repetitions": cfg.repetitions, "n_problems": len(self.problems), "agent": cfg.agent.to_dict(),
                "protocol": fmt.protocol, "package_version": memtoc.__version__, "backend": cfg.backend,
                "edit": None if edit is None else edit.spec,
                "run_protocol": {"name": getattr(cfg, "protocol", "none"),
                                 "filled": list(getattr(cfg, "protocol_filled", []))},
                "decoding": (f"sampled (temperature {cfg.agent.temperature}, seed {cfg.agent.sample_seed}; each "
                             "turn seeded by trial key and turn index)" if cfg.agent.temperature > 0 else
                             "greedy (repetitions of a trial are identical on the hf backend)")}
        self.root = open_run_dir(cfg.out, identity=identity, run_info=info, keep_existing=False, kind="codeexec")
        self.log = JsonlLog(self.root / "trials.jsonl", "key")
        self.plan = plan_trials(self.problems, cfg.conditions, cfg.policy, cfg.repetitions)
        return self.root

    def solve(self, backend: Any, edit: Any) -> int:
        """The agent loop over the unfinished trials; records appended (and fsynced) as batches finish."""
        log, cfg = self.log, self.cfg
        todo = [s for s in self.plan if s.key not in log]
        n_new = 0

        def on_done(batch: list) -> None:
            nonlocal n_new
            n_new += log.append([r.to_record() for r in batch])
            if cfg.progress:
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

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        mcfg = metrics_config(cfg.repetitions, cfg.n_boot, cfg.bootstrap_seed)
        self.rows = rows = summarize(trials_from_records(records), mcfg)
        return {"schema_version": "memtoc-codeexec-summary-v1", "n_trials": len(records),
                "n_problems": len(self.problems), "conditions": list(cfg.conditions), "policy": cfg.policy,
                "repetitions": cfg.repetitions, "metrics_config": asdict(mcfg),
                "mean_tool_calls": {c: sum(r["tool_calls"] for r in records if r["condition"] == c) /
                                    max(1, sum(1 for r in records if r["condition"] == c)) for c in cfg.conditions},
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


class CodeexecExtraction:
    """The residual stream after the scripted first tool return, one prompt per problem x condition."""

    desc = "codeexec extract"
    done_text = "prompts already stored"
    writer_options: dict[str, Any] = {}

    def __init__(self, cfg: CodeexecExtractConfig, selector: Any, *,
                 executor: Callable[..., ExecutionResult] = run_python) -> None:
        from activations import ActivationStoreError

        if selector.needs_generation or "all" in selector.kinds:
            raise ActivationStoreError("codeexec extract captures prompt positions: last_input, tool_span, "
                                       "from_tool_return")
        self.cfg, self.selector = cfg, selector
        self.batch_size = cfg.agent.batch_size
        problems = select_problems(cfg.seed, cfg.split, cfg.limit)
        self.specs = [TrialSpec(problem=p, condition=c, policy=cfg.policy) for p in problems for c in cfg.conditions]
        self.run = run_once_per_code(executor)     # each distinct scripted call runs once
        self.source: dict[str, Any] | None = None
        if cfg.run is not None:
            self._load_trajectories(problems)

    def _load_trajectories(self, problems: Sequence[Any]) -> None:
        """``--run``: the run's trials with a first tool return, in the selected problems and conditions."""
        from memtoc.tasks.codeexec.trajectories import read_trials, run_identity, trial_outcome

        cfg = self.cfg
        info = run_identity(cfg.run)
        if int(info.get("seed", -1)) != cfg.seed:
            raise ConfigError(f"--run {cfg.run} was made with problem seed {info.get('seed')}, not --seed {cfg.seed}")
        if info.get("problems_sha256") != problems_sha256(generate_problems(cfg.seed)):
            raise ConfigError(f"--run {cfg.run} was made on another problem set (problems_sha256 differs)")
        by_id = {p.id: p for p in problems}
        records = [r for r in read_trials(cfg.run)
                   if r.get("problem_id") in by_id and r.get("condition") in cfg.conditions
                   and r.get("policy") == cfg.policy]
        self.records = [r for r in records if trial_outcome(r, by_id[r["problem_id"]]) is not None]
        self.by_id = by_id
        self.source = info
        self.n_without_return = len(records) - len(self.records)

    def settings(self, existing: Mapping[str, Any] | None) -> dict[str, Any]:
        cfg = self.cfg
        out = {"family": "codeexec", "problems_sha256": problems_sha256(generate_problems(cfg.seed)),
               "problem_seed": cfg.seed, "policy": cfg.policy, "agent": cfg.agent.to_dict(),
               "positions": list(self.selector.kinds)}
        if self.source is not None:     # the run's own agent settings; its identity names the trajectories
            out.update(agent=self.source.get("agent"), source_run=self.source.get("identity_sha256"),
                       capture="trajectories")
        return out

    def bind(self, backend: Any, provenance: Mapping[str, Any]) -> None:
        if self.source is None:
            self.fmt = formatter_for(backend, self.cfg.agent.call_format)
            return
        from activations import ActivationStoreError

        want = ((self.source.get("provenance") or {}).get("weights") or {}).get("sha256")
        have = (provenance.get("weights") or {}).get("sha256")
        if want and have and want != have:
            raise ActivationStoreError(f"--run {self.cfg.run} was generated by other weights (sha256 {want[:12]}...) "
                                       f"than the model loaded now ({have[:12]}...); activations must come from the "
                                       "model that produced the trajectories")
        self.fmt = formatter_for(backend, str(self.source.get("protocol") or "auto"))

    def identity(self, prov: Mapping[str, Any], settings: Mapping[str, Any], sites: Sequence[int],
                 storage: str) -> dict[str, Any]:
        weights_sha = (prov.get("weights") or {}).get("sha256")
        return {"family": "codeexec", "model": weights_sha or prov.get("model"),
                "chat_template_sha256": prov.get("chat_template_sha256"), "model_dtype": prov.get("dtype"),
                "problems_sha256": settings["problems_sha256"], "problem_seed": self.cfg.seed,
                "policy": self.cfg.policy, "protocol": self.fmt.protocol, "agent": settings["agent"],
                "sites": list(sites), "positions": list(self.selector.kinds), "storage_dtype": storage,
                **{k: settings[k] for k in ("source_run", "capture") if k in settings}}

    def store_provenance(self, prov: Mapping[str, Any], parts: Any) -> dict[str, Any]:
        return {
            "model_id": str(prov.get("model")), "weights_sha256": str((prov.get("weights") or {}).get("sha256")),
            "weights": prov.get("weights"), "architecture": str(prov.get("architecture")),
            "model_dtype": str(prov.get("dtype")), "device": str(prov.get("device")),
            "n_layers": int(prov.get("n_layers") or parts.n_layers),
            "chat_template_sha256": str(prov.get("chat_template_sha256")), "benchmark": "codeexec",
            "package_version": memtoc.__version__, "git": git_revision(), "versions": prov.get("versions"),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": self.cfg.flat(), "positions": list(self.selector.kinds),
            "capture_point": ("the final prompt token after the first tool return of the run's own trajectories"
                              if self.source is not None else
                              "the final prompt token after the first (scripted) tool return"),
            "site_convention": "site 0 = embedding output (input of block 0); site s = output of block s-1",
        }

    def items(self) -> list[Any]:
        return self.records if self.source is not None else self.specs

    def key(self, item: Any) -> str:
        if self.source is not None:
            return str(item["key"])
        return f"{item.problem.id}|{item.condition}|{item.policy}"

    def capture(self, backend: Any, batch: Sequence[Any], sites: Sequence[int], selector: Any) -> Any:
        if self.source is not None:
            from memtoc.tasks.codeexec.trajectories import trajectory_prompt

            prompts = [trajectory_prompt(r, self.by_id[r["problem_id"]], self.fmt) for r in batch]
            return capture_block(backend, [p for p in prompts if p is not None], sites, selector)
        items = first_return_prompts(batch, self.fmt, self.cfg.agent, executor=self.run)
        return capture_block(backend, items, sites, selector)

    def write_labels(self, writer: Any) -> int | None:
        """``--run``: the outcome (accepted / adopted / rejected / no_answer / ambiguous) and the answer's grading
        of every trajectory, joined by trial key."""
        if self.source is None:
            return None
        from memtoc.tasks.codeexec.trajectories import answer_cell, trial_outcome

        labels = {str(r["key"]): {"outcome": trial_outcome(r, self.by_id[r["problem_id"]]), "cell": answer_cell(r)}
                  for r in self.records}
        return writer.write_labels(labels, source={"run": str(self.cfg.run),
                                                   "run_identity_sha256": self.source.get("identity_sha256"),
                                                   "labels": "memtoc.tasks.codeexec.trajectories.trial_outcome"})


class CodeexecSweep:
    """One code-executor evaluation per strength; per-condition rates and paired changes vs strength 0."""

    schema = "memtoc-codeexec-sweep-v1"

    def __init__(self, cfg: CodeexecSweepConfig) -> None:
        self.cfg = cfg

    def direction(self, edit: Any) -> str:
        return self.cfg.direction or edit.toward or "tool"

    def run_config(self, out: Path) -> CodeexecRunConfig:
        return strength_run_config(self.cfg, out)

    def strength_row(self, strength: float, spec_strength: float, records: Sequence[Mapping[str, Any]],
                     base: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        return strength_row(strength, spec_strength, records, base, cfg.conditions, n_boot=cfg.n_boot,
                            n_perm=cfg.n_perm, seed=cfg.seed)

    def title(self, edit: Any, direction: str) -> str:
        return (f"{edit.name}: {edit.kind} toward {direction} ({edit.positions}, sites {list(edit.layers)}), "
                f"code executor, {self.cfg.split} split")

    def markdown(self, rows: Sequence[Mapping[str, Any]], title: str) -> str:
        return format_markdown(rows, self.cfg.conditions, title=title)

    def document(self) -> dict[str, Any]:
        return {"config": {**self.cfg.flat(), "family": "codeexec"}}

    def csv_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return csv_rows(rows)

    def plot(self, rows: Sequence[Mapping[str, Any]], title: str) -> bytes:
        from memtoc.core.plots import codeexec_sweep_curves

        return codeexec_sweep_curves(rows, self.cfg.conditions, title=title)


class CodeexecTaskFamily:
    """The corrupted code-executor family (``memtoc codeexec ...``, ``memtoc codeexec sweep``)."""

    name = "codeexec"

    def evaluation(self, cfg: Any, *, edit: Any = None, **options: Any) -> CodeexecEvaluation:
        return CodeexecEvaluation(cfg, edit, **options)

    def extraction(self, cfg: Any, selector: Any, **options: Any) -> CodeexecExtraction:
        return CodeexecExtraction(cfg, selector, **options)

    def sweep(self, cfg: Any) -> CodeexecSweep:
        return CodeexecSweep(cfg)

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
