"""Clean/corrupt pairs of a run's questions, the answer token, and an edit that patches one trace into another.

What a notebook needs for an activation-patching experiment with ``mt.trace``, defined as ``memtoc patch``
defines it (``memtoc.jobs.patch.build_pairs``): the two conditions of one question and formulation (default
``tool_right`` clean, ``tool_wrong`` corrupt) as the token ids the evaluator runs, with the answer prefix
``FINAL:`` teacher-forced, so the next token is the answer's first; the metric is
``log p(memory answer) - log p(tool value)`` at that position (the memory answer is the run's closed-book span,
the tool value the corrupt prompt's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from memtoc.api.tracing import Trace, TraceError
from memtoc.backends.parts import site_hook_name


@dataclass(frozen=True)
class ConditionPair:
    """One question and formulation under two conditions, as ``memtoc patch`` runs it.

    ``clean`` / ``corrupt``: the token ids of each prompt (the evaluator's formatted prompt and tokenization, the
    answer prefix teacher-forced); ``memory_id`` / ``tool_id``: the first token of the memory answer and of the
    tool value after that prefix; ``positions``: role (``question``, ``tool_span``, ``final``) -> (clean, corrupt)
    token positions, aligned one to one.
    """

    question_id: str
    formulation: str
    conditions: tuple[str, str]
    clean: list[int]
    corrupt: list[int]
    memory: str
    tool_value: str
    memory_id: int
    tool_id: int
    positions: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    def metric(self, trace: Trace) -> torch.Tensor:
        """``log p(memory answer) - log p(tool value)`` at each row's last traced position (``[batch]``)."""
        _check_last(trace, "metric")
        logp = trace.logits[:, -1].float().log_softmax(-1)
        return logp[:, self.memory_id] - logp[:, self.tool_id]


def condition_pairs(run: Any, model: Any, pair: str = "tool_right:tool_wrong", *,
                    limit: int | None = None) -> list[ConditionPair]:
    """The ``CLEAN:CORRUPT`` pairs of ``run`` (a ``Run`` or its directory) for ``model`` (a loaded backend or a
    spec): every question and formulation with both conditions, a memory answer and a tool value whose first
    tokens differ (the others are skipped, as ``memtoc patch`` skips them). ``limit``: at most that many
    questions."""
    from memtoc.api.interop import as_backend
    from memtoc.core.vocab import ALL_CONDITIONS
    from memtoc.jobs.patch import build_pairs

    clean, _, corrupt = str(pair).partition(":")
    if clean not in ALL_CONDITIONS or corrupt not in ALL_CONDITIONS or clean == corrupt:
        raise TraceError(f"pair {pair!r}: give two different conditions CLEAN:CORRUPT of {', '.join(ALL_CONDITIONS)}")
    path = getattr(run, "path", run)
    found, _ = build_pairs(as_backend(model), str(path), clean, corrupt, limit)
    return [ConditionPair(question_id=p.meta["question_id"], formulation=p.meta["formulation"],
                          conditions=(clean, corrupt), clean=list(p.clean_ids), corrupt=list(p.corrupt_ids),
                          memory=p.meta["memory"], tool_value=p.meta["tool_value"], memory_id=int(p.answer_ids[0]),
                          tool_id=int(p.answer_ids[1]), positions=dict(p.positions)) for p in found]


def answer_token(model: Any, prompt: Any, answer: str) -> Any:
    """The token the model emits first when it writes ``answer`` after ``FINAL: `` at the end of ``prompt``
    (formatted and tokenized as the evaluator does): a :class:`probes.answer.AnswerToken` (``token_id``,
    ``token_str``, spelling ``variants``, ``subtoken_ids``)."""
    from memtoc.api.interop import as_backend
    from probes.answer import answer_token as first_answer_token

    return first_answer_token(as_backend(model), prompt, answer)


def _check_last(trace: Trace, what: str) -> None:
    """The trace's last selected column must be each row's last token (left padding: the batch's last column)."""
    width = max(len(t) for t in trace.tokens)
    if trace.columns.size == 0 or (trace.columns[:, -1] != width - 1).any():
        raise TraceError(f"{what} reads each row's last position: trace with positions='last' or 'all'")


def patch_edit(source: Trace, site: int, *, positions: str = "last_input") -> Any:
    """An edit that writes ``source``'s residual at ``site`` (its last traced position of each row) over the
    same site at ``positions`` of the run it is applied to: activation patching as an edit object, for
    ``mt.trace(..., edit=)`` (or any job that takes an edit). Sites are numbered as everywhere: 0 the embedding
    output, s the output of block s-1. A one-row source is written into every row; otherwise row i into row i."""
    from memtoc.api.edits import function_edit

    _check_last(source, "patch_edit")
    if isinstance(site, bool) or not isinstance(site, (int, np.integer)):
        raise TraceError(f"patch_edit: site must be a site number, got {site!r}")
    name = site_hook_name(int(site))
    if name not in source:
        raise TraceError(f"patch_edit: site {site} ({name}) was not traced; traced: {', '.join(source.names)}")
    values = source[name][:, -1]         # [batch, d_model]

    def write(s: int, hidden: torch.Tensor, where: Any) -> torch.Tensor:
        rows = where.rows.cpu()                   # one host copy: checked and indexed
        if values.shape[0] == 1:
            rows = torch.zeros_like(rows)
        elif int(rows.max()) >= values.shape[0]:
            raise TraceError(f"patch_edit: the source trace has {values.shape[0]} rows; give one row, or as many "
                             "as the prompts it patches")
        return values[rows].to(hidden)

    return function_edit(write, layers=[int(site)], positions=positions, name=f"patch_site_{int(site)}")
