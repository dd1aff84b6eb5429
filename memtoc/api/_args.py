"""Keyword arguments -> the parsed options of one ``memtoc`` command, with that command's own defaults.

The Python API does not restate a single default: each function takes the command's options by their
``--option`` name (``--question-set`` -> ``question_set``), fills every other one from the command's parser
(:func:`memtoc.cli.commands.build_job_parser`, the same one the command line uses) and hands the namespace to the
function the command itself calls. So a notebook and a recipe with the same options run the same job.
"""

from __future__ import annotations

import argparse
from functools import lru_cache
from typing import Any, Sequence

from memtoc.core.errors import MemtocError


class APIError(MemtocError, TypeError):
    """A keyword the command does not take, or a required one missing (the message names it)."""


@lru_cache(maxsize=None)
def _subparser(command: tuple[str, ...]) -> argparse.ArgumentParser:
    from memtoc.cli.commands import build_job_parser

    parser = build_job_parser()
    for word in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def _actions(command: tuple[str, ...]) -> dict[str, argparse.Action]:
    return {a.dest: a for a in _subparser(command)._actions
            if a.dest not in ("help", argparse.SUPPRESS) and not isinstance(a, argparse._SubParsersAction)}


def option_names(command: Sequence[str]) -> list[str]:
    """The keyword names a command takes (its options' destinations)."""
    return sorted(_actions(tuple(command)))


def _convert(action: argparse.Action, value: Any) -> Any:
    """A Python value as the command line would have parsed it (lists become comma lists)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(action, argparse._AppendAction):
        return [value] if isinstance(value, str) else [str(v) for v in value]
    if isinstance(value, (list, tuple, set, frozenset, range)):
        value = ",".join(str(v) for v in value)
    if isinstance(value, str) and action.type not in (None, str):
        value = action.type(value)
    elif not isinstance(value, str) and action.type in (None, str) and action.default is not None \
            and isinstance(action.default, str):
        value = str(value)
    return value


def command_args(command: str | Sequence[str], values: dict[str, Any], *, ignore: Sequence[str] = ()
                 ) -> argparse.Namespace:
    """The namespace ``memtoc COMMAND`` would parse from these options (every other one at its default).

    A ``--no-X`` switch is also reachable as ``X=False``. An unknown keyword is refused with the command's
    option names; a required option left unset is refused.
    """
    words = (command,) if isinstance(command, str) else tuple(command)
    actions = _actions(words)
    values = dict(values)
    for k in list(values):       # progress=False is --no-progress (the field's name, not the switch's)
        neg = f"no_{k}"
        if k not in actions and isinstance(actions.get(neg), argparse._StoreTrueAction):
            v = values.pop(k)
            values[neg] = None if v is None else not v
    unknown = sorted(k for k in values if k not in actions and k not in ignore)
    if unknown:
        raise APIError(f"{' '.join(words)} takes no option(s) {', '.join(unknown)}; it takes "
                       f"{', '.join(sorted(actions))}")
    # A suppressed default (``--protocol`` fills it) stays absent, as argparse leaves it.
    ns = argparse.Namespace(**{dest: a.default for dest, a in actions.items() if a.default is not argparse.SUPPRESS})
    for k, v in values.items():
        if k in actions and v is not None:
            setattr(ns, k, _convert(actions[k], v))
    missing = [dest for dest, a in actions.items() if a.required and getattr(ns, dest, None) is None]
    if missing:
        raise APIError(f"{' '.join(words)} needs {', '.join(missing)}")
    ns.command = words[0]
    return ns
