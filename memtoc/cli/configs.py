"""Job configs from parsed options (the command line's side of the job layer, :mod:`memtoc.jobs`)."""

from __future__ import annotations

import argparse
from typing import Any


def plain_config(cls: type, args: argparse.Namespace) -> Any:
    """A plain job config (``memtoc.jobs.*Config``) from the parsed options of the same names (``progress`` from
    ``--no-progress``); the options present are recorded as given."""
    import dataclasses

    from memtoc.core.values import mark_given

    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    if "progress" in {f.name for f in dataclasses.fields(cls)} and hasattr(args, "no_progress"):
        kw["progress"] = not args.no_progress
    return mark_given(cls(**kw), kw)
