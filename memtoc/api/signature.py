"""The Python API's signatures, generated from the job configs.

An API function declares its own few parameters and ``**options``; :func:`finalize` gives it ``__signature__``:
those parameters, then every option of its config by public name with the config's default and the field's type,
which ``help()`` and notebooks' completion show. Made on first use, so ``mt.compare`` never imports torch.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, Sequence

__all__ = ["api_function", "finalize", "public_options"]

_CONFIG = "__memtoc_config__"
_EXCLUDE = "__memtoc_exclude__"


def api_function(config: str, *, exclude: Sequence[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark ``fn`` as the API of the job whose config is ``config`` (``module:Class``); ``exclude`` names options
    the function does not take under their own names (``load_episodes`` writes no ``out``; ``judge`` takes its
    run directory as its first argument)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _CONFIG, config)
        setattr(fn, _EXCLUDE, tuple(exclude))
        return fn

    return mark


def config_class(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def public_options(cls: type, exclude: Sequence[str] = ()) -> list[tuple[str, Any, Any]]:
    """``(public name, default, type)`` of every option of config ``cls``, in declaration order."""
    from memtoc.core.options import option_leaves, type_hints

    out = []
    for leaf in option_leaves(cls, exclude):
        if leaf.spec.public in exclude:
            continue
        out.append((leaf.spec.public, leaf.default, type_hints(leaf.owner).get(leaf.field, Any)))  # unresolvable: Any
    return out


def finalize(fn: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """``fn`` with its generated ``__signature__`` (idempotent)."""
    if "__signature__" in fn.__dict__:
        return fn
    own = inspect.signature(fn)
    params = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in params}
    cls = config_class(getattr(fn, _CONFIG))
    for public, default, hint in public_options(cls, getattr(fn, _EXCLUDE)):
        if public in taken:
            continue
        taken.add(public)
        params.append(inspect.Parameter(public, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
    signature = own.replace(parameters=_ordered(params))

    @functools.wraps(fn)
    def job(*args: Any, **kwargs: Any) -> Any:
        from memtoc.core.exits import input_errors

        with input_errors():        # an input that does not decode: one MemtocError, as on the command line
            return fn(*args, **kwargs)

    job.__signature__ = signature  # type: ignore[attr-defined]
    if name:
        job.__name__ = job.__qualname__ = name
    return job


def _ordered(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """Positional parameters first, then keywords (a signature must keep that order)."""
    return sorted(params, key=lambda p: p.kind)

