"""The MemToC solver: the closed-book pass, then the tool-conditioned pass, on whatever model Inspect runs.

For one sample (one episode) it asks the model the closed-book prompt of the episode's question and formulation
(once per model, question and formulation: the episodes of one question share it, as in ``memtoc evaluate``),
then the episode's own prompt (``no_tool``: the closed-book prompt again, as ``memtoc evaluate`` asks it). Both
are greedy (temperature 0) with the evaluation's budget, and each answer is cut right after its completed
``FINAL:`` line (:func:`memtoc.backends.base.cut_at_final_line`), the cut every backend applies, so a server that
decodes to the budget gives the string the hf backend stops at. The two generations go to the sample's store;
the scorer (:mod:`memtoc.inspect_eval.scorer`) labels them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import anyio
from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, GenerateConfig, ModelOutput, get_model
from inspect_ai.solver import Generate, Solver, TaskState, solver

from memtoc.backends.base import Generation, cut_at_final_line
from memtoc.inspect_eval.plan import plan_run
from memtoc.tasks.memtoc.evaluation import closed_book_key

__all__ = ["CLOSED_BOOK", "TOOL_PASS", "memtoc_passes", "generation_of"]

#: where the solver keeps the two generations in a sample's store (``Generation`` fields)
CLOSED_BOOK = "memtoc:closed_book"
TOOL_PASS = "memtoc:tool_pass"


def generation_of(output: ModelOutput, *, stop_at_final_line: bool) -> Generation:
    """A provider's answer as the toolkit's :class:`Generation`: the text cut after its FINAL line (when the
    evaluation stops there), the token counts the provider reports, and the stop reason in the toolkit's words."""
    text = output.completion
    cut = False
    if stop_at_final_line:
        text, cut = cut_at_final_line(text)
    usage = output.usage
    stop = "final_line" if cut else "max_tokens" if output.stop_reason in ("max_tokens", "model_length") else "eos"
    return Generation(text=text, n_prompt_tokens=usage.input_tokens if usage else 0,
                      n_new_tokens=usage.output_tokens if usage else 0, stop_reason=stop)


@solver
def memtoc_passes(options: tuple = (), cache: bool = False) -> Solver:
    """The closed-book pass then the tool-conditioned pass (``options``: the task's, from
    :func:`memtoc.inspect_eval.plan.task_options`; ``cache``: Inspect's per-request model cache)."""
    closed: dict[tuple[str, str], Generation] = {}
    locks: dict[tuple[str, str], anyio.Lock] = {}

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        plan = plan_run(tuple(tuple(kv) for kv in options))
        ep = plan.episode(str(state.sample_id))
        model = get_model()
        if getattr(model.api, "do_sample", None) is True:     # Inspect's hf provider samples unless told not to
            raise ValueError(f"{model}: the hf provider samples by default; MemToC decodes greedily: "
                             "pass -M do_sample=false (get_model(..., do_sample=False))")
        config = GenerateConfig(temperature=0, max_tokens=plan.cfg.generation.max_new_tokens)
        stop = plan.cfg.generation.stop_at_final_line

        async def answer(prompt: str) -> tuple[Generation, ModelOutput]:
            out = await model.generate(prompt, config=config, cache=cache)
            if out.error:
                raise RuntimeError(f"{model}: {out.error}")
            return generation_of(out, stop_at_final_line=stop), out

        key = (f"{model}@{model.api.base_url}", closed_book_key(ep.question.id, ep.formulation))
        lock = locks.setdefault(key, anyio.Lock())
        async with lock:                        # one closed-book answer per model, question and formulation
            if key not in closed:
                closed[key] = (await answer(ep.closed_book_prompt))[0]
        gen, out = await answer(ep.prompt)
        state.store.set(CLOSED_BOOK, _fields(closed[key]))
        state.store.set(TOOL_PASS, _fields(gen))
        state.messages = [ChatMessageUser(content=ep.prompt), ChatMessageAssistant(content=gen.text)]
        out.completion = gen.text
        state.output = out
        return state

    return solve


def _fields(gen: Generation) -> dict[str, Any]:
    d = asdict(gen)
    d.pop("token_ids")
    return d
