"""``memtoc run-experiment``: the recipe runner (:mod:`memtoc.recipes.experiment`) whose steps show their results
as their commands do. A step runs as its job from its config values (no parser); its keys are the job config's
options less those the job does not take (its config's ``NOT_TAKEN``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

from memtoc.recipes import experiment as _exp
from memtoc.recipes.experiment import OptionKind


def run_step(command: str, values: Mapping[str, Any]) -> int:
    """One recipe step of a job: its config built from ``values``, the job run, the result shown as ``memtoc
    COMMAND`` shows it; a user error is one line and exit status 2. Module-level: Ray ships it to a worker."""
    from memtoc.cli.parse import commands
    from memtoc.cli.present import present
    from memtoc.core.exits import reported

    cmd = commands().get(command)
    if cmd is None:                              # not a command: the runner's own step
        return _exp.run_job_step(command, values)

    def step() -> int:
        cfg = cmd.build(values)
        return present(command, cmd.run_checked(cfg), cfg)

    return reported(command, step)


@lru_cache(maxsize=None)
def _options(command: tuple[str, ...]) -> dict[str, OptionKind] | None:
    return _exp.job_options(command)


class ParserCommands(_exp.JobCommands):
    """The job table as a recipe's vocabulary, each step's result shown as its command shows it."""

    step = staticmethod(run_step)

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        return _options(tuple(command))


COMMANDS = ParserCommands()


def validate_recipe(recipe: Any, *, extra_defaults: Sequence[str] = ()) -> list[str]:
    return _exp.validate_recipe(recipe, COMMANDS, extra_defaults=extra_defaults)


def run_experiment(recipe_path: Any, **kw: Any) -> Any:
    return _exp.run_experiment(recipe_path, commands=COMMANDS, **kw)


def run_experiment_job(cfg: Any) -> Any:
    """``memtoc run-experiment``'s run: the recipe runner's job with the command line's vocabulary."""
    return _exp.run_experiment_job(cfg, commands=COMMANDS)


def step_argv(st: Any, options: Mapping[str, Any], refs: Mapping[str, str], out: str | None = None) -> list[str]:
    """The command line of one step (a job's as built from its config values)."""
    opts = COMMANDS.options(st.command)
    return _exp.job_argv(st, opts, _exp.step_values(st, opts, options, refs, out=out))
