"""The command line (memtoc.cli.parse): tyro parses each command's options from its job's config.

No module writes a parser by hand; every command runs its job's ``run_<job>``; a user error is one line (no usage
block), an abbreviated option is refused and an unknown one names the nearest flag.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.cli.parse import command_leaves, commands, parse_options
from memtoc.core.values import build_config

COMMANDS = tuple(commands().values())

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("memtoc", "activations", "probes", "steering")
PARSER_CALLS = ("add_argument", "add_parser", "add_subparsers", "add_argument_group", "add_mutually_exclusive_group")


def parser_calls() -> list[str]:
    """``file:line call`` of every parser-building call in the packages."""
    found = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in PARSER_CALLS):
                    found.append(f"{rel}:{node.lineno} {node.func.attr}")
    return found


def test_no_parser_is_written_by_hand() -> None:
    assert parser_calls() == []


def test_every_command_dispatches_to_its_jobs_run_function() -> None:
    """Each command's words reach it, and its job is a ``run_*`` function below the adapters."""
    from memtoc.cli.parse import _split

    by_name = {c.name: c for c in COMMANDS}
    for name, command in by_name.items():
        assert _split([*name.split(), "--x"]) == (command, ["--x"])
        run = command.runner()
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


def test_the_parsed_options_are_only_what_was_typed() -> None:
    """An option typed at its default value is there, an untyped one is absent; the config builder fills it."""
    from memtoc.jobs.probe import ProbeConfig

    command, values = parse_options(["probe", "--activations", "a.h5", "--label", "c", "--out", "o",
                                     "--folds", "5", "--no-progress"])
    assert values == {"--activations": "a.h5", "--label": "c", "--out": "o", "--folds": "5", "--no-progress": False}
    cfg = command.build(values)
    assert (cfg.folds, cfg.progress, cfg.C) == (5, False, ProbeConfig().C)


def _long_flags(command) -> list[str]:
    return [leaf.spec.option_string for leaf in command_leaves(command)
            if not leaf.spec.positional and len(leaf.spec.option_string) > 5] + ["--help-me"]


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
    from memtoc.tasks.codeexec.protocol import main_settings

    memtoc_paper = {s.name: s.value for s in PROTOCOLS["paper"] if s.fill}
    cases = {"evaluate": (("selection", "intervention", "generation"), memtoc_paper),
             "finetune crossfit": (("selection", "intervention", "generation"), memtoc_paper),
             "codeexec evaluate": (("task", "agent"), main_settings())}
    seen = []
    for command in (c for c in COMMANDS if c.name in cases):
        pieces, paper = cases[command.name]
        cfg = command.config_class()()
        helps = {leaf.field: leaf.spec.help for leaf in command_leaves(command)}     # as --help shows them
        for piece in (getattr(cfg, name) for name in pieces):
            for name in (n for n in paper if getattr(piece, n, "") is None and n != "stop_at_final_line"):
                default = getattr(type(piece)(), name)      # the ordinary default (a switch says its own)
                text = helps[name]
                shown = "none" if default is None else re.escape(str(default))
                assert re.search(rf"default {shown}[;,] --protocol paper:? {re.escape(str(paper[name]))}[,)]",
                                 text), (command.name, name, text)
                seen.append((command.name, name))
    assert len(seen) == 4 + 3 + 8, seen    # evaluate, crossfit (its question set is its own), codeexec evaluate


def test_what_a_config_says_of_its_options_names_options_it_takes() -> None:
    """Every ``OPTIONS_HERE`` key is an option of its config (a typo would silently change nothing)."""
    from memtoc.core.options import leaves

    seen = 0
    for command in COMMANDS:
        cls = command.config_class()
        here = getattr(cls, "OPTIONS_HERE", {})
        assert sorted(set(here) - {leaf.field for leaf in leaves(cls)}) == [], command.name
        seen += len(here)
    assert seen > 30


def test_a_choice_narrowed_for_a_job_is_refused_by_every_door(capsys) -> None:
    """``finetune crossfit`` takes the question sets all and analysis only: the command line and the API say so
    alike (the folds are cut on them)."""
    from memtoc.core.values import ConfigError

    assert main(["finetune", "crossfit", "--out", "x", "--question-set", "fold-A"]) == 2
    assert "--question-set must be one of all, analysis; got 'fold-A'" in capsys.readouterr().err
    cls = commands()["finetune crossfit"].config_class()
    with pytest.raises(ConfigError, match="question_set must be one of all, analysis; got 'fold-A'"):
        build_config(cls, {"question_set": "fold-A"})
    assert build_config(cls, {"question_set": "analysis"}).selection.question_set == "analysis"
