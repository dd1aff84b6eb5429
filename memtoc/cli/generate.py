"""The command line, generated: each subcommand's parser from its job's config, and one dispatch for all of them.

A command is a job of :mod:`memtoc.jobs.registry` plus how its result is shown (:class:`Command`). Its options
are the option fields of the job's config (:mod:`memtoc.core.options`): flag, value type, choices, help and
default are read from there, never written here. Every option is parsed with ``argparse.SUPPRESS`` as its
default, so the parsed namespace holds exactly what the user typed: that is the record of given fields
(:func:`memtoc.core.values.given_fields`), and the config's own defaults fill the rest through the one config
builder (:func:`memtoc.core.values.build_config`), the builder the Python API and recipes call too.

This is the only module that calls ``add_argument`` (``tests/memtoc/cli/test_generate.py`` counts).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from memtoc.core.options import Leaf, Option, leaves

__all__ = ["Command", "MemtocParser", "build_parser", "config_from_namespace", "dispatch", "iter_leaves",
           "option_leaves"]


@dataclass(frozen=True)
class Command:
    """One subcommand: the job it runs and how its result is shown.

    ``present(result, config)`` prints the result and returns the exit status (None: 0). ``helps`` sharpens an
    option's help for this command, ``choices`` narrows an option's choices to the values this command takes (the
    options a job does not take are its ``Job.exclude``).
    ``config``/``run`` name a config and run function directly (``module:attr``) for a command that is not a
    registered job (``run-experiment``, above the job layer).
    """

    name: str
    present: Callable[[Any, Any], int | None] | None = None
    helps: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    config: str | None = None
    run: str | None = None
    help: str | None = None
    description: str | None = None

    def job(self) -> Any:
        from memtoc.jobs.catalog import job
        from memtoc.jobs.registry import Job

        if self.config is not None:
            return Job(self.name, self.config, self.run or "", self.help or "", self.description)
        return job(self.name)


class MemtocParser(argparse.ArgumentParser):
    """argparse without its usage block on a user error: one line, exit 2; an unknown option names the nearest
    one. Abbreviated options are refused (``--pos`` is not ``--position-kinds``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        self._seen = list(args)
        fill = self.__dict__.pop("_fill", None)     # a lazy command's options, added when it is reached
        if fill is not None:
            fill()
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        leaf = self._leaf()
        unknown = leaf._unknown_flags()
        if message.startswith("unrecognized arguments:") or (unknown and "required" in message):
            message = leaf._suggest(unknown or message.split(":", 1)[1].split())
        self.exit(2, f"{leaf.prog}: error: {message}\n")

    def _leaf(self) -> "MemtocParser":
        """The subcommand's parser the words of the command line reach (its flags answer an unknown one)."""
        parser: Any = self
        for word in getattr(self, "_seen", []):
            if word.startswith("-"):
                break
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
            if not subs or word not in subs[0].choices:
                break
            parser = subs[0].choices[word]
        return parser

    def _flags(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings]

    def _unknown_flags(self) -> list[str]:
        known = set(self._flags())
        return [w for w in getattr(self, "_seen", []) if w.startswith("--") and w.split("=")[0] not in known]

    def _suggest(self, words: Sequence[str]) -> str:
        flags = [s for a in self._actions for s in a.option_strings if a.help != argparse.SUPPRESS]
        parts = []
        for w in words:
            if not w.startswith("-"):
                parts.append(f"unexpected argument {w!r}")
                continue
            typed = w.split("=")[0]
            near = [f for f in flags if f.startswith(typed)] or difflib.get_close_matches(typed, flags, n=1,
                                                                                          cutoff=0.6)
            parts.append(f"unknown option {w}" + (f"; did you mean {near[0]}?" if near else
                                                  f" ({self.prog} --help lists the options)"))
        return "; ".join(parts)


def option_leaves(cls: type, exclude: Sequence[str] = ()) -> list[Leaf]:
    """The options of config ``cls`` a command takes, in declaration order."""
    try:
        base = cls()
    except TypeError:
        base = None
    return [leaf for leaf in leaves(cls, base) if leaf.field not in exclude]


def _show_default(value: Any) -> str | None:
    if value is None or value is False or value == "" or value == () or value is dataclasses.MISSING:
        return None
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _help(spec: Option, leaf: Leaf, text: str | None, required: bool = False) -> str:
    text = text if text is not None else (spec.help or "")
    if spec.hidden:
        return argparse.SUPPRESS
    quiet = spec.negate or spec.switch or spec.off_flag or required or spec.required
    shown = None if quiet else _show_default(leaf.default)
    if shown is not None and "default" not in text:
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text


def _add(target: Any, leaf: Leaf, *, help: str | None, required: bool) -> None:
    spec = leaf.spec
    text = _help(spec, leaf, help, required)
    if spec.positional:
        kw: dict[str, Any] = {"help": text, **_value_kwargs(spec)}
        if spec.nargs:
            kw["nargs"] = spec.nargs
            kw["default"] = argparse.SUPPRESS
        target.add_argument(spec.name, **kw)
        return
    if spec.off_flag:
        group = target.add_mutually_exclusive_group()
        group.add_argument(spec.option_string, dest=spec.dest, action="store_const", const=True,
                           default=argparse.SUPPRESS, help=text)
        group.add_argument(spec.off_flag, dest=spec.dest, action="store_const", const=False,
                           default=argparse.SUPPRESS, help=spec.off_help)
        return
    if spec.negate or spec.switch:
        target.add_argument(spec.option_string, dest=spec.dest, action="store_true", default=argparse.SUPPRESS,
                            help=text)
        return
    kw = {"help": text, "dest": spec.dest, "default": argparse.SUPPRESS, **_value_kwargs(spec)}
    if required or spec.required:
        kw["required"] = True
    if spec.repeat:
        kw["action"] = "append"
    target.add_argument(spec.option_string, **kw)


def _value_kwargs(spec: Option) -> dict[str, Any]:
    """How argparse reads an option's value: its parser, its choices, its placeholder."""
    kw: dict[str, Any] = {}
    if spec.parse is not None:
        kw["type"] = spec.parse
    if spec.choices is not None:
        kw["choices"] = spec.choices
    if spec.metavar:
        kw["metavar"] = spec.metavar
    return kw


def add_config_options(parser: argparse.ArgumentParser, cls: type, command: Command) -> None:
    """Every option of ``cls`` (less its job's ``exclude``) on ``parser``, grouped and made exclusive as declared."""
    groups: dict[str, Any] = {}
    exclusive: dict[str, Any] = {}
    found = option_leaves(cls, command.job().exclude)
    for leaf in found:
        spec = leaf.spec
        target: Any = parser
        if spec.group:
            if spec.group not in groups:
                groups[spec.group] = parser.add_argument_group(spec.group)
            target = groups[spec.group]
        if spec.exclusive:
            if spec.exclusive not in exclusive:
                need = any(x.spec.exclusive == spec.exclusive and x.spec.exclusive_required for x in found)
                exclusive[spec.exclusive] = target.add_mutually_exclusive_group(required=need)
            target = exclusive[spec.exclusive]
        if leaf.field in command.choices:
            leaf = dataclasses.replace(leaf, spec=dataclasses.replace(spec, choices=command.choices[leaf.field]))
        _add(target, leaf, help=command.helps.get(leaf.field), required=leaf.field in command.required)


def config_from_namespace(cls: type, args: argparse.Namespace, exclude: Sequence[str] = ()) -> Any:
    """Config ``cls`` from a parsed namespace: the options present in it were given (the others are absent:
    their parser default is SUPPRESS), built by the one config builder."""
    from memtoc.core.values import build_config

    values: dict[str, Any] = {}
    for leaf in option_leaves(cls, exclude):
        dest = leaf.spec.dest
        if hasattr(args, dest):
            value = getattr(args, dest)
            key = leaf.field if leaf.spec.positional else leaf.spec.option_string
            values[key] = (not value) if leaf.spec.negate else value
    return build_config(cls, values)


def dispatch(command: Command, args: argparse.Namespace) -> int:
    """Build the command's config from ``args``, run its job, present the result."""
    entry = command.job()
    cfg = config_from_namespace(entry.config_class(), args, entry.exclude)
    result = entry.run_checked(cfg)         # the one input/output contract first, then the job
    if command.present is None:
        return 0
    return int(command.present(result, cfg) or 0)


def _subparsers(parser: argparse.ArgumentParser, dest: str) -> Any:
    for action in parser._actions:  # noqa: SLF001 - argparse keeps the subparsers action here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action
    return parser.add_subparsers(dest=dest, required=True, parser_class=MemtocParser)


def add_command(root: argparse.ArgumentParser, command: Command, groups: Mapping[str, str], *,
                lazy: bool = False) -> argparse.ArgumentParser:
    """The leaf parser of ``command`` under ``root`` (with its group's parser, ``lens`` of ``lens fit``); ``lazy``:
    its options (which import the job's config) are added when the leaf is parsed."""
    entry = command.job()
    words = command.name.split()
    parent, sub = root, _subparsers(root, "command")
    for i, word in enumerate(words[:-1]):
        if word not in sub.choices:
            sub.add_parser(word, help=groups.get(word))
        parent = sub.choices[word]
        sub = _subparsers(parent, f"{word.replace('-', '_')}_command" if i == 0 else f"{word}_command")
    p = sub.add_parser(words[-1], help=command.help or entry.help,
                       description=command.description or entry.description or command.help or entry.help)
    if lazy:
        p._fill = lambda: add_config_options(p, entry.config_class(), command)  # type: ignore[attr-defined]
    else:
        add_config_options(p, entry.config_class(), command)
    p.set_defaults(func=lambda args, _c=command: dispatch(_c, args), memtoc_command=command.name)
    return p


def build_parser(commands: Sequence[Command], *, description: str | None = None,
                 lazy: bool = False) -> argparse.ArgumentParser:
    """``memtoc`` with every command of ``commands`` (``lazy``: see :func:`add_command`)."""
    from memtoc.jobs.registry import GROUPS

    from memtoc import __version__

    parser = MemtocParser(prog="memtoc", description=description)
    parser.add_argument("--version", action="version", version=f"memtoc {__version__}")
    parser.add_subparsers(dest="command", required=True, parser_class=MemtocParser)
    for command in commands:
        add_command(parser, command, GROUPS, lazy=lazy)
    return parser


def iter_leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` of every leaf command (``codeexec evaluate``)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, child in action.choices.items():
            yield from iter_leaves(child, path + (name,))


def run(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    from memtoc.core.exits import reported

    args = parser.parse_args(argv)
    return reported(getattr(args, "memtoc_command", args.command), lambda: args.func(args))
