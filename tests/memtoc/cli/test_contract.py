"""The one input/output contract, walked over every command (issue 37), generated from the job configs.

For each command, each output path and each input path it declares (memtoc.core.paths), the output is pointed at
the input (the same path), inside it (a directory input) and at a directory holding it: every case must end with
exit status 2, one line naming the output's flag, the model loader never reached and the input's bytes
unchanged. A second walk gives every declared input a missing path and a path of the wrong kind.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from memtoc.cli import main
from memtoc.cli.catalog import COMMANDS
from memtoc.cli.generate import option_leaves
from memtoc.core.paths import HDF5_SIGNATURE, INPUT_ROLES, OUTPUT_ROLES, declared_roles

WALKED: dict[str, int] = {"cases": 0, "commands": 0}


def _make_input(path: Path, role: str) -> Path:
    if role in ("input-run", "input-dir"):
        path.mkdir(parents=True)
        if role == "input-run":                  # a finished run's files (their content is not read first)
            (path / "run.json").write_text("{}", encoding="utf-8")
            (path / "episodes.jsonl").write_text("", encoding="utf-8")
        else:
            (path / "data.txt").write_text("x", encoding="utf-8")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(HDF5_SIGNATURE + b"\0" * 32 if role == "input-store" else b'{"a": 1}\n')
    return path


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*"))
    for p in files:
        h.update(str(p.relative_to(path.parent)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def _dummy(leaf: Any) -> str:
    spec = leaf.spec
    if spec.choices:
        return str(spec.choices[0])
    if spec.parse in (int, float):
        return "1"
    return "x:y" if leaf.field == "contrast" else "x"


def _argv(command: Any, values: dict[str, str], tmp: Path) -> list[str]:
    """The command line: the given path values, and a stand-in for every other required option."""
    cls = command.job().config_class()
    roles = declared_roles(cls)
    argv: list[str] = command.name.split()
    leaves = option_leaves(cls, command.exclude)
    groups_done = {leaf.spec.exclusive for leaf in leaves if leaf.spec.exclusive and leaf.field in values}
    for leaf in leaves:
        spec = leaf.spec
        value = values.get(leaf.field)
        required = spec.required or leaf.field in command.required or (spec.positional and spec.nargs not in ("?",
                                                                                                              "*"))
        if value is None and spec.exclusive and spec.exclusive_required and spec.exclusive not in groups_done:
            groups_done.add(spec.exclusive)
            required = True
        if value is None and not required:
            continue
        if value is None:
            role = roles.get(leaf.field)
            if role in INPUT_ROLES:
                value = str(_make_input(tmp / f"other_{leaf.field}", role))
            elif role in OUTPUT_ROLES:
                value = str(tmp / f"out_{leaf.field}")
            else:
                value = _dummy(leaf)
        if spec.positional:
            argv.append(value)
        elif spec.negate or spec.switch:
            argv.append(spec.option_string)
        else:
            argv += [spec.option_string, value]
    return argv


def _cases() -> list[tuple[str, str, str, str]]:
    out = []
    for command in COMMANDS:
        roles = declared_roles(command.job().config_class())
        shown = {leaf.field for leaf in option_leaves(command.job().config_class(), command.exclude)}
        ins = [f for f, r in roles.items() if r in INPUT_ROLES and f in shown]
        outs = [f for f, r in roles.items() if r in OUTPUT_ROLES and f in shown]
        for o in outs:
            for i in ins:
                for case in ("equal", "inside", "holding"):
                    out.append((command.name, o, i, case))
    return out


@pytest.fixture()
def no_model(monkeypatch):
    import memtoc.backends.factory as factory

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the model loader was reached")

    monkeypatch.setattr(factory, "load_backend", refuse)


@pytest.mark.parametrize("name, out_field, in_field, case", _cases())
def test_an_output_on_an_input_is_refused_before_anything(name, out_field, in_field, case, tmp_path, capsys,
                                                          no_model) -> None:
    command = next(c for c in COMMANDS if c.name == name)
    cls = command.job().config_class()
    roles = declared_roles(cls)
    holder = tmp_path / "holder"
    inp = _make_input(holder / "input", roles[in_field])
    if case == "inside" and not inp.is_dir():
        pytest.skip("a file input holds nothing")
    target = {"equal": inp, "inside": inp / "inner", "holding": holder}[case]
    before = _digest(inp)
    argv = _argv(command, {in_field: str(inp), out_field: str(target)}, tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    flag = next(leaf.spec for leaf in option_leaves(cls) if leaf.field == out_field).option_string
    assert rc == 2, (argv, err)
    assert flag in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert _digest(inp) == before
    assert not (case == "inside" and (inp / "inner").exists())


def _input_cases() -> list[tuple[str, str, str]]:
    out = []
    for command in COMMANDS:
        cls = command.job().config_class()
        shown = {leaf.field for leaf in option_leaves(cls, command.exclude)}
        for f, r in declared_roles(cls).items():
            if r in INPUT_ROLES and f in shown:
                out += [(command.name, f, "missing"), (command.name, f, "wrong kind")]
    return out


@pytest.mark.parametrize("name, field, case", _input_cases())
def test_a_missing_or_wrong_kind_input_is_refused_before_the_model(name, field, case, tmp_path, capsys,
                                                                   no_model) -> None:
    command = next(c for c in COMMANDS if c.name == name)
    role = declared_roles(command.job().config_class())[field]
    if case == "missing":
        value = tmp_path / "nowhere" / "missing"
    elif role == "input-path":
        pytest.skip("a file or a directory: no wrong kind")
    elif role in ("input-run", "input-dir"):
        value = _make_input(tmp_path / "a_file.json", "input")
    else:
        value = _make_input(tmp_path / "a_dir", "input-dir")
    rc = main(_argv(command, {field: str(value)}, tmp_path))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert str(value) in err or value.name in err, err


def _numeric_cases() -> list[tuple[str, str, str]]:
    out = []
    for command in COMMANDS:
        for leaf in option_leaves(command.job().config_class(), command.exclude):
            spec = leaf.spec
            if spec.parse not in (int, float) or spec.positional:
                continue
            values = ["abc"]
            if spec.parse is float:
                values.append("nan")
            if spec.low is not None:
                values.append(str(spec.low if spec.above else spec.low - 1))
            if spec.high is not None:
                values.append(str(int(spec.high * 10)) if spec.parse is int else str(spec.high * 10))
            out += [(command.name, leaf.field, v) for v in values]
    return out


WALK = _numeric_cases()


@pytest.mark.parametrize("name, field, value", WALK)
def test_every_numeric_option_out_of_range_or_of_the_wrong_kind_is_refused_before_the_model(
        name, field, value, tmp_path, capsys, no_model) -> None:
    command = next(c for c in COMMANDS if c.name == name)
    leaf = next(x for x in option_leaves(command.job().config_class()) if x.field == field)
    argv = _argv(command, {}, tmp_path) + [leaf.spec.option_string, value]
    try:
        rc = main(argv)
    except SystemExit as exc:                    # argparse's own type check: one line too
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, err)
    assert leaf.spec.option_string in err, (argv, err)


def test_the_walks_cover_every_command() -> None:
    """The counts the issue's note reports: commands, output/input cases, numeric cases."""
    assert {c[0] for c in _cases()} and len(WALK) > 100
    WALKED.update(commands=len(COMMANDS), cases=len(_cases()) + len(_input_cases()) + len(WALK))
    assert WALKED["cases"] > 300
