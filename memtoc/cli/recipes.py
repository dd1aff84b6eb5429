"""``memtoc run-experiment``: the recipe runner (:mod:`memtoc.recipes.experiment`) with the command line's
vocabulary. A step of a registered job runs as that job from its config values (no parser), its result shown as
the command shows it (:func:`run_step`); the options a step may set are the job config's, less those the job
does not take (``Job.exclude``).

Every command is a registered job: no step reads a parser.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

from memtoc.recipes import experiment as _exp
from memtoc.recipes.experiment import OptionKind


def _command(name: str) -> Any:
    from memtoc.cli.catalog import COMMANDS

    return next((c for c in COMMANDS if c.name == name), None)


def run_step(command: str, values: Mapping[str, Any]) -> int:
    """One recipe step of a job: its config built from ``values``, the job run, the result shown as ``memtoc
    COMMAND`` shows it; a user error is one line and exit status 2. Module-level: Ray ships it to a worker."""
    from memtoc.core.exits import reported

    cmd = _command(command)
    if cmd is None:                              # a job the command line does not list: the runner's own step
        return _exp.run_job_step(command, values)

    def step() -> int:
        entry = cmd.job()
        cfg = entry.build(values)
        result = entry.run_checked(cfg)
        return cmd.present(result, cfg)

    return reported(command, step)


class ParserCommands:
    """The command line's vocabulary for recipes (:class:`memtoc.recipes.experiment.Commands`)."""

    step = staticmethod(run_step)

    @lru_cache(maxsize=None)  # noqa: B019 - one instance per process (COMMANDS)
    def _options(self, command: tuple[str, ...]) -> dict[str, OptionKind] | None:
        name = " ".join(command)
        if _command(name) is not None:
            return _exp.job_options(command)
        return None

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        return self._options(tuple(command))


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
