"""Every ``memtoc`` subcommand's options as data: flag, dest, default, choices, type, action, required.

``tests/memtoc/data/cli_options_frozen.json`` holds this snapshot taken from the hand-written parsers before
the options were generated from the config dataclasses (``memtoc.options``); ``test_options.py`` compares the
generated parsers with it, so no flag, default or choice changed on the way.
"""

from __future__ import annotations

import argparse
from typing import Any


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:  # noqa: SLF001
        if isinstance(a, argparse._SubParsersAction):  # noqa: SLF001
            return dict(a.choices)
    return {}


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return repr(v)


def describe(p: argparse.ArgumentParser) -> dict[str, Any]:
    opts = {}
    for a in p._actions:  # noqa: SLF001
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        key = a.option_strings[0] if a.option_strings else a.dest
        opts[key] = {"flags": list(a.option_strings), "dest": a.dest, "default": _jsonable(a.default),
                     "choices": _jsonable(list(a.choices)) if a.choices is not None else None,
                     "type": getattr(a.type, "__name__", None) if a.type is not None else None,
                     "action": type(a).__name__, "required": bool(a.required), "nargs": _jsonable(a.nargs)}
    return opts


def snapshot(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``{"evaluate": {...}, "lens fit": {...}, ...}`` for every (nested) subcommand."""
    out: dict[str, Any] = {}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = _subparsers(p)
        if path:
            out[" ".join(path)] = describe(p)
        for name, sp in subs.items():
            walk(sp, path + (name,))

    walk(parser, ())
    return out
