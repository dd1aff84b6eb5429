"""One command-line vocabulary: the old spellings of renamed flags, kept for one release as deprecated aliases.

Each concept has one flag across the commands (``--out`` for every output path, ``--protocol`` for the paper
protocol only, ``--call-format`` for the code executor's tool-call format, ``--tool-choice`` for the agent's
tool-choice protocols, ``--score-layer`` for the scorer layer beside ``--layers`` for sites, ``--position-kinds``
for the store's position kinds beside ``--edit-positions`` for where an edit applies, ``--formulations``). The
parsers are written with the new spellings; :data:`DEPRECATED` lists the old ones and :func:`add_deprecated_aliases`
adds them to the built parser: an old spelling still parses, into the same field, and prints one warning naming
its replacement. ``docs/cli.md`` lists the table (a test keeps the two equal).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from memtoc.core.vocab import CODEEXEC_PROTOCOLS


@dataclass(frozen=True)
class Deprecated:
    """``old`` now spelled ``new`` on ``commands`` (leaf paths such as ``codeexec evaluate``: the commands that had
    the old spelling). With ``values``, ``old`` is also the new spelling of another concept on that command
    (codeexec evaluate's ``--protocol``): only those values mean ``new``."""

    old: str
    new: str
    commands: tuple[str, ...]
    values: tuple[str, ...] = ()


#: Every renamed flag (the release after next drops these spellings).
DEPRECATED: tuple[Deprecated, ...] = (
    Deprecated("--output", "--out", ("score", "metrics", "episodes", "compare", "sae fvu", "judge", "ack car",
                                     "ack import", "outcome-round import")),
    Deprecated("--layer", "--score-layer", ("metrics", "compare", "sweep", "study", "ack export",
                                            "outcome-round export")),
    Deprecated("--position-kind", "--position-kinds", ("probe", "mine-features", "direction")),
    Deprecated("--formulation", "--formulations", ("episodes",)),
    Deprecated("--positions", "--position-kinds", ("extract", "codeexec extract")),
    Deprecated("--positions", "--edit-positions", ("direction", "mine-features")),
    Deprecated("--run-protocol", "--protocol", ("codeexec evaluate",)),
    Deprecated("--protocol", "--call-format", ("codeexec evaluate",), values=CODEEXEC_PROTOCOLS),
    Deprecated("--protocol", "--call-format", ("codeexec extract", "codeexec sweep")),
    Deprecated("--protocol", "--tool-choice", ("agent evaluate",)),
    Deprecated("--family", "--holm-family", ("study",)),
)


def old_commands(argv: Sequence[str]) -> list[str]:
    """``argv`` with an old command spelling rewritten to its command: ``sweep --family codeexec ...`` is
    ``codeexec sweep ...`` (with a warning), ``sweep --family memtoc`` is ``sweep``."""
    argv = list(argv)
    if not argv or argv[0] != "sweep":
        return argv
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--family" or a.startswith("--family="):
            value = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else None)
            if value not in ("memtoc", "codeexec"):
                return argv           # the parser refuses it (unknown option)
            rest = argv[1:i] + argv[i + (1 if "=" in a else 2):]
            if value == "memtoc":
                return ["sweep", *rest]
            warn_deprecated("sweep", f"--family {value}", f"memtoc {value} sweep")
            return [value, "sweep", *rest]
    return argv


def warn_deprecated(command: str, old: str, new: str) -> None:
    print(f"warning: memtoc {command}: {old} is deprecated and goes in the next release; use {new}", file=sys.stderr)


class _Alias(argparse.Action):
    """An old spelling: warns, then runs the new spelling's own action (same field, same checks)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, target: argparse.Action, command: str,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.target, self.command = target, command

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        warn_deprecated(self.command, option_string or self.option_strings[0], self.target.option_strings[0])
        self.target(parser, namespace, values, option_string)


class _Shared(argparse.Action):
    """A flag that is the new spelling of one concept and the old one of another: the old concept's values go
    to its new flag (with the warning), the rest to this flag's own action."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, own: argparse.Action, old: argparse.Action,
                 values: tuple[str, ...], command: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.own, self.old, self.old_values, self.command = own, old, values, command

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values in self.old_values:
            warn_deprecated(self.command, f"{option_string} {values}", f"{self.old.option_strings[0]} {values}")
            self.old(parser, namespace, values, option_string)
        else:
            self.own(parser, namespace, values, option_string)


def iter_leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``(command path, parser)`` of every leaf command (``codeexec evaluate``)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, child in action.choices.items():
            yield from iter_leaves(child, path + (name,))


def _find(leaf: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return leaf._option_string_actions.get(flag)


def _unrequire(leaf: argparse.ArgumentParser, action: argparse.Action) -> None:
    """A required option that an old spelling may also give: argparse cannot see the alias as the same option,
    so the requirement moves to :func:`check_required` (the same one-line error)."""
    if action.required:
        action.required = False
        action.default = None
        leaf.set_defaults(_required=(*(leaf.get_default("_required") or ()), (action.dest, action.option_strings[0])))


def add_deprecated_aliases(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add every rule of :data:`DEPRECATED` to the leaves of ``parser`` that have its new spelling."""
    for command, leaf in iter_leaves(parser):
        for rule in DEPRECATED:
            if command not in rule.commands:
                continue
            new = _find(leaf, rule.new)
            if new is None:
                continue
            existing = _find(leaf, rule.old)
            if rule.values:
                if existing is None:
                    continue
                _share(leaf, existing, new, rule, command)
                continue
            if existing is not None:
                continue
            _unrequire(leaf, new)
            leaf.add_argument(rule.old, action=_Alias, target=new, command=command, dest=new.dest,
                              nargs=new.nargs, type=new.type, choices=new.choices, metavar=new.metavar,
                              default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _share(leaf: argparse.ArgumentParser, own: argparse.Action, old: argparse.Action, rule: Deprecated,
           command: str) -> None:
    """Replace ``own`` (the flag ``rule.old``) with a :class:`_Shared` action that also takes ``rule.values``."""
    choices = (*own.choices, *rule.values) if own.choices is not None else None
    shared = _Shared(own.option_strings, own.dest, own=own, old=old, values=rule.values, command=command,
                     nargs=own.nargs, type=own.type, choices=choices, metavar=own.metavar or "{" + ",".join(
                         own.choices or ()) + "}", default=own.default, help=own.help, required=own.required)
    for group in leaf._action_groups:
        if own in group._group_actions:
            group._group_actions[group._group_actions.index(own)] = shared
    leaf._actions[leaf._actions.index(own)] = shared
    for s in own.option_strings:
        leaf._option_string_actions[s] = shared


def check_required(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The requirement :func:`_unrequire` moved: exits with argparse's one-line error when still missing."""
    missing = [flag for dest, flag in getattr(args, "_required", ()) if getattr(args, dest, None) is None]
    if missing:
        leaf = dict(iter_leaves(parser)).get(_command_of(args), parser)
        leaf.error(f"the following arguments are required: {', '.join(missing)}")


def _command_of(args: argparse.Namespace) -> str:
    parts = [getattr(args, "command", "")]
    for key, value in vars(args).items():
        if key.endswith("_command") and isinstance(value, str):
            parts.append(value)
    return " ".join(p for p in parts if p)
