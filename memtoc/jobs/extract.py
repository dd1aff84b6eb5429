"""The extract job: what ``memtoc extract``, ``mt.extract(...)`` and a recipe's ``extract`` step all call."""

from __future__ import annotations

import sys
from typing import Any, Callable

from activations.extract import ExtractConfig, ExtractResult, extract
from memtoc.core.config import ConfigError

__all__ = ["ExtractConfig", "ExtractResult", "run_extract"]


def run_extract(cfg: ExtractConfig, *, backend: Any = None, edit: Any = None,
                log: Callable[[str], None] | None = None) -> ExtractResult:
    """Capture (or resume capturing) the residual stream of ``cfg``'s episodes into the HDF5 store ``cfg.out``.

    ``edit``: the capture reads the untreated model, so an edit object is refused (one line) rather than ignored.
    """
    if edit is not None:
        raise ConfigError("extract reads the untreated model; it takes no edit")
    return extract(cfg, backend=backend, log=log or (lambda s: print(s, file=sys.stderr)))
