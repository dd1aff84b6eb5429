"""The command line: ``memtoc COMMAND [OPTIONS]``, each command's options parsed by tyro from its job's config.

The first words name a command (a job of :mod:`memtoc.jobs.catalog`); tyro parses the rest from the job's config
dataclass, one flag per option field, flat over the nested pieces (``OmitArgPrefixes``), refusing abbreviated
flags and suggesting the nearest one. A value is parsed as the text typed and the config is built by the one
config builder (:func:`memtoc.core.values.build_config`) that the Python API and recipes call, so every door checks
a value the same way and only the options typed count as given. A parse error is one line on stderr, exit 2.
"""

from __future__ import annotations

import contextlib
import functools
import dataclasses
import difflib
import io
import re
import sys
import warnings
from typing import Annotated, Any, Sequence

from memtoc.core.options import Option, default_config, piece_type

__all__ = ["main", "commands", "parse_options", "parse_config", "command_leaves", "top_help"]

#: what ``memtoc --help`` says above the list of commands
DESCRIPTION = ("Interpretability and steering on the MemToC benchmark: evaluate a model, capture and probe its "
               "activations, fit lenses, build and sweep edits, report. `memtoc COMMAND --help` lists a command's "
               "options.")


@functools.cache
def commands() -> dict[str, Any]:
    """The subcommands: every job of the job table, and ``run-experiment`` (the recipe runner, whose steps the
    command line shows with its presenters) just before ``merge``."""
    import memtoc.jobs.catalog  # noqa: F401 - fills the job table
    from memtoc.jobs.registry import JOBS, Job

    names = list(JOBS)
    names.insert(names.index("merge"), "run-experiment")
    experiment = Job("run-experiment", "memtoc.recipes.experiment:ExperimentConfig",
                     "memtoc.cli.recipes:run_experiment_job",
                     "run a study recipe (experiments/*.toml): its memtoc commands in order, then memtoc report")
    return {n: JOBS.get(n, experiment) for n in names}


def command_leaves(command: Any) -> list[Any]:
    """The option leaves a command takes (:func:`memtoc.core.options.option_leaves`)."""
    from memtoc.core.options import option_leaves

    return option_leaves(command.config_class())


def _shown(value: Any) -> str | None:
    if value is None or value is False or value == "" or value == () or value is dataclasses.MISSING:
        return None
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _help(spec: Option, default: Any) -> str:
    text = spec.help or ""
    shown = None if (spec.negate or spec.switch or spec.off_flag or spec.required) else _shown(default)
    if shown is not None and "default" not in text:
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text


def _metavar(spec: Option) -> str:
    if spec.metavar:
        return spec.metavar
    return {int: "INT", float: "NUMBER"}.get(spec.parse, spec.name.upper())  # type: ignore[arg-type]


def _arg_name(flag: str) -> str:
    """The name tyro turns back into ``flag`` (``--generate-to-budget`` -> ``generate_to_budget``)."""
    return flag[2:].replace("-", "_")


def _arg_specs(spec: Option, default: Any) -> list[Any]:
    """tyro's fields for one option (``spec``, the config's ``default``): each parses the text typed
    (``None``/``False``: not given)."""
    import tyro
    from tyro.constructors import StructFieldSpec

    text = _help(spec, default)
    hint = "(required)" if spec.required else ""
    switch = Annotated[bool, tyro.conf.arg(help_behavior_hint="")]     # a flag: no "(default: False)"
    if spec.off_flag:           # two switches of one boolean field
        return [StructFieldSpec(_arg_name(spec.option_string), switch, False, text),
                StructFieldSpec(_arg_name(spec.off_flag), switch, False, spec.off_help)]
    if spec.negate or spec.switch:
        return [StructFieldSpec(_arg_name(spec.option_string), switch, False, text)]
    choices = spec.choices
    kind: Any = str             # the text typed: the config builder checks it (choices included)
    metavar = spec.name.upper() if spec.positional else ("{" + ",".join(choices) + "}" if choices else _metavar(spec))
    conf: list[Any] = [tyro.conf.arg(help_behavior_hint=hint, metavar=metavar)]
    if spec.positional:
        conf.append(tyro.conf.Positional)
        if spec.nargs == "+":
            kind = tuple[str, ...]
    if spec.repeat:
        kind = tuple[str, ...]
        conf.append(tyro.conf.UseAppendAction)
    missing = spec.positional and spec.nargs != "?" or spec.required
    default_value = tyro.MISSING_NONPROP if missing else (() if kind == tuple[str, ...] else None)
    name = spec.name if spec.positional else _arg_name(spec.option_string)
    return [StructFieldSpec(name, Annotated[kind, *conf], default_value, text)]


