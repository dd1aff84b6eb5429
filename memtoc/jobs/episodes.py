"""The episodes job: the built episodes with their exact prompt strings (``memtoc episodes``, ``mt.load_episodes``).

``protocol = "paper"`` fills the question set and the formulations the user did not give (the given ones are
recorded on the config: :func:`memtoc.core.config.given_fields`), as ``evaluate`` does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from memtoc.core.values import given_fields

__all__ = ["EpisodesConfig", "EpisodesResult", "run_episodes"]


@dataclass
class EpisodesConfig:
    benchmark: str = "demo"
    formulations: str = "reference"
    conditions: str = "all"
    question_set: str = "all"
    limit: int | None = None
    frame: str = "auto"
    prompt_intervention: str = "none"
    closed_book: str = "forced"
    protocol: str = "none"


@dataclass
class EpisodesResult:
    episodes: list[Any]
    frame: str
    question_set: str


def run_episodes(cfg: EpisodesConfig, *, backend: Any = None, edit: Any = None,
                 log: Callable[[str], None] | None = None) -> EpisodesResult:
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes, parse_conditions, parse_formulations
    from memtoc.bench.protocol import fallback_warning, fill_values, frame_fallback

    given = given_fields(cfg)
    base = EpisodesConfig()
    fields = ("question_set", "formulations")
    named = [f for f in fields if (f in given if given is not None else getattr(cfg, f) != getattr(base, f))]
    values = {f: getattr(cfg, f) for f in fields}
    values.update(fill_values(cfg.protocol, named, values))
    bench = load_benchmark(cfg.benchmark)
    frame = bench.default_frame if cfg.frame == "auto" else cfg.frame
    fallback = frame_fallback(cfg.frame, frame, bench.has_schemas, bench.name)
    if fallback:
        (log or (lambda s: print(s, file=sys.stderr)))(fallback_warning(fallback))
    eps = build_episodes(bench.select(values["question_set"], cfg.limit),
                         formulations=parse_formulations(values["formulations"]),
                         conditions=parse_conditions(cfg.conditions), frame=frame,
                         intervention=cfg.prompt_intervention, closed_book=cfg.closed_book)
    return EpisodesResult(list(eps), frame, values["question_set"])
