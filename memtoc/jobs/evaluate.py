"""The evaluate job: what ``memtoc evaluate``, ``mt.evaluate(...)`` and a recipe's ``evaluate`` step all call.

The protocol (``protocol = "paper"``) is resolved here, once, from the fields the adapter recorded as given
(:func:`memtoc.core.values.given_fields`): a field the user set keeps its value, every other protocol field
takes the protocol's. So ``--protocol paper --formulations reference`` and ``mt.evaluate(protocol="paper",
formulations="reference")`` run the same single formulation.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from memtoc.runs.result import RunResult
from memtoc.tasks.memtoc.evaluate import EvaluationConfig, evaluate, resolve_protocol

__all__ = ["EvaluationConfig", "RunResult", "resolve_evaluation", "run_evaluate"]


def _stderr(s: str) -> None:
    print(s, file=sys.stderr)


def resolve_evaluation(cfg: EvaluationConfig) -> EvaluationConfig:
    """``cfg`` with its protocol's settings where the user set nothing (the fields recorded as given when the
    config was built keep their values; idempotent)."""
    return resolve_protocol(cfg)


def run_evaluate(cfg: Any, *, backend: Any = None, edit: Any = None,
                 log: Callable[[str], None] | None = None) -> RunResult:
    """Run (or resume) the evaluation of ``cfg`` into ``cfg.out``; ``edit`` an edit object (else ``cfg.edit``).

    ``cfg``: any family's evaluation config (MemToC's :class:`EvaluationConfig`, whose protocol is resolved
    here; the code executor's ``CodeexecRunConfig``, whose run protocol and sandbox are prepared by
    :func:`memtoc.jobs.codeexec.prepare_run`; the agent task's ``AgentRunConfig``): the family is the
    config's (``memtoc.core.tasks.task_of``), and every family returns a :class:`RunResult`.
    """
    if isinstance(cfg, EvaluationConfig):
        cfg = resolve_evaluation(cfg)
    elif getattr(cfg, "TASK_NAME", None) == "codeexec":   # its run protocol, from the given fields; the sandbox
        from memtoc.jobs.codeexec import prepare_run

        cfg = prepare_run(cfg)
    return evaluate(cfg, backend=backend, edit=edit, log=log or _stderr)
