"""The ``memtoc`` command: the job commands (:mod:`memtoc.cli.commands`, :mod:`memtoc.cli.catalog`), ``run-experiment``
(which runs recipes of them) among them. The composition root: nothing below imports it."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from memtoc.cli.commands import build_job_parser, run_command


def build_parser() -> argparse.ArgumentParser:
    return build_job_parser()


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
