"""``inspect eval memtoc/memtoc``: the MemToC benchmark as an Inspect task (the package's Inspect entry point).

One sample per episode (question x condition x formulation, the episodes ``memtoc evaluate`` plans), solved by
:func:`memtoc.inspect_eval.solver.memtoc_passes` and labelled by :func:`memtoc.inspect_eval.scorer.memtoc_scorer`.
Every ``-T`` option is ``memtoc evaluate``'s flag of the same name (None: its default, or the protocol's). See
docs/inspect.md.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig
from inspect_ai.util import registry_info

from memtoc.inspect_eval.plan import plan_run, task_options
from memtoc.inspect_eval.scorer import memtoc_scorer
from memtoc.inspect_eval.solver import memtoc_passes

__all__ = ["memtoc"]


def _memtoc(benchmark: str | None = None, formulations: str | None = None, conditions: str | None = None,
            limit: int | None = None, question_set: str | None = None, closed_book: str | None = None,
            frame: str | None = None, prompt_intervention: str | None = None, max_new_tokens: int | None = None,
            stop_at_final_line: bool | None = None, protocol: str | None = None, formulation: str | None = None,
            cache: bool = False) -> Task:
    """MemToC: for each episode, the closed-book answer, then the answer after the tool's return, labelled by
    the toolkit's scorer (cell, outcome) and summarised as Ret., Tool, Wrong, Err. and the cell counts.

    Options are ``memtoc evaluate``'s (``formulation`` = ``formulations``); ``cache``: Inspect's model cache.
    """
    options = task_options({
        "benchmark": benchmark, "formulations": formulations, "formulation": formulation, "conditions": conditions,
        "limit": limit, "question_set": question_set, "closed_book": closed_book, "frame": frame,
        "prompt_intervention": prompt_intervention, "max_new_tokens": max_new_tokens,
        "stop_at_final_line": stop_at_final_line, "protocol": protocol})
    plan = plan_run(options)
    samples = [Sample(id=ep.episode_id, input=ep.prompt, target=[ep.question.gold_answer, *ep.question.aliases],
                      metadata={"episode_id": ep.episode_id, "question_id": ep.question.id,
                                "formulation": ep.formulation, "condition": ep.condition, "arm": ep.arm})
               for ep in plan.episodes]
    return Task(dataset=MemoryDataset(samples, name=f"memtoc-{plan.bench.name}"),
                solver=memtoc_passes(options=options, cache=cache), scorer=memtoc_scorer(options=options),
                config=GenerateConfig(temperature=0, max_tokens=plan.cfg.generation.max_new_tokens),
                metadata={"memtoc_options": dict(options), "benchmark_files": plan.bench.files})


memtoc = task(name="memtoc")(_memtoc)
if "/" not in registry_info(memtoc).name:
    # Inspect names a task "package/name" only when it finds the package installed under that name; an editable
    # install of the memtoc-toolkit distribution is not, and `inspect eval memtoc/memtoc` must still find it.
    memtoc = task(name="memtoc/memtoc")(_memtoc)
