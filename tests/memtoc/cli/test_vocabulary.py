"""One command-line vocabulary (``docs/cli.md``): one flag per concept; an old spelling is refused like any unknown
option, in one line naming the nearest option."""

from __future__ import annotations

from typing import Any

import pytest

from memtoc.cli import main
from memtoc.cli.parse import commands
from memtoc.cli.parse import command_leaves, parse_config, parse_options

COMMANDS = tuple(commands().values())


def _canonical() -> dict[str, list[tuple[str, Any]]]:
    """Every flag -> the (command, leaf) pairs that take it."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for command in COMMANDS:
        for leaf in command_leaves(command):
            if not leaf.spec.positional:
                for flag in filter(None, (leaf.spec.option_string, leaf.spec.off_flag)):
                    out.setdefault(flag, []).append((command.name, leaf))
    return out


def test_old_spellings_are_no_command_s_own_flag() -> None:
    flags = _canonical()
    for old in ("--output", "--layer", "--position-kind", "--formulation", "--positions", "--run-protocol",
                "--family"):
        assert old not in flags, (old, [c for c, _ in flags.get(old, [])])


def test_protocol_is_the_paper_protocol_wherever_it_is_listed() -> None:
    for cmd, leaf in _canonical()["--protocol"]:
        assert set(leaf.spec.choices) == {"none", "paper"}, cmd


def test_one_output_spelling_and_one_field_per_flag() -> None:
    """``--out`` is the only output flag; a flag fills one field within each command."""
    flags = _canonical()
    assert not [f for f in flags if f.startswith("--output")]
    for flag, uses in flags.items():
        cmds = [cmd for cmd, _ in uses]
        assert len(cmds) == len(set(cmds)), (flag, cmds)


#: (command, old spelling, the option the error names) of every renamed flag (version 0.1.0 keeps none)
OLD_SPELLINGS = [
    *[(c, "--output", "--out") for c in ("score", "metrics", "episodes", "compare", "sae fvu", "judge", "ack car",
                                         "ack import", "outcome-round import")],
    *[(c, "--layer", "--score-layer") for c in ("metrics", "compare", "sweep", "study", "ack export",
                                                 "outcome-round export")],
    *[(c, "--position-kind", "--position-kinds") for c in ("probe", "mine-features", "direction")],
    ("episodes", "--formulation", "--formulations"),
    ("codeexec evaluate", "--run-protocol", "--protocol"),
    ("agent evaluate", "--protocol", None),
    ("study", "--family", None),
]


def _required_argv(cmd: str) -> list[str]:
    """Placeholder values of a command's required options and positionals (parsing only)."""
    command = next(c for c in COMMANDS if c.name == cmd)
    out: list[str] = []
    for leaf in command_leaves(command):
        spec = leaf.spec
        if spec.positional and spec.nargs != "?":
            out.append("x")
        elif spec.required:
            out += [spec.option_string, spec.choices[0] if spec.choices else "x"]
    return out


@pytest.mark.parametrize("cmd,old,near", OLD_SPELLINGS)
def test_an_old_spelling_is_refused_in_one_line_naming_the_nearest_option(cmd, old, near, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_options([*cmd.split(), *_required_argv(cmd), old, "x"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"unknown option {old}" in err and "deprecated" not in err
    if near is not None:
        assert f"did you mean {near}?" in err, err


def test_an_old_required_spelling_no_longer_satisfies_the_requirement(tmp_path, capsys) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["score", "--input", str(rows)])
    assert exc.value.code == 2 and "required: --out" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["score", "--input", str(rows), "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "unknown option --output; did you mean --out?" in err
    assert not (tmp_path / "o.jsonl").exists()


def test_codeexec_protocol_is_the_paper_protocol_only(capsys) -> None:
    _, new = parse_config(["codeexec", "evaluate", "--out", "o", "--protocol", "paper", "--call-format", "text"])
    assert capsys.readouterr().err == ""
    assert (new.protocol, new.agent.call_format) == ("paper", "text")
    for old in (["--protocol", "text"], ["--protocol", "fancy"]):
        assert main(["codeexec", "evaluate", "--out", "o", *old]) == 2
        err = capsys.readouterr().err
        assert "--protocol" in err and len(err.strip().splitlines()) == 1


def test_the_family_is_the_command(capsys) -> None:
    """``memtoc codeexec sweep`` is the code-executor sweep; ``sweep`` takes the MemToC sweep's options only (no
    ``--family``)."""
    common = ["--edit", "e.json", "--strengths", "0,4", "--out", "sw"]
    command, new = parse_config(["codeexec", "sweep", *common, "--policy", "Verify"])
    assert capsys.readouterr().err == ""
    assert (command.name, new.task.policy) == ("codeexec sweep", "Verify")
    for extra in (["--family", "codeexec"], ["--policy", "Verify"]):
        with pytest.raises(SystemExit):
            parse_options(["sweep", *common, *extra])
        assert f"unknown option {extra[0]}" in capsys.readouterr().err
