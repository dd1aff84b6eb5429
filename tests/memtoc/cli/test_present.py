"""Every command shows its result through one registered presenter."""

from __future__ import annotations

import memtoc.jobs.catalog  # noqa: F401 - fills the job table
from memtoc.cli.parse import commands
from memtoc.cli.present import PRESENTERS, present
from memtoc.jobs.registry import JOBS

COMMANDS = tuple(commands().values())


def test_every_command_has_a_presenter_and_no_presenter_names_an_unknown_command() -> None:
    names = {c.name for c in COMMANDS}
    assert names == set(JOBS) | {"run-experiment"}
    order = [c.name for c in COMMANDS]          # memtoc --help lists them in the job table's order
    assert [n for n in order if n != "run-experiment"] == list(JOBS)
    assert order[order.index("run-experiment") + 1] == "merge"
    assert sorted(names - set(PRESENTERS)) == []
    assert sorted(set(PRESENTERS) - names) == []


def test_a_presenter_returns_the_exit_status_the_command_exits_with(capsys) -> None:
    from types import SimpleNamespace

    command = next(c for c in COMMANDS if c.name == "merge-activations")
    res = SimpleNamespace(out="x.h5", n_episodes=2, n_rows=6, n_sources=2, n_duplicates=0, complete=False)
    assert present(command.name, res, None) == 1
    assert "INCOMPLETE" in capsys.readouterr().out
