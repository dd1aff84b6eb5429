"""Adapters: the ``memtoc`` command line. Each subcommand is a job of :mod:`memtoc.jobs.catalog` whose options tyro
parses from the job's config (:mod:`memtoc.cli.parse`); :mod:`memtoc.cli.present` says how each result is shown.
Nothing below this package imports it."""

from memtoc.cli.parse import main

__all__ = ["main"]
