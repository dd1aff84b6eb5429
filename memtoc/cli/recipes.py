"""``memtoc run-experiment``: the recipe runner (:mod:`memtoc.recipes.experiment`) bound to the command line's
vocabulary: which options each subcommand takes is read from the parsers here, and every step runs through
:func:`memtoc.cli.commands.run_command`. The runner itself imports no parser."""

from __future__ import annotations

import argparse
from functools import lru_cache
from typing import Any, Mapping, Sequence

from memtoc.cli.commands import build_job_parser, run_command
from memtoc.recipes import experiment as _exp
from memtoc.recipes.experiment import OptionKind


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in parser._actions:  # noqa: SLF001 - argparse keeps subparsers here
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            return dict(a.choices)
    return {}


def find_subparser(command: Sequence[str]) -> argparse.ArgumentParser | None:
    """The parser of ``memtoc <command...>``, or None when the subcommand is not registered."""
    p: argparse.ArgumentParser | None = build_job_parser()
    for word in command:
        p = _subcommands(p).get(word) if p is not None else None
    return p


def parser_options(p: argparse.ArgumentParser) -> dict[str, OptionKind]:
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

    entry = staticmethod(run_command)

    @lru_cache(maxsize=None)  # noqa: B019 - one instance per process (COMMANDS)
    def _options(self, command: tuple[str, ...]) -> dict[str, OptionKind] | None:
        p = find_subparser(command)
        return None if p is None else parser_options(p)

    def options(self, command: Sequence[str]) -> Mapping[str, OptionKind] | None:
        return self._options(tuple(command))


COMMANDS = ParserCommands()


def validate_recipe(recipe: Any, *, extra_defaults: Sequence[str] = ()) -> list[str]:
    return _exp.validate_recipe(recipe, COMMANDS, extra_defaults=extra_defaults)


def run_experiment(recipe_path: Any, **kw: Any) -> Any:
    return _exp.run_experiment(recipe_path, commands=COMMANDS, **kw)


def step_argv(st: Any, parser: argparse.ArgumentParser, options: Mapping[str, Any], refs: Mapping[str, str],
              out: str | None = None) -> list[str]:
    return _exp.step_argv(st, parser_options(parser), options, refs, out=out)


def takes_protocol(parser: argparse.ArgumentParser | None, protocol: str) -> bool:
    return _exp.takes_protocol(None if parser is None else parser_options(parser), protocol)


def cmd_run_experiment(args: argparse.Namespace) -> int:
    from memtoc.cli.executor import executor_from_args

    name, resources, address = executor_from_args(args)
    res = run_experiment(args.recipe, out=args.out, quick=args.quick, model=args.model, backend=args.backend,
                         overrides=args.set or (), report=not args.no_report, executor=name, resources=resources,
                         address=address)
    for s in res.steps:
        print(f"  {s['name']:24s} {str(s['status']):36s} {'' if s['seconds'] is None else s['seconds']}")
    failed = [s for s in res.steps if s["status"] == "failed"]
    if failed:
        print(f"{len(failed)} step(s) failed:")
        for s in failed:
            print(f"  FAILED {s['name']}: exit {s['rc']}: {s.get('error') or 'no error message'}")
    print(f"experiment directory: {res.out}" + ("" if res.ok else "  (INCOMPLETE: a step failed)"))
    return 0 if res.ok else 1


def add_experiment_parser(sub: Any) -> None:
    from memtoc.core.options import add_option
    from memtoc.cli.executor import add_executor_options

    p = sub.add_parser("run-experiment", help="run a study recipe (experiments/*.toml): its memtoc commands in order, "
                       "then memtoc report")
    p.add_argument("recipe", help="recipe file, e.g. experiments/baseline.toml")
    p.add_argument("--quick", action="store_true", help="apply the recipe's [quick] settings (a small run)")
    add_option(p, "model", default=None, help="override the model of every step that takes --model")
    add_option(p, "backend", default=None, help="override the backend of every step that takes --backend")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a [defaults] option for every step that takes it (repeatable), e.g. --set limit=2")
    p.add_argument("--out", default=None, help="experiment directory (default experiments_out/<name>[-quick])")
    p.add_argument("--no-report", action="store_true", help="skip the final memtoc report")
    add_executor_options(p)
    p.set_defaults(func=cmd_run_experiment)
