"""The job registry: every job by its command name, with its typed config and its ``run_<job>`` function.

The command line, the Python API and recipes all read this one table. Configs and run functions are named by
import path and loaded on first use, so reading the table imports no job (``memtoc --help`` stays light).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from memtoc.core.errors import MemtocError

__all__ = ["Job", "JOBS", "GROUPS", "register_job", "lookup", "check_config"]


def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Job:
    """One job: ``name`` is its command path (``"lens fit"``), ``config`` and ``run`` are ``module:attr`` paths.

    ``run(config)`` does the whole job and returns its result object; the adapters only present it. What options
    it takes is its config's (:func:`memtoc.core.options.option_leaves`).
    """

    name: str
    config: str
    run: str
    help: str
    description: str | None = None

    def config_class(self) -> type:
        return _load(self.config)

    def runner(self) -> Callable[..., Any]:
        return _load(self.run)

    def build(self, values: Any, **kw: Any) -> Any:
        """The job's config from option values (field or public names), by the one config builder."""
        from memtoc.core.values import build_config

        return build_config(self.config_class(), values, **kw)

    def run_checked(self, cfg: Any) -> Any:
        """The job on ``cfg`` after :func:`check_config`: what every front door (command, recipe step) runs."""
        check_config(cfg)
        return self.runner()(cfg)


def check_config(cfg: Any, *, loaded: bool = False) -> None:
    """Everything checked before a job loads a model or writes: the one input/output contract
    (:func:`memtoc.core.paths.check_paths`: roles, existence and kind of inputs, no output over an input), then the
    checks that need only the model's shape (:func:`memtoc.jobs.preflight.check_before_load`). The command line,
    recipes and the Python API all call it (``loaded``: the API was given a loaded backend)."""
    from memtoc.core.paths import check_paths
    from memtoc.jobs.preflight import check_before_load

    check_paths(cfg)
    check_before_load(cfg, loaded=loaded)


#: command path -> job, in the order ``memtoc --help`` lists them
JOBS: dict[str, Job] = {}

#: help of the command groups (the first word of a two-word command)
GROUPS: dict[str, str] = {
    "lens": "Jacobian lens artifacts (fit the averaged lens of a model)",
    "sae": "sparse autoencoders: train one on stored activations, or measure a dictionary's FVU",
    "finetune": "LoRA SFT / DPO arms: pairs, training, cross-fitted arms, their table",
    "codeexec": "the corrupted code-executor family (the overreliance paper)",
    "agent": "agent tasks: MemToC episodes as tool-choice decisions (paper App. G)",
    "ack": "conflict acknowledgment: the judge's verdicts, annotation sheets, agreement",
    "outcome-round": "the blinded outcome annotation round (judge validation)",
}


def register_job(name: str, config: str, run: str, help: str, description: str | None = None) -> Job:
    """Add a job under its command path (a later registration of the same name replaces it)."""
    JOBS[name] = entry = Job(name, config, run, help, description)
    return entry


def lookup(name: str) -> Job:
    """The registered job named ``name``, or an error listing the names there are (the filled table is
    :func:`memtoc.jobs.catalog.job`'s: this module imports no job and no catalog)."""
    try:
        return JOBS[name]
    except KeyError:
        raise MemtocError(f"no job {name!r}; the jobs are: {', '.join(JOBS)}") from None
