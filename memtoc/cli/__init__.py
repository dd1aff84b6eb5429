"""Adapters: the ``memtoc`` command line. :mod:`memtoc.cli.entry` is the composition root (the job commands of
:mod:`memtoc.cli.commands` plus ``run-experiment``); every command group's parser is a module here."""

from __future__ import annotations

from typing import Sequence


def build_parser():
    from memtoc.cli.entry import build_parser as build

    return build()


def main(argv: Sequence[str] | None = None) -> int:
    from memtoc.cli.entry import main as run

    return run(argv)
