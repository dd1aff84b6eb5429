"""The evaluate job of every task (``memtoc evaluate``, ``mt.evaluate``, a recipe's step).

:func:`evaluate` is the job body of any family (the shared open / solve / finish is
:func:`memtoc.tasks.evaluation.evaluate_task`); :func:`run_evaluate` is the adapters' entry, which first prepares
the config of its family. The protocol is resolved once, at the start: a field the user set keeps its value, every
other takes the protocol's (:func:`memtoc.tasks.memtoc.evaluation.resolve_protocol`), so ``--protocol paper
--formulations reference`` runs the single formulation.
"""

from __future__ import annotations

from typing import Any, Callable

from memtoc.backends.base import Backend
from memtoc.jobs import stderr_line
from memtoc.runs.result import RunResult
from memtoc.tasks.evaluation import evaluate_task
from memtoc.tasks.memtoc.evaluation import EvaluationConfig, resolve_protocol

__all__ = ["EvaluationConfig", "RunResult", "evaluate", "resolve_evaluation", "run_evaluate"]


def evaluate(cfg: Any, *, backend: Backend | None = None, edit: Any = None, log: Callable[[str], None] = stderr_line,
             task: str | None = None, **options: Any) -> Any:
    """Run (or resume) an evaluation into ``cfg.out`` and return its :class:`memtoc.runs.result.RunResult`
    (:func:`evaluate_task`, the run header said once every check has passed).

    MemToC: an edit (``cfg.edit`` or ``edit``) acts on the tool-conditioned pass; the closed-book pass that defines
    each question's memory stays untreated unless the spec says ``"apply_to_closed_book": true``, so an edited
    run's cells equal the untreated run's and a strength-0 edit reproduces it exactly.
    """
    return evaluate_task(cfg, task=task, backend=backend, edit=edit, log=log, header=True, **options)[1]


def resolve_evaluation(cfg: EvaluationConfig) -> EvaluationConfig:
    """``cfg`` as the evaluation runs it: its protocol's settings where the user set nothing (None; idempotent)."""
    return resolve_protocol(cfg)


def run_evaluate(cfg: Any, *, backend: Any = None, edit: Any = None,
                 log: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) the evaluation of ``cfg`` (any family's evaluation config: the family is the config's,
    ``memtoc.core.tasks.task_of``) into ``cfg.out``; ``edit`` an edit object (else ``cfg.edit``). The code
    executor's config is prepared first (:func:`memtoc.jobs.codeexec.prepare_run`)."""
    from memtoc.tasks.codeexec.run import CodeexecRunConfig

    if isinstance(cfg, CodeexecRunConfig):      # its run protocol (the fields not given); the sandbox
        from memtoc.jobs.codeexec import prepare_run

        cfg = prepare_run(cfg)
    return evaluate(cfg, backend=backend, edit=edit, log=log or stderr_line)
