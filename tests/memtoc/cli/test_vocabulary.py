"""One command-line vocabulary (``memtoc.cli.vocabulary``): one flag per concept, old spellings as deprecated
aliases that parse into the same field with a warning, and ``docs/cli.md`` listing exactly those aliases."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from memtoc.cli import build_parser, main
from memtoc.cli.vocabulary import DEPRECATED, _Alias, iter_leaves

DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def _canonical() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Every listed (non-deprecated) flag -> the (command, action) pairs that take it."""
    out: dict[str, list[tuple[str, argparse.Action]]] = {}
    for cmd, leaf in iter_leaves(build_parser()):
        for a in leaf._actions:
            if isinstance(a, (argparse._HelpAction, _Alias)) or a.help == argparse.SUPPRESS:
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
        own = getattr(action, "own", action)       # codeexec evaluate also reads the old tool-call values
        assert set(own.choices) == {"none", "paper"}, cmd


def test_one_output_spelling_and_one_field_per_flag() -> None:
    """``--out`` is the only output flag; a flag fills one field name within each command."""
    flags = _canonical()
    assert not [f for f in flags if f.startswith("--output")]
    for flag, uses in flags.items():
        for cmd, action in uses:
            assert flag in action.option_strings and len(action.option_strings) == 1, (cmd, flag)


def test_docs_table_lists_every_deprecated_spelling() -> None:
    text = DOC.read_text(encoding="utf-8").split("## Old spellings", 1)[1]
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))] for line in text.splitlines()
            if line.startswith("| `")]
    documented = set()
    for old, new, commands in rows:
        if old.startswith("`sweep --family"):
            continue
        old_flag = re.match(r"`(--[a-z-]+)", old).group(1)
        for cmd in commands.split(", "):
            documented.add((old_flag, new.strip("`"), cmd))
    declared = {(r.old, r.new, c) for r in DEPRECATED for c in r.commands}
    assert documented == declared


def test_an_old_required_spelling_still_satisfies_the_requirement(tmp_path, capsys) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["score", "--input", str(rows)])
    assert exc.value.code == 2 and "required: --out" in capsys.readouterr().err
    assert main(["score", "--input", str(rows), "--output", str(tmp_path / "o.jsonl")]) == 2   # no records
    err = capsys.readouterr().err
    assert "--output is deprecated" in err and "use --out" in err and "no records" in err


def test_codeexec_protocol_takes_the_paper_protocol_and_the_old_tool_formats(capsys) -> None:
    parser = build_parser()
    new = parser.parse_args(["codeexec", "evaluate", "--out", "o", "--protocol", "paper", "--call-format", "text"])
    assert capsys.readouterr().err == ""
    old = parser.parse_args(["codeexec", "evaluate", "--out", "o", "--run-protocol", "paper", "--protocol", "text"])
    err = capsys.readouterr().err
    assert vars(old) == vars(new)
    assert "--run-protocol is deprecated" in err and "--protocol text is deprecated" in err
    assert "use --call-format text" in err
    with pytest.raises(SystemExit):
        parser.parse_args(["codeexec", "evaluate", "--out", "o", "--protocol", "fancy"])


def test_the_family_is_the_command(capsys) -> None:
    """``sweep --family codeexec`` is ``codeexec sweep`` (rewritten before parsing, with one warning); ``sweep``
    takes the MemToC sweep's options only."""
    parser = build_parser()
    common = ["--edit", "e.json", "--strengths", "0,4", "--out", "sw"]
    new = parser.parse_args(["codeexec", "sweep", *common, "--policy", "Verify"])
    assert capsys.readouterr().err == ""
    old = parser.parse_args(["sweep", "--family", "codeexec", *common, "--policy", "Verify"])
    err = capsys.readouterr().err
    assert err.count("deprecated") == 1 and "use memtoc codeexec sweep" in err
    assert (old.command, old.codeexec_command, old.policy) == ("codeexec", "sweep", "Verify")
    assert {k: v for k, v in vars(new).items() if k != "func"} == {k: v for k, v in vars(old).items() if k != "func"}
    same = parser.parse_args(["sweep", "--family=memtoc", *common])
    assert same.command == "sweep" and not hasattr(same, "family") and capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        parser.parse_args(["sweep", *common, "--policy", "Verify"])   # a code-executor option: not the MemToC sweep's
    assert "unknown option --policy" in capsys.readouterr().err
