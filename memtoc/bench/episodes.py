"""Episodes: one question x one condition x one formulation, with the exact prompt strings a model sees.

One builder serves every source (demo set, mapping + overlay, release files), so a prompt is always
rendered by the same code; tests check that it reproduces the release's stored prompts byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from memtoc.bench.conditions import condition_names, condition_set, get_condition
from memtoc.core.errors import BenchmarkDataError
from memtoc.bench.prompts import PromptSet, load_prompt_set
from memtoc.bench.questions import Question
from memtoc.core.vocab import ALL_CONDITIONS, FORMULATIONS

if TYPE_CHECKING:  # pragma: no cover
    from memtoc.bench.benchmark import Benchmark

#: the condition sets ``--conditions`` accepts by name: "all" (the release's five plus far) and the control arms
CONDITION_GROUPS: tuple[str, ...] = ("all", "controls")


@dataclass(frozen=True)
class Episode:
    """A fully rendered benchmark item. ``arm`` is the selectable condition name (``tool_wrong_far`` for far)."""

    episode_id: str
    question: Question
    formulation: str
    prompt_variant: int
    arm: str
    condition: str
    divergence_bucket: str | None
    tool_output: Mapping[str, Any] | None
    tool_correct: bool | None
    frame: str
    intervention: str
    closed_book_prompt: str             # the closed-book prompt of this run's mode (forced or permissive)
    with_tool_prompt: str | None
    tool_output_span: tuple[int, int] | None   # character span of the tool output in with_tool_prompt

    @property
    def tool_value(self) -> str | None:
        """The value a tool returned (None for tool_error and no_tool)."""
        if self.tool_output is None or "result" not in self.tool_output:
            return None
        return str(self.tool_output["result"])

    @property
    def prompt(self) -> str:
        """What the model answers in the tool-conditioned pass (no_tool: the closed-book prompt)."""
        return self.with_tool_prompt if self.with_tool_prompt is not None else self.closed_book_prompt

    def to_dict(self) -> dict[str, Any]:
        q = self.question
        return {
            "episode_id": self.episode_id, "question_id": q.id, "instance_id": q.instance_id, "hop_idx": q.hop_idx,
            "qkey": q.qkey, "formulation": self.formulation, "prompt_variant": self.prompt_variant,
            "condition": self.condition, "arm": self.arm, "divergence_bucket": self.divergence_bucket,
            "question": q.question, "gold_answer": q.gold_answer, "aliases": list(q.aliases),
            "gold_kind": q.gold_kind, "family": q.family, "tool_output": self.tool_output,
            "tool_value": self.tool_value, "tool_correct": self.tool_correct, "frame": self.frame,
            "intervention": self.intervention,
            "prompts": {"closed_book": self.closed_book_prompt, "with_tool": self.with_tool_prompt},
            "tool_output_span": list(self.tool_output_span) if self.tool_output_span else None,
        }


def parse_conditions(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``None``/"all" -> every condition including the far arm; "controls" -> the control arms; else a comma
    list (which may name "all" and "controls"), validated."""
    if spec is None:
        spec = "all"
    if spec in CONDITION_GROUPS:
        return condition_set(spec)
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if not items:
        raise BenchmarkDataError("empty condition list", field="conditions")
    items = [x for c in items for x in (condition_set(c) if c in CONDITION_GROUPS else (c,))]
    known = condition_names()
    for c in items:
        if c not in known:
            raise BenchmarkDataError(f"unknown condition {c!r}; choose from {', '.join(known)}, "
                                     "all or controls", field="conditions")
    return tuple(dict.fromkeys(items))


def parse_formulations(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    if spec is None or spec == "all":
        return FORMULATIONS
    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    for f in items:
        if f not in FORMULATIONS:
            raise BenchmarkDataError(f"unknown formulation {f!r}; choose from {', '.join(FORMULATIONS)}",
                                     field="formulations")
    if not items:
        raise BenchmarkDataError("empty formulation list", field="formulations")
    return tuple(dict.fromkeys(items))


def episode_id(q: Question, arm: str, prompt_variant: int) -> str:
    """The release's id form ``{instance}-{hop}-{condition}-v{variant}``; the far arm uses ``tool_wrong_far``."""
    return f"{q.instance_id}-{q.hop_idx}-{arm}-v{prompt_variant}"


def build_episode(q: Question, arm: str, formulation: str, *, frame: str = "tool-no-schema",
                  intervention: str = "none", closed_book: str = "forced",
                  prompts: PromptSet | None = None) -> Episode | None:
    """Render one episode; returns None when the condition has no tool return for this question (the far arm of a
    question without a far distractor). ``arm`` is a registered condition (memtoc.bench.conditions)."""
    prompts = prompts or load_prompt_set()
    variant = prompts.prompt_variant(formulation)
    cond = get_condition(arm)
    output = cond.tool_output(q, prompts)
    if cond.has_tool_return and output is None:
        return None
    closed = prompts.closed_book(formulation, q.question, closed_book)
    with_tool, span = None, None
    if output is not None:
        rendered = prompts.with_tool(formulation, q.question, output, frame=frame, schema=q.tool_schema,
                                     intervention=intervention)
        with_tool, span = rendered.text, rendered.tool_output_span
    return Episode(episode_id=episode_id(q, arm, variant), question=q, formulation=formulation,
                   prompt_variant=variant, arm=arm, condition=cond.condition, divergence_bucket=cond.bucket,
                   tool_output=output, tool_correct=cond.tool_correct, frame=frame,
                   intervention=intervention, closed_book_prompt=closed, with_tool_prompt=with_tool,
                   tool_output_span=span)


def build_episodes(questions: Iterable[Question], *, formulations: Sequence[str] = FORMULATIONS,
                   conditions: Sequence[str] = ALL_CONDITIONS, frame: str = "tool-no-schema",
                   intervention: str = "none", closed_book: str = "forced") -> list[Episode]:
    """All episodes for the questions, ordered formulation -> question -> condition (stable across runs)."""
    prompts = load_prompt_set()
    questions = list(questions)
    out: list[Episode] = []
    for formulation in formulations:
        for q in questions:
            for arm in conditions:
                ep = build_episode(q, arm, formulation, frame=frame, intervention=intervention,
                                   closed_book=closed_book, prompts=prompts)
                if ep is not None:
                    out.append(ep)
    return out


def plan_episodes(cfg: Any, bench: "Benchmark") -> list[Episode]:
    """The episodes a job runs: ``cfg`` is any config with the episode-selection and intervention fields (every
    job config composes them), so evaluate, extract and sweep plan the very same prompts."""
    frame = bench.default_frame if cfg.intervention.frame == "auto" else cfg.intervention.frame
    questions = bench.select(cfg.selection.question_set, cfg.selection.limit)
    return build_episodes(questions, formulations=parse_formulations(cfg.selection.formulations),
                          conditions=parse_conditions(cfg.selection.conditions), frame=frame,
                          intervention=cfg.intervention.prompt_intervention, closed_book=cfg.intervention.closed_book)
