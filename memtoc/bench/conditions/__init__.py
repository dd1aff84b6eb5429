"""The benchmark's conditions: one :class:`Condition` object each, in one registry (``base``).

The built-ins register first, in this order: the release's five and the far arm (``release``), then the control
arms (``controls``). Every other module of this package is imported after them, in name order, and registers its
own conditions, so a new condition is one new module here (docs/extending.md, "Adding a condition").
"""

from __future__ import annotations

import importlib
import pkgutil

from memtoc.bench.conditions.base import (
    Condition,
    Payload,
    condition_names,
    condition_set,
    get_condition,
    metrics_of,
    recorded_conditions,
    register_condition,
    selection_identity,
    set_default,
    tool_correct,
    unregister_condition,
)
from memtoc.bench.conditions import release, controls  # noqa: E402,F401  (built-ins first, in this order)

__all__ = ["Condition", "Payload", "condition_names", "condition_set", "discover", "get_condition", "metrics_of",
           "recorded_conditions", "register_condition", "selection_identity", "set_default", "tool_correct",
           "unregister_condition"]

_BUILTIN = ("base", "release", "controls")


def discover() -> tuple[str, ...]:
    """Import every module of this package that is not a built-in (and not ``_private``), in name order; each one
    registers its conditions on import. Returns the modules' names. Runs when the package is imported."""
    found = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                         if m.name not in _BUILTIN and not m.name.startswith("_")))
    for name in found:
        importlib.import_module(f"{__name__}.{name}")
    return found


discover()
