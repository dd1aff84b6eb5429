"""The one input/output contract, walked over every command (issue 37), generated from the job configs.

For each command, each output path and each input path it declares (memtoc.core.paths), the output is pointed at
the input (the same path), inside it (a directory input) and at a directory holding it: every case must end with
exit status 2, one line naming the output's flag, the model loader never reached and the input's bytes
unchanged. A second walk gives every declared input a missing path and a path of the wrong kind; a third every
numeric option a value out of range or of the wrong kind. The cases come from tests/contract_walk.py, which the
Python API's walk (tests/memtoc/api/test_api_contract.py) shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.contract_walk import digest, input_cases, numeric_cases, path_cases, setup_path_case, stand_in_values, wrong_input

from memtoc.cli import main
from memtoc.cli.parse import commands as _cli_commands
from memtoc.cli.parse import command_leaves
from memtoc.core.paths import declared_roles

COMMANDS = tuple(_cli_commands().values())

WALKED: dict[str, int] = {"cases": 0, "commands": 0}


def _command(name: str) -> Any:
    return next(c for c in COMMANDS if c.name == name)


def _argv(command: Any, values: dict[str, str], tmp: Path) -> list[str]:
    """The command line: the given path values, and a stand-in for every other required option."""
    cls = command.config_class()
    full = stand_in_values(cls, values, tmp)
    argv: list[str] = command.name.split()
    for leaf in command_leaves(command):
        if leaf.field not in full:
            continue
        spec, value = leaf.spec, full[leaf.field]
        if spec.positional:
            argv.append(value)
        elif spec.negate or spec.switch:
            argv.append(spec.option_string)
        else:
            argv += [spec.option_string, value]
    return argv


def _shown(command: Any) -> set[str]:
    return {leaf.field for leaf in command_leaves(command)}


def _cases() -> list[tuple[str, str, str, str]]:
    return [(c.name, o, i, case) for c in COMMANDS for o, i, case in path_cases(c.config_class(), _shown(c))]



@pytest.mark.parametrize("name, out_field, in_field, case", _cases())
def test_an_output_on_an_input_is_refused_before_anything(name, out_field, in_field, case, tmp_path, capsys,
                                                          no_model) -> None:
    command = _command(name)
    cls = command.config_class()
    made = setup_path_case(tmp_path, declared_roles(cls), in_field, case)
    if made is None:
        pytest.skip("a file input holds nothing")
    inp, target = made
    before = digest(inp)
    argv = _argv(command, {in_field: str(inp), out_field: str(target)}, tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    flag = next(leaf.spec for leaf in command_leaves(command) if leaf.field == out_field).option_string
    assert rc == 2, (argv, err)
    assert flag in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert digest(inp) == before
    assert not (case == "inside" and (inp / "inner").exists())


def _input_cases() -> list[tuple[str, str, str]]:
    return [(c.name, f, case) for c in COMMANDS for f, case in input_cases(c.config_class(), _shown(c))]


@pytest.mark.parametrize("name, field, case", _input_cases())
def test_a_missing_or_wrong_kind_input_is_refused_before_the_model(name, field, case, tmp_path, capsys,
                                                                   no_model) -> None:
    command = _command(name)
    value = wrong_input(tmp_path, declared_roles(command.config_class())[field], case)
    if value is None:
        pytest.skip("a file or a directory: no wrong kind")
    rc = main(_argv(command, {field: str(value)}, tmp_path))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert str(value) in err or value.name in err, err


WALK = [(c.name, f, v) for c in COMMANDS for f, v in numeric_cases(c.config_class())]


@pytest.mark.parametrize("name, field, value", WALK)
def test_every_numeric_option_out_of_range_or_of_the_wrong_kind_is_refused_before_the_model(
        name, field, value, tmp_path, capsys, no_model) -> None:
    command = _command(name)
    leaf = next(x for x in command_leaves(command) if x.field == field)
    argv = _argv(command, {}, tmp_path) + [leaf.spec.option_string, value]
    try:
        rc = main(argv)
    except SystemExit as exc:                    # the parser's own refusal: one line too
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, err)
    assert leaf.spec.option_string in err, (argv, err)


def test_the_walks_cover_every_command() -> None:
    """The counts the issue's note reports: commands, output/input cases, numeric cases."""
    assert {c[0] for c in _cases()} and len(WALK) > 100
    WALKED.update(commands=len(COMMANDS), cases=len(_cases()) + len(_input_cases()) + len(WALK))
    assert WALKED["cases"] > 300
