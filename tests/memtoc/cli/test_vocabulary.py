"""One command-line vocabulary (``docs/cli.md``): one flag per concept; an old spelling is refused like any unknown
option, in one line naming the nearest option."""

from __future__ import annotations

import argparse

import pytest

from memtoc.cli import build_parser, main
from memtoc.cli.generate import iter_leaves


def _canonical() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Every listed (non-deprecated) flag -> the (command, action) pairs that take it."""
    out: dict[str, list[tuple[str, argparse.Action]]] = {}
    for cmd, leaf in iter_leaves(build_parser()):
        for a in leaf._actions:
            if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:
                continue
            for s in a.option_strings:
                out.setdefault(s, []).append((cmd, a))
    return out


def test_old_spellings_are_no_command_s_own_flag() -> None:
    flags = _canonical()
    for old in ("--output", "--layer", "--position-kind", "--formulation", "--positions", "--run-protocol",
                "--family"):
        assert old not in flags, (old, [c for c, _ in flags.get(old, [])])


def test_protocol_is_the_paper_protocol_wherever_it_is_listed() -> None:
    for cmd, action in _canonical()["--protocol"]:
        assert set(action.choices) == {"none", "paper"}, cmd


def test_one_output_spelling_and_one_field_per_flag() -> None:
    """``--out`` is the only output flag; a flag fills one field name within each command."""
    flags = _canonical()
    assert not [f for f in flags if f.startswith("--output")]
    for flag, uses in flags.items():
        for cmd, action in uses:
            assert flag in action.option_strings and len(action.option_strings) == 1, (cmd, flag)


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


def _required_argv(cmd: str, skip: str) -> list[str]:
    """Placeholder values of a leaf's required options and positionals (parsing only)."""
    leaf = dict(iter_leaves(build_parser()))[cmd]
    out: list[str] = []
    for a in leaf._actions:
        if isinstance(a, argparse._HelpAction) or a.dest == skip:
            continue
        if not a.option_strings and a.nargs not in ("?", "*"):
            out += ["x"] * (a.nargs if isinstance(a.nargs, int) else 1)
        elif a.option_strings and a.required and a.nargs != 0:
            out += [a.option_strings[0], a.choices[0] if a.choices else "x"]
    return out


@pytest.mark.parametrize("cmd,old,near", OLD_SPELLINGS)
def test_an_old_spelling_is_refused_in_one_line_naming_the_nearest_option(cmd, old, near, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*cmd.split(), *_required_argv(cmd, ""), old, "x"])
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
    parser = build_parser()
    new = parser.parse_args(["codeexec", "evaluate", "--out", "o", "--protocol", "paper", "--call-format", "text"])
    assert capsys.readouterr().err == ""
    assert (new.protocol, new.call_format) == ("paper", "text")
    for old in (["--protocol", "text"], ["--protocol", "fancy"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["codeexec", "evaluate", "--out", "o", *old])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--protocol" in err and len(err.strip().splitlines()) == 1


def test_the_family_is_the_command(capsys) -> None:
    """``memtoc codeexec sweep`` is the code-executor sweep; ``sweep`` takes the MemToC sweep's options only (no
    ``--family``)."""
    parser = build_parser()
    common = ["--edit", "e.json", "--strengths", "0,4", "--out", "sw"]
    new = parser.parse_args(["codeexec", "sweep", *common, "--policy", "Verify"])
    assert capsys.readouterr().err == ""
    assert (new.command, new.codeexec_command, new.policy) == ("codeexec", "sweep", "Verify")
    for extra in (["--family", "codeexec"], ["--policy", "Verify"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["sweep", *common, *extra])
        assert f"unknown option {extra[0]}" in capsys.readouterr().err