def _registry(command: Any) -> Any:
    """A tyro registry whose rule reads a config dataclass's option fields (and its pieces') as ``command``'s
    config has them (:func:`memtoc.core.options.leaves`)."""
    from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructFieldSpec

    import tyro

    registry = ConstructorRegistry()
    options = {(leaf.owner, leaf.field): leaf.spec for leaf in command_leaves(command)}

    @registry.struct_rule
    def options_of(info: Any) -> Any:
        cls = info.type
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        base = info.default if dataclasses.is_dataclass(info.default) else default_config(cls)
        fields: list[Any] = []
        specs: dict[str, Option] = {}
        for f in dataclasses.fields(cls):
            value = getattr(base, f.name) if base is not None else f.default
            piece = piece_type(cls, f)
            if piece is not None:
                fields.append(StructFieldSpec(f.name, piece, value if isinstance(value, piece) else piece(), None))
                continue
            spec = options.get((cls, f.name))
            if spec is None:
                continue
            for arg in _arg_specs(spec, value):
                specs[arg.name] = spec
                fields.append(arg)

        def typed(**parsed: Any) -> dict[str, Any]:
            # the options given, by flag, and the given options of the pieces
            out: dict[str, Any] = {}
            for name, value in parsed.items():
                if isinstance(value, dict):
                    out.update(value)
                    continue
                spec = specs.get(name)
                if spec is None or value is None or value is False or value == ():
                    continue
                if spec.off_flag:
                    out[spec.option_string] = name == _arg_name(spec.option_string)
                    if all(parsed.get(_arg_name(s)) for s in (spec.option_string, spec.off_flag)):
                        raise _Usage(f"give one of {spec.option_string}, {spec.off_flag}")
                elif spec.positional:
                    out[spec.name] = list(value) if isinstance(value, tuple) else value
                else:
                    key = spec.option_string
                    out[key] = (not value) if spec.negate else (list(value) if spec.repeat else value)
            return out

        if info.default is not None and info.default is not tyro.MISSING_NONPROP:
            typed.__doc__ = (cls.__doc__ or "").split("\n\n")[0]      # a piece's help section says what it is
        return StructConstructorSpec(instantiate=typed, fields=tuple(fields))

    return registry


class _Usage(Exception):
    """A command line the parser refuses (printed as one line, exit status 2)."""


def _near(word: str, flags: Sequence[str]) -> str | None:
    typed = word.split("=")[0]
    prefixed = [f for f in flags if f.startswith(typed)]
    return (prefixed or difflib.get_close_matches(typed, flags, n=1, cutoff=0.6) or [None])[0]


def _one_line(printed: str, argv: Sequence[str], flags: Sequence[str]) -> str:
    """A refused command line as one line: each unknown flag with the nearest known one, else what is missing,
    else tyro's message (``printed``, its box drawing and rules removed)."""
    flags = [*flags, "--help"]
    unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in flags]
    if unknown:
        return "; ".join(f"unknown option {w}" + (f"; did you mean {near}?" if (near := _near(w, flags)) else
                                                  " (--help lists the options)") for w in unknown)
    lines = [" ".join(re.sub(r"[\u2500-\u257f]", " ", raw).split()) for raw in printed.splitlines()]
    lines = [line for line in lines if line and set(line) - set("-= ")]
    missing = [w for line in lines for w in line.split()[:1] if w.startswith("--") or w.isupper()] \
        if any(line.startswith("Missing from") for line in lines) else []
    if missing:
        return "the following arguments are required: " + ", ".join(missing)
    extra = next((line for line in lines if line.startswith("Unrecognized options:")), None)
    if extra is not None:
        rest = extra.split(":", 1)[1].split() or lines[lines.index(extra) + 1].split()
        return f"unexpected argument {rest[0].strip(',')!r}"
    body = [line for line in lines if not line.startswith(("For full helptext", "memtoc "))]
    return " ".join(body[1:] if len(body) > 1 else body) or "invalid command line"     # (the box's title off)


