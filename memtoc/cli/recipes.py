"""``memtoc run-experiment``: the recipe runner (:mod:`memtoc.recipes.experiment`) with the command line's
vocabulary. A step of a registered job runs as that job from its config values (no parser), its result shown as
the command shows it (:func:`run_step`); the options a step may set are the job config's, less those the command
line leaves off that command (``Command.exclude``), plus the old spellings (:mod:`memtoc.cli.vocabulary`).

TEMPORARY (issue 36, while the commands are converted): a command that is not yet a registered job is read from
its hand-written parser and runs as an argv through :func:`memtoc.cli.commands.run_command`. Once every command is a
job, :class:`ParserCommands` keeps only its job part (``find_subparser``, ``parser_options`` and ``entry`` go).
"""

from __future__ import annotations

import argparse
import sys
from functools import lru_cache
from typing import Any, Mapping, Sequence

from memtoc.cli.commands import build_job_parser, run_command
from memtoc.core.errors import MemtocError
from memtoc.recipes import experiment as _exp
from memtoc.recipes.experiment import OptionKind


def _command(name: str) -> Any:
    from memtoc.cli.catalog import COMMANDS

    return next((c for c in COMMANDS if c.name == name), None)


def old_spellings(name: str) -> dict[str, str]:
    """Old flag -> new flag of command ``name`` (rules that apply to some values only are left to the parser)."""
    from memtoc.cli.vocabulary import DEPRECATED

    return {r.old: r.new for r in DEPRECATED if name in r.commands and not r.values}


def run_step(command: str, values: Mapping[str, Any]) -> int:
    """One recipe step of a job: its config built from ``values``, the job run, the result shown as ``memtoc
    COMMAND`` shows it; a user error is one line and exit status 2. Module-level: Ray ships it to a worker."""
    from memtoc.core.values import build_config

    cmd = _command(command)
    if cmd is None:                              # a job the command line does not list: the runner's own step
        return _exp.run_job_step(command, values)
    try:
        entry = cmd.job()
        cfg = build_config(entry.config_class(), values)
        result = entry.runner()(cfg)
        return 0 if cmd.present is None else int(cmd.present(result, cfg) or 0)
    except MemtocError as exc:
        print(f"memtoc {command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        from memtoc.core.fileio import describe_os_error

        where = f"{exc.filename}: " if exc.filename else ""
        print(f"memtoc {command}: error: {where}{describe_os_error(exc)}", file=sys.stderr)
        return 2


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            return dict(a.choices)
    return {}


def find_subparser(command: Sequence[str]) -> argparse.ArgumentParser | None:
    """TEMPORARY: the parser of ``memtoc <command...>``, or None when the subcommand is not registered."""
    p: argparse.ArgumentParser | None = build_job_parser()
    for word in command:
        p = _subcommands(p).get(word) if p is not None else None
    return p


def parser_options(p: argparse.ArgumentParser) -> dict[str, OptionKind]:
    """TEMPORARY: the options of a hand-written parser, for the commands that are not yet jobs."""
    out = {}
    for a in p._actions:  # noqa: SLF001
        parse = a.type if a.type in (int, float) else None
        kind = OptionKind(switch=a.nargs == 0, choices=tuple(a.choices) if a.choices else None, parse=parse,
                          listed=a.help != argparse.SUPPRESS)
        for s in a.option_strings:
            if s.startswith("--"):
                out[s] = kind
    return out


class ParserCommands:
    """The command line's vocabulary for recipes (:class:`memtoc.recipes.experiment.Commands`)."""

    entry = staticmethod(run_command)      # TEMPORARY: the commands that are not yet jobs
    step = staticmethod(run_step)

    @lru_cache(maxsize=None)  # noqa: B019 - one instance per process (COMMANDS)
    def _options(self, command: tuple[str, ...]) -> dict[str, OptionKind] | None:
        name = " ".join(command)
        cmd = _command(name)
        if cmd is not None:
            return _exp.job_options(command, exclude=cmd.exclude, old=old_spellings(name))
        p = find_subparser(command)
        return None if p is None else parser_options(p)

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
    if _exp.is_job(opts):
        return _exp.job_argv(st, opts, _exp.step_values(st, opts, options, refs, out=out))
    return _exp.step_argv(st, opts, options, refs, out=out)


def present_experiment(res: Any, cfg: Any) -> int:
    """The steps' statuses, the failed ones' errors, the experiment directory."""
    for s in res.steps:
        print(f"  {s['name']:24s} {str(s['status']):36s} {'' if s['seconds'] is None else s['seconds']}")
    failed = [s for s in res.steps if s["status"] == "failed"]
    if failed:
        print(f"{len(failed)} step(s) failed:")
        for s in failed:
            print(f"  FAILED {s['name']}: exit {s['rc']}: {s.get('error') or 'no error message'}")
    print(f"experiment directory: {res.out}" + ("" if res.ok else "  (INCOMPLETE: a step failed)"))
    return 0 if res.ok else 1
