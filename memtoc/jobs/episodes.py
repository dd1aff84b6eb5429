"""The episodes job: the built episodes with their exact prompt strings (``memtoc episodes``, ``mt.load_episodes``).

``protocol = "paper"`` fills the question set and the formulations the user did not give: those fields default to
None (not given), and the job gives each its protocol's value, else the episode selection's default.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from memtoc.core.options import here, opt, option
from memtoc.bench.protocol import paper_helps
from memtoc.core.config import EpisodeSelection, Intervention

__all__ = ["EpisodesConfig", "EpisodesResult", "run_episodes"]


@dataclass
class EpisodesConfig:
    """``memtoc episodes``: which episodes, how they are prompted, and the file they are written to (``out``;
    ``mt.load_episodes`` returns them instead)."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output"}
    NOT_TAKEN: ClassVar[tuple[str, ...]] = ("edit",)        # episodes are prompts: nothing is edited
    OPTIONS_HERE: ClassVar[dict[str, Any]] = {
        **paper_helps("question_set", formulations="a formulation, a comma list, or all"),
        "protocol": here("paper: the analysis set and all three formulations unless given (memtoc.bench.protocol)")}

    #: ``formulations``, ``question_set`` None: the protocol's value, else the selection's default
    selection: EpisodeSelection = field(default_factory=lambda: EpisodeSelection(formulations=None, question_set=None))
    intervention: Intervention = field(default_factory=Intervention)
    protocol: str = field(default="none", metadata=option("protocol"))
    out: str | None = field(default=None, metadata=opt("episodes file to write (JSONL)", required=True, path=True))


@dataclass
class EpisodesResult:
    episodes: list[Any]
    frame: str
    question_set: str


def run_episodes(cfg: EpisodesConfig, *, backend: Any = None, edit: Any = None,
                 log: Callable[[str], None] | None = None) -> EpisodesResult:
    """Build the episodes of ``cfg`` (the protocol filling what was not given) and, with ``cfg.out``, write them
    as JSONL (an output that would overwrite the benchmark is refused before anything is read)."""
    from pathlib import Path

    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes, parse_conditions, parse_formulations
    from memtoc.bench.protocol import fallback_warning, fill_values, frame_fallback

    sel, prompting = cfg.selection, cfg.intervention
    if cfg.out:
        from memtoc.core.fileio import check_outputs

        check_outputs({"--out": cfg.out}, [sel.benchmark if Path(sel.benchmark).exists() else None])
    default = EpisodeSelection()
    fields = ("question_set", "formulations")
    named = [f for f in fields if getattr(sel, f) is not None]
    values = {f: getattr(default, f) if getattr(sel, f) is None else getattr(sel, f) for f in fields}
    values.update(fill_values(cfg.protocol, named, values))
    bench = load_benchmark(sel.benchmark)
    frame = bench.default_frame if prompting.frame == "auto" else prompting.frame
    fallback = frame_fallback(prompting.frame, frame, bench.has_schemas, bench.name)
    if fallback:
        (log or (lambda s: print(s, file=sys.stderr)))(fallback_warning(fallback))
    eps = build_episodes(bench.select(values["question_set"], sel.limit),
                         formulations=parse_formulations(values["formulations"]),
                         conditions=parse_conditions(sel.conditions), frame=frame,
                         intervention=prompting.prompt_intervention, closed_book=prompting.closed_book)
    if cfg.out:
        from memtoc.jobs.records import write_records

        write_records(cfg.out, [e.to_dict() for e in eps])
    return EpisodesResult(list(eps), frame, values["question_set"])