def _parse(command: Any, argv: Sequence[str]) -> dict[str, Any]:
    """The options typed on ``memtoc COMMAND ARGV``, by flag (positionals by name); tyro prints ``--help``."""
    import tyro

    prog = f"memtoc {command.name}"
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), warnings.catch_warnings():
            # an option not typed parses to None (its field's default stays the config's)
            warnings.filterwarnings("ignore", "The field .* but the default value `None`", UserWarning)
            return tyro.cli(command.config_class(), args=list(argv), prog=prog, registry=_registry(command),
                            description=command.description or command.help,
                            config=(tyro.conf.OmitArgPrefixes, tyro.conf.FlagCreatePairsOff))
    except _Usage as exc:
        _usage_error(prog, str(exc))
    except SystemExit as exc:
        if not exc.code:
            raise
        flags = [f for leaf in command_leaves(command) if not leaf.spec.positional
                 for f in (leaf.spec.option_string, leaf.spec.off_flag) if f]
        _usage_error(prog, _one_line(captured.getvalue(), argv, flags))
    raise AssertionError("unreachable")


def _usage_error(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _split(argv: Sequence[str]) -> tuple[Any, list[str]]:
    """(command, its arguments) of a command line; a word naming no command is one line (exit 2)."""
    table = commands()
    words: list[str] = []
    for word in argv:
        if word.startswith("-"):
            break
        words.append(word)
        if " ".join(words) in table:
            return table[" ".join(words)], list(argv[len(words):])
    groups = {name.split()[0] for name in table if " " in name}
    if words and words[0] in groups and len(words) == 1:
        print(top_help(words[0]))
        raise SystemExit(0 if any(a in ("-h", "--help") for a in argv) else 2)
    known = sorted({n.split()[0] for n in table} | set(table))
    typed = " ".join(words) or (argv[0] if argv else "")
    near = difflib.get_close_matches(typed, known, n=1, cutoff=0.6)
    _usage_error("memtoc", f"unknown command {typed!r}" + (f"; did you mean {near[0]!r}?" if near else
                                                           " (memtoc --help lists the commands)"))
    raise AssertionError("unreachable")


def top_help(group: str | None = None) -> str:
    """``memtoc --help`` (or a command group's, ``memtoc lens``): the commands and what each does."""
    from memtoc.jobs.registry import GROUPS

    rows: dict[str, str] = {}       # a group's commands, or the top-level commands and the groups
    for name, command in commands().items():
        first, _, rest = name.partition(" ")
        if group is None:
            rows.setdefault(first, GROUPS.get(first, "") if rest else command.help)
        elif first == group and rest:
            rows[rest] = command.help
    prog = "memtoc" + (f" {group}" if group else "")
    width = max(map(len, rows)) + 2
    lines = [f"usage: {prog} COMMAND [OPTIONS]", "", GROUPS.get(group, "") if group else DESCRIPTION, "",
             "commands:"] + [f"  {n:<{width}}{h}" for n, h in rows.items()]
    return "\n".join(lines)


def parse_options(argv: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """(command, the options typed, by flag; positionals by name) of a command line."""
    command, rest = _split(argv)
    return command, _parse(command, rest)


def parse_config(argv: Sequence[str]) -> tuple[Any, Any]:
    """(command, config) of a command line, nothing run: what ``memtoc ARGV`` would hand its job."""
    command, values = parse_options(argv)
    return command, command.build(values)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command line; a user error is one line on stderr and exit status 2."""
    from memtoc import __version__
    from memtoc.cli.present import present
    from memtoc.core.exits import reported

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(top_help())
        if not argv:
            raise SystemExit(2)
        raise SystemExit(0)
    if argv[0] == "--version":
        print(f"memtoc {__version__}")
        raise SystemExit(0)
    command, values = parse_options(argv)

    def run() -> int:
        cfg = command.build(values)
        return present(command.name, command.run_checked(cfg), cfg)   # the input/output contract first, then the job

    return reported(command.name, run)
