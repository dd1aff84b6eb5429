"""``kind: "function"``: a Python callable ``fn(site, hidden, positions) -> hidden`` edits the residual stream.

The notebook researcher's edit, through the same hooks, position plan and scorer as every other kind. The
callable gets the ``site``, the edited positions' ``hidden`` states of one forward chunk (a ``[n, d_model]``
copy) and their :class:`Positions` (batch ``rows`` and chunk ``cols``), and returns their new ``[n, d_model]``
states. ``strength`` scales the change: ``h + strength * (fn(h) - h)``; strength 0 installs no hook.

Spec fields: ``function`` (the callable's qualified name) and ``function_sha256`` (of its source text,
:func:`function_source_sha256`), which enters the run identity. That is weaker provenance than a spec file (it
does not cover closed-over values or globals), and a ``function`` spec cannot be loaded from a file.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from steering.edits import Edit
from memtoc.backends.plans import Applier, EditRows, RowApplier
from steering.registry import register_edit_kind
from steering.spec import DIRECTIONS, SCHEMA_VERSION, EditSpecError, SpecChecker


@dataclass(frozen=True)
class Positions:
    """Where a callable edit acts in one forward chunk: ``hidden_full[rows, cols]`` are its ``hidden`` rows."""

    rows: torch.Tensor
    cols: torch.Tensor


#: ``fn(site, hidden [n, d], positions) -> hidden' [n, d]``
EditFunction = Callable[[int, torch.Tensor, Positions], torch.Tensor]


def function_source(fn: Callable[..., Any]) -> str:
    """The source text of ``fn`` (of its class for a callable object), dedented; refused when Python has none."""
    target = fn
    while hasattr(target, "func") and not inspect.isfunction(target):   # functools.partial
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)) and callable(target):
        target = type(target)
    try:
        return textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError) as exc:
        raise EditSpecError(f"cannot read the source of {fn!r} ({exc}); a function edit's run identity is the hash of "
                            "its source: define it in a file or a notebook cell", field="function") from None


def function_source_sha256(fn: Callable[..., Any]) -> str:
    """sha256 of :func:`function_source` (the ``function_sha256`` spec field)."""
    return hashlib.sha256(function_source(fn).encode("utf-8")).hexdigest()


def _qualname(fn: Callable[..., Any]) -> str:
    target = getattr(fn, "func", fn)
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{getattr(target, '__module__', None) or '?'}.{name}"


@register_edit_kind("function")
class FunctionEdit(Edit):
    """``h[pos] = h + strength * (fn(site, h, positions) - h)`` at every site of ``layers``."""

    own_fields = ("function", "function_sha256")
    #: the callable sees chunk columns (documented above), which a shared-prefix prefill would shift
    prefix_sharing = False

    def __init__(self, spec: Mapping[str, Any], *, fn: EditFunction | None = None, base_dir: Any = None,
                 source: Any = None) -> None:
        if fn is None:
            raise EditSpecError("a 'function' edit is built from a Python callable (memtoc.function_edit); it cannot "
                                "be loaded from a spec file", path=source, field="function")
        super().__init__(spec, base_dir=base_dir, source=source)
        if self._spec["function_sha256"] != function_source_sha256(fn):
            raise EditSpecError("the callable's source does not match function_sha256", path=source,
                                field="function_sha256")
        self.fn = fn

    @classmethod
    def validate_fields(cls, c: SpecChecker, spec: dict[str, Any], layers: list[int]) -> None:
        if not isinstance(spec.get("function"), str) or not spec["function"].strip():
            c.fail("function", "must be the callable's name (a non-empty string)")
        sha = spec.get("function_sha256")
        if not isinstance(sha, str) or len(sha) != 64:
            c.fail("function_sha256", "must be the hex sha256 of the callable's source")
        toward = spec.get("toward")
        if toward is not None and toward not in DIRECTIONS:
            c.fail("toward", f"must be one of {', '.join(DIRECTIONS)} or absent, got {toward!r}")

    @classmethod
    def build(cls, fn: EditFunction, *, layers: Sequence[int], positions: str = "last_input",
              strength: float = 1.0, name: str | None = None, toward: str | None = None,
              apply_to_closed_book: bool = False) -> "FunctionEdit":
        """The edit of ``fn`` at ``layers``; its spec records the callable's name and source hash."""
        spec = {"schema_version": SCHEMA_VERSION, "name": name or getattr(fn, "__name__", "function"),
                "kind": "function", "layers": [int(s) for s in layers], "positions": positions,
                "strength": float(strength), "apply_to_closed_book": apply_to_closed_book,
                "function": _qualname(fn), "function_sha256": function_source_sha256(fn)}
        if toward is not None:
            spec["toward"] = toward
        return cls(spec, fn=fn)

    @property
    def toward(self) -> str | None:
        return self._spec.get("toward")

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        if self.strength == 0.0:
            return {}                     # strength 0 leaves the stream untouched: no hook at all
        return super().appliers(model)

    def row_appliers(self, width: int, device: torch.device, dtype: torch.dtype) -> dict[int, RowApplier]:
        fn = self.fn

        def make(site: int) -> RowApplier:
            def apply(old: torch.Tensor, where: EditRows) -> torch.Tensor:
                new = fn(site, old.clone(), Positions(rows=where.rows, cols=where.cols))
                if not isinstance(new, torch.Tensor) or tuple(new.shape) != tuple(old.shape):
                    got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                    raise EditSpecError(f"{self._spec['function']} returned {got} for hidden of shape "
                                        f"{tuple(old.shape)} at site {site}; it must return the same shape",
                                        field="function")
                new = new.to(old.dtype)
                if where.scalar is not None:
                    return new if where.scalar == 1.0 else old + where.scalar * (new - old)
                s = where.strength.to(torch.float32)[:, None]
                return torch.where(s == 1.0, new, (old.float() + s * (new - old).float()).to(old.dtype))
            return apply
        return {s: make(s) for s in self.layers}
