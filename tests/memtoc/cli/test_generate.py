"""The generated command line (memtoc.cli.generate): one description per option, one builder, one dispatch.

Every parser is generated from its job's config, so no module but the generator writes an ``add_argument``; every
command runs its job's ``run_<job>`` through the one dispatch; a user error is one line (no usage block), an
abbreviated option is refused and an unknown one names the nearest flag.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from memtoc.cli import build_parser, main
from memtoc.cli.catalog import COMMANDS
from memtoc.cli.generate import iter_leaves

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("memtoc", "activations", "probes", "steering")
PARSER_CALLS = ("add_argument", "add_parser", "add_subparsers", "add_argument_group", "add_mutually_exclusive_group")


def parser_calls_outside_generator() -> list[str]:
    """``file:line call`` of every parser-building call outside the generator."""
    allowed = {"memtoc/cli/generate.py"}
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in PARSER_CALLS):
                    found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def test_no_parser_is_written_by_hand() -> None:
    assert parser_calls_outside_generator() == []


def test_every_command_dispatches_to_its_jobs_run_function() -> None:
    """Each leaf of the parser is a generated command whose job is a ``run_*`` function below the adapters."""
    by_name = {c.name: c for c in COMMANDS}
    leaves = dict(iter_leaves(build_parser()))
    assert set(leaves) == set(by_name)
    for name, command in by_name.items():
        run = command.job().runner()
        assert run.__name__.startswith("run_"), (name, run.__name__)
        # run-experiment's run is the command line's wrapper of the recipe runner's job (it lends the runner the
        # command table's presenters and exclusions); every other command runs its job's function
        allowed = ("memtoc.jobs.", "memtoc.recipes.") + (("memtoc.cli.recipes",) if name == "run-experiment" else ())
        assert run.__module__.startswith(allowed), (name, run.__module__)


def test_option_types_come_from_the_config_annotations() -> None:
    """No option of a generated API signature is typed ``Any``."""
    import memtoc as mt
    from memtoc.api.jobs import _GENERATED

    untyped = []
    for name in _GENERATED:
        for p in inspect.signature(getattr(mt, name)).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.annotation in (typing.Any, "Any", inspect._empty):
                untyped.append(f"{name}({p.name})")
    assert untyped == []


@pytest.mark.parametrize("argv, expect", [
    (["probe", "--activations", "a.h5", "--label", "condition", "--out", "p", "--posit", "x"],
     "unknown option --posit; did you mean --positive?"),
    (["probe", "--activations", "a.h5", "--label", "condition", "--output", "p"],
     "unknown option --output; did you mean --out?"),
    (["probe", "--activ", "a.h5", "--label", "condition", "--out", "p"],
     "unknown option --activ; did you mean --activations?"),
])
def test_a_user_error_is_one_line_and_abbreviations_are_refused(argv, expect, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "usage:" not in err
    assert expect in err


def test_the_parsed_namespace_holds_only_what_was_typed() -> None:
    """An option typed at its default value is in the namespace, an untyped one is absent (the config's default
    fills it)."""
    from memtoc.cli.generate import config_from_namespace
    from memtoc.jobs.probe import ProbeConfig

    args = build_parser().parse_args(["probe", "--activations", "a.h5", "--label", "c", "--out", "o",
                                      "--folds", "5", "--no-progress"])
    assert set(vars(args)) - {"command", "func", "memtoc_command"} == {"activations", "label", "out", "folds",
                                                                       "no_progress"}
    cfg = config_from_namespace(ProbeConfig, args)
    assert (cfg.folds, cfg.progress, cfg.C) == (5, False, ProbeConfig().C)


def _long_flags(command) -> list[str]:
    from memtoc.cli.generate import option_leaves

    cls = command.job().config_class()
    return [leaf.spec.option_string for leaf in option_leaves(cls, command.job().exclude)
            if not leaf.spec.positional and not leaf.spec.hidden and len(leaf.spec.option_string) > 5] + ["--help-me"]


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_every_command_refuses_an_abbreviation_and_names_the_nearest_option(name, capsys) -> None:
    """Prefix abbreviation is off everywhere (``extract --positions`` once ran as ``--position-kinds``): the
    abbreviated flag is an unknown option, answered in one line with the flag it abbreviates."""
    command = next(c for c in COMMANDS if c.name == name)
    flag = _long_flags(command)[0]
    short = flag[:-2]
    with pytest.raises(SystemExit) as exc:
        main([*name.split(), short, "1"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "usage:" not in err
    assert f"unknown option {short}; did you mean" in err, err


def test_a_protocol_filled_option_says_its_default_and_the_papers_value() -> None:
    """Such an option defaults to None in its job's config (not given), so the generator shows no default: its help
    says the ordinary default (the piece's) and the value ``--protocol paper`` gives it, as the code has them."""
    import re

    from memtoc.bench.protocol import PROTOCOLS
    from memtoc.core.options import OPTIONS
    from memtoc.tasks.codeexec.protocol import main_settings

    memtoc_paper = {s.name: s.value for s in PROTOCOLS["paper"] if s.fill}
    cases = {"evaluate": (("selection", "intervention", "generation"), memtoc_paper),
             "finetune crossfit": (("selection", "intervention", "generation"), memtoc_paper),
             "codeexec evaluate": (("task", "agent"), main_settings())}
    seen = []
    for command in (c for c in COMMANDS if c.name in cases):
        pieces, paper = cases[command.name]
        cfg = command.job().config_class()()
        for piece in (getattr(cfg, name) for name in pieces):
            for name in (n for n in paper if getattr(piece, n, "") is None and n != "stop_at_final_line"):
                default = getattr(type(piece)(), name)      # the ordinary default (a switch says its own)
                text = command.helps.get(name) or OPTIONS[name].help
                shown = "none" if default is None else re.escape(str(default))
                assert re.search(rf"default {shown}[;,] --protocol paper:? {re.escape(str(paper[name]))}[,)]",
                                 text), (command.name, name, text)
                seen.append((command.name, name))
    assert len(seen) == 4 + 3 + 8, seen    # evaluate, crossfit (its question set is its own), codeexec evaluate
