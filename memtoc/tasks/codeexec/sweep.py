"""``memtoc codeexec sweep``: one code-executor evaluation per edit strength, then the adoption table.

The same sweep as the MemToC study, with the same library (:func:`memtoc.jobs.sweep.sweep_codeexec`: strength 0
always run first as the baseline with the edit's hooks installed, one run directory per strength
``OUT/strength_<s>``, ``OUT/sweep.{json,csv,md,png}``), with the family's own evaluation (the agent loop) and
metrics; this module holds its config, rows and table. The edit is bound
per model turn to the rows' first tool return (``memtoc.tasks.codeexec.agent.run_trials``), so a
``from_tool_return`` edit acts on every token from the first tool return onward, generated tokens included.

Per strength and condition: accuracy, adoption (corrupted conditions), the share of replies with a
``FINAL ANSWER`` line, the mean number of the model's own tool calls, and the paired change of accuracy and
adoption against strength 0 (per-problem means, problem-cluster bootstrap interval, sign-flip p;
:func:`memtoc.scoring.stats.paired_difference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from memtoc.tasks.codeexec.agent import AgentConfig
from memtoc.tasks.codeexec.conditions import CORRUPTED_CONDITIONS
from memtoc.tasks.codeexec.run import CodeexecRunConfig, check_task
from memtoc.core.config import (MODEL_AS_GIVEN, SWEEP_HERE, CodeexecTask, ConfigError, ExecutorSettings, Intervention,
                                JobSettings, ModelSpec, SweepSettings)
from memtoc.core.options import here
from memtoc.tasks.sweep_format import fmt_delta, fmt_pct

__all__ = ["CodeexecSweepConfig", "strength_row", "format_markdown", "csv_rows"]


@dataclass
class CodeexecSweepConfig:
    """``memtoc codeexec sweep``: the run's pieces plus the sweep's; the edit spec in ``edit``.

    ``sweep.direction`` None = the edit's own side (``Edit.toward``) (strength = the spec's strength);
    ``job.seed`` seeds both the problems and the bootstrap intervals.
    """
    #: the flat record (memtoc.core.config.flat_record) keeps the agent settings whole and leaves out where the
    #: strengths run (a sweep resumes under any executor)
    RECORD_NESTED: ClassVar[tuple[str, ...]] = ("agent",)
    RECORD_OMIT: ClassVar[tuple[str, ...]] = ("execution",)
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"edit": "input", "dev_labels": "input-run", "out": "output-dir"}
    #: the options of its pieces this job does not take (every door refuses them; memtoc.core.options)
    NOT_TAKEN: ClassVar[tuple[str, ...]] = (*MODEL_AS_GIVEN, "bootstrap_seed", "timeout_s", "cpu_s", "memory_mb",
                                             "max_total_new_tokens", "closed_book", "prompt_intervention", "frame")
    #: what the pieces' options are to this job (memtoc.core.options.here)
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        **SWEEP_HERE, "max_new_tokens": here("generation budget per model turn"),
        "first_call": here("scripted (default here): every tool-condition trial starts with the problem's scripted, "
                           "really executed tool call, so every trial has a first tool return to steer from")}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    task: CodeexecTask = field(default_factory=lambda: CodeexecTask(conditions=("P0", "P1+")))
    job: JobSettings = field(default_factory=lambda: JobSettings(out="runs/codeexec-sweep"))
    agent: AgentConfig = field(default_factory=lambda: AgentConfig(first_call="scripted"))
    sweep: SweepSettings = field(default_factory=lambda: SweepSettings(strengths="-8,-4,0,4,8", direction=None))
    #: ``edit`` is the spec path; the MemToC prompt settings of the piece do not apply to this family.
    intervention: Intervention = field(default_factory=Intervention)
    #: where the strengths run (not recorded: a sweep resumes under any executor)
    execution: ExecutorSettings = field(default_factory=ExecutorSettings)
    TASK_NAME: ClassVar[str] = "codeexec"     #: the task the jobs run for this config (memtoc.core.tasks)

    def __post_init__(self) -> None:
        self.task = check_task(self.task)
        if replace(self.intervention, edit=None) != Intervention():
            raise ConfigError("the code-executor sweep takes an edit only (no closed-book mode, frame or prompt "
                              "intervention; its prompts are set by --policy)")


def strength_run_config(cfg: CodeexecSweepConfig, out: Path) -> CodeexecRunConfig:
    """The evaluation config of one strength of the sweep, written into ``out``."""
    return CodeexecRunConfig(model_spec=cfg.model_spec,
                             task=replace(cfg.task, bootstrap_seed=cfg.job.seed),
                             job=replace(cfg.job, out=str(out)), agent=cfg.agent)


def _per_problem(records: Sequence[Mapping[str, Any]], condition: str, key: Callable[[Mapping[str, Any]], float]
                 ) -> dict[str, float]:
    acc: dict[str, list[float]] = {}
    for r in records:
        if r["condition"] == condition:
            acc.setdefault(str(r["problem_id"]), []).append(float(key(r)))
    return {p: float(np.mean(v)) for p, v in acc.items()}


def _rate(values: Mapping[str, float], *, n_boot: int, seed: int) -> dict[str, Any]:
    from memtoc.scoring.stats import bootstrap_ci

    ids = sorted(values)
    if not ids:
        return {"value": None, "n": 0, "ci_low": None, "ci_high": None}
    vals = [values[i] for i in ids]
    ci = bootstrap_ci(vals, ids, n_boot=n_boot, seed=seed)
    return {"value": float(np.mean(vals)), "n": len(ids), "ci_low": None if ci.is_nan else ci.low,
            "ci_high": None if ci.is_nan else ci.high}


def _paired(base: Mapping[str, float], treated: Mapping[str, float], *, n_boot: int, n_perm: int,
            seed: int) -> dict[str, Any]:
    from memtoc.scoring.stats import paired_difference

    ids = sorted(set(base) & set(treated))
    if not ids:
        return {"delta": None, "ci_low": None, "ci_high": None, "p": None, "n_common": 0}
    r = paired_difference([base[i] for i in ids], [treated[i] for i in ids], ids, n_boot=n_boot, n_perm=n_perm,
                          seed=seed)
    return {"delta": r.delta, "ci_low": r.ci_low, "ci_high": r.ci_high, "p": r.p_value, "n_common": len(ids)}


_METRICS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "accuracy": lambda r: bool(r["correct"]),
    "adoption": lambda r: bool(r["adopted"]),
    "final_answer_rate": lambda r: (r.get("graded") or {}).get("source") == "final_answer",
    "tool_calls": lambda r: int(r["tool_calls"]),
}


def strength_row(strength: float, spec_strength: float, records: Sequence[Mapping[str, Any]],
                 base_records: Sequence[Mapping[str, Any]], conditions: Sequence[str], *, n_boot: int = 1000,
                 n_perm: int = 10000, seed: int = 0) -> dict[str, Any]:
    """All per-condition figures of one strength (see the module docstring)."""
    per_condition = {}
    for c in conditions:
        entry: dict[str, Any] = {}
        for name, key in _METRICS.items():
            if name == "adoption" and c not in CORRUPTED_CONDITIONS:
                continue
            now = _per_problem(records, c, key)
            if name == "tool_calls":
                entry[name] = float(np.mean(list(now.values()))) if now else None
                continue
            entry[name] = _rate(now, n_boot=n_boot, seed=seed)
            if name in ("accuracy", "adoption"):
                entry[f"d_{name}"] = _paired(_per_problem(base_records, c, key), now, n_boot=n_boot, n_perm=n_perm,
                                             seed=seed)
        per_condition[c] = entry
    return {"strength": strength, "spec_strength": spec_strength, "n_trials": len(records),
            "conditions": per_condition}


def format_markdown(rows: Sequence[Mapping[str, Any]], conditions: Sequence[str], *, title: str = "") -> str:
    head = ["strength", "spec_strength"]
    for c in conditions:
        head += [f"{c} accuracy", f"{c} d_accuracy"]
        if c in CORRUPTED_CONDITIONS:
            head += [f"{c} adoption", f"{c} d_adoption"]
        head += [f"{c} final_answer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [f"{r['strength']:g}", f"{r['spec_strength']:g}"]
        for c in conditions:
            e = r["conditions"][c]
            cells += [f"{fmt_pct(e['accuracy']['value'])} (n={e['accuracy']['n']})", fmt_delta(e.get("d_accuracy"))]
            if c in CORRUPTED_CONDITIONS:
                cells += [f"{fmt_pct(e['adoption']['value'])}", fmt_delta(e.get("d_adoption"))]
            cells += [fmt_pct(e["final_answer_rate"]["value"])]
        lines.append("| " + " | ".join(cells) + " |")
    notes = ("Rates in % over problems (mean over repetitions); d_* = paired change vs strength 0 in percentage "
             "points [95% problem-bootstrap CI]; adoption = the answer equals a corrupted number the tool returned; "
             "final_answer = replies with a FINAL ANSWER line.")
    return "\n".join(([f"## {title}", ""] if title else []) + lines + ["", notes]) + "\n"


def csv_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``sweep.csv``: one flat record per strength (``<condition>_<figure>[_<field>]``)."""
    flat = []
    for r in rows:
        d: dict[str, Any] = {"strength": r["strength"], "spec_strength": r["spec_strength"], "n_trials": r["n_trials"]}
        for c, e in r["conditions"].items():
            for name, v in e.items():
                if isinstance(v, Mapping):
                    for k, x in v.items():
                        d[f"{c}_{name}_{k}"] = x
                else:
                    d[f"{c}_{name}"] = v
        flat.append(d)
    return flat
