"""The episodes an Inspect run of MemToC plans, from the task's ``-T`` options; and its records read back.

No Inspect import here: the options are checked by the one config builder every adapter uses
(:func:`memtoc.core.values.build_config` over :class:`EvaluationConfig`), so ``-T limit=0`` or an unknown condition
gets the same one-line error as ``memtoc evaluate --limit 0``, and the episodes are
:func:`memtoc.bench.episodes.plan_episodes`'s, so an Inspect sample's prompt is byte for byte the prompt
``memtoc evaluate`` sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping

from memtoc.bench.benchmark import Benchmark, load_benchmark
from memtoc.bench.episodes import Episode, plan_episodes
from memtoc.core.values import ConfigError, build_config, option_fields
from memtoc.tasks.memtoc.evaluation import EvaluationConfig, resolve_protocol

__all__ = ["TASK_OPTIONS", "RunPlan", "plan_run", "records_of", "task_options"]

#: The ``-T`` options of the Inspect task: the evaluation's episode selection, prompting and generation budget
#: (the model, the backend, batching and the output folder are Inspect's own settings).
TASK_OPTIONS: tuple[str, ...] = ("benchmark", "formulations", "conditions", "question_set", "limit", "closed_book",
                                 "frame", "prompt_intervention", "max_new_tokens", "stop_at_final_line", "protocol")


@dataclass(frozen=True)
class RunPlan:
    """A resolved Inspect run: its config (protocol filled in), the benchmark and the episodes by id."""

    cfg: EvaluationConfig
    bench: Benchmark
    episodes: tuple[Episode, ...]

    def episode(self, episode_id: str) -> Episode:
        for ep in self.episodes:
            if ep.episode_id == episode_id:
                return ep
        raise KeyError(f"no episode {episode_id!r} in this MemToC plan")


def task_options(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The given options (None = not given) as a sorted, hashable tuple: what the solver and scorer are built
    from, and the key their shared plan is cached under. ``formulation`` is accepted for ``formulations``."""
    given = {k: v for k, v in values.items() if v is not None}
    if "formulation" in given:
        if "formulations" in given:
            raise ConfigError("-T formulation and -T formulations name the same option; give one")
        given["formulations"] = given.pop("formulation")
    unknown = sorted(set(given) - set(TASK_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown task option(s) {', '.join(unknown)}; the memtoc task takes "
                          f"{', '.join(TASK_OPTIONS)}")
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in given.items()))


@lru_cache(maxsize=8)
def plan_run(options: tuple[tuple[str, Any], ...]) -> RunPlan:
    """The run of ``options`` (from :func:`task_options`), checked and planned once per process."""
    values = {k: ",".join(v) if isinstance(v, tuple) else v for k, v in options}
    excluded = [f for f in option_fields(EvaluationConfig) if f not in TASK_OPTIONS]
    cfg = build_config(EvaluationConfig, values, where="memtoc task: ", exclude=excluded)
    cfg = resolve_protocol(cfg)
    cfg.check()
    bench = load_benchmark(cfg.selection.benchmark)
    return RunPlan(cfg=cfg, bench=bench, episodes=tuple(plan_episodes(cfg, bench)))


def records_of(samples: Iterable[Any]) -> list[dict[str, Any]]:
    """The scored records of an EvalLog's samples (``log.samples``), in the layout of a run's
    ``episodes.jsonl``: what ``memtoc metrics --input`` and ``memtoc compare`` read. A sample that was not
    scored (an error) is left out."""
    return [dict(s.metadata) for s in samples if s.metadata and "outcome" in s.metadata]
