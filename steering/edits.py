"""Edits: what an edit does to the residual stream, bound to a batch; the backend applies it.

An :class:`Edit` is built from a validated spec (``steering.spec``). ``edit.bind(prompts, tool_spans)`` gives a
:class:`BoundEdit` for one batch of user prompts (tool spans: character spans of the tool output, None for rows
without one; ``strengths=``: one per row, so several strengths share a pass). ``make_plan(backend, batch)`` lays
the batch out (``activations.positions``) into an ``memtoc.backends.plans.EditPlan``, which ``Backend.generate`` /
``forward`` run through ``intervene``. Each kind is a subclass of :class:`Edit` in ``steering/kinds/``, registered
with ``steering.registry.register_edit_kind``: its spec checks (``validate_fields``, ``check_files``),
``row_appliers(width, device, dtype)`` (``memtoc.backends.plans.RowApplier``), ``steer`` and ``toward``
(``docs/extending.md``).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from activations.positions import layout_backend_batch
from memtoc.backends.hf_plans import column_applier, model_device_dtype, model_width
from memtoc.backends.plans import Applier, EditPlan, PositionPlan, RowApplier
from steering.registry import edit_kind
from steering.spec import DIRECTIONS, EditSpecError, SpecChecker, load_spec, save_spec, validate_spec


class Edit:
    """Base class of every edit kind: a validated spec plus whatever the kind needs (vectors, SAEs), shared
    between copies. A kind subclasses it and registers with ``@register_edit_kind("name")``."""

    #: set by ``register_edit_kind``
    kind = ""
    #: spec fields only this kind may carry (another kind's spec naming one is refused, naming this kind)
    own_fields: tuple[str, ...] = ()
    #: the decoder may prefill the tokens before the first edited one once for the whole batch (the appliers
    #: then see the prompt pass as a chunk that starts after that prefix)
    prefix_sharing: bool = True

    # -- the kind's part of the spec ---------------------------------------------------------------------------
    @classmethod
    def validate_fields(cls, c: SpecChecker, spec: dict[str, Any], layers: list[int]) -> None:
        """Check and normalise (in place) this kind's fields of ``spec``; fail with ``c.fail(field, message)``.

        Called by ``steering.spec.validate_spec`` after the common fields passed (``layers`` sorted)."""
        raise NotImplementedError

    @classmethod
    def check_files(cls, spec: Mapping[str, Any], *, path: str | Path | None, base_dir: Path | None) -> None:
        """Check the files the spec names (relative to ``base_dir``) without loading a model; default: none."""

    @property
    def toward(self) -> str | None:
        """The behaviour (memory | tool) a positive strength pushes toward, or None when the kind has no side.

        Sweeps and reports read this instead of kind-specific spec keys."""
        return None

    def __init__(self, spec: Mapping[str, Any], *, base_dir: str | Path | None = None,
                 source: str | Path | None = None) -> None:
        self._spec = validate_spec(spec, path=source)
        if self._spec["kind"] != self.kind:
            raise EditSpecError(f"a {type(self).__name__} needs kind {self.kind!r}", path=source, field="kind")
        self.base_dir = None if base_dir is None else Path(base_dir)
        self.source = None if source is None else str(source)

    # -- spec ------------------------------------------------------------------------------------------------
    @property
    def spec(self) -> dict[str, Any]:
        """The normalised spec (a copy): JSON-able, its sha256 enters the run identity."""
        return copy.deepcopy(self._spec)

    @property
    def name(self) -> str:
        return self._spec["name"]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self._spec["layers"])

    @property
    def positions(self) -> str:
        return self._spec["positions"]

    @property
    def strength(self) -> float:
        return float(self._spec["strength"])

    @property
    def apply_to_closed_book(self) -> bool:
        return bool(self._spec.get("apply_to_closed_book", False))

    def _copy_with(self, **changes: Any) -> "Edit":
        new = copy.copy(self)                      # shares loaded vectors / SAEs
        spec = copy.deepcopy(self._spec)
        spec.update(changes)
        new._spec = validate_spec(spec, path=self.source)
        return new

    def with_strength(self, strength: float) -> "Edit":
        """A copy with another strength (everything else, loaded tensors included, shared)."""
        return self._copy_with(strength=float(strength))

    def steer(self, direction: str, magnitude: float) -> "Edit":
        """A copy that pushes toward ``direction`` (memory | tool) with strength ``magnitude`` (>= 0).

        Default: the sign of the strength says the side (``+`` = ``self.toward``); a kind without a side
        (``toward`` None) cannot be steered, and a kind whose other side is not a negative strength overrides this.
        """
        if direction not in DIRECTIONS:
            raise EditSpecError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                                field="direction")
        if self.toward is None:
            raise EditSpecError(f"a {self.kind!r} edit has no memory/tool side to steer toward (its 'toward' is "
                                "empty; a direction spec gets one from memtoc direction --toward memory|tool)",
                                path=self.source, field="direction")
        sign = 1.0 if direction == self.toward else -1.0
        return self.with_strength(sign * float(magnitude) if magnitude else 0.0)

    def save(self, path: str | Path) -> Path:
        return save_spec(path, self._spec)

    # -- application -------------------------------------------------------------------------------------------
    def bind(self, prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None = None,
             strengths: Sequence[float] | None = None) -> "BoundEdit":
        """This edit bound to a batch of user prompts; ``strengths``: one per prompt instead of ``self.strength``
        (strengths as rows: hf through per-row column hooks, token-row backends per request)."""
        return BoundEdit(self, prompts, tool_spans, strengths)

    def row_appliers(self, width: int, device: torch.device, dtype: torch.dtype) -> dict[int, RowApplier]:
        """Site -> ``fn(x [k, d], where: EditRows) -> x'`` for a model of residual width ``width`` (tensors on
        ``device`` in ``dtype``); the strength of each row is ``where.strength``."""
        raise NotImplementedError

    @property
    def has_row_appliers(self) -> bool:
        """True when the kind implements :meth:`row_appliers` (so one batch can carry several strengths); a kind
        that only overrides :meth:`appliers` runs one strength per batch."""
        return type(self).row_appliers is not Edit.row_appliers

    def make_plan(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> EditPlan:
        """The plan of this edit for ``batch``, its positions read from the batch's own formatted strings (an edit
        goes to any ``forward`` / ``generate`` as it is, with no :meth:`bind` first)."""
        texts = getattr(batch, "texts", None)
        if texts is None:
            raise TypeError("an unbound edit needs a TokenBatch (backend.encode) to find its positions; "
                            "call edit.bind(prompts) for any other batch")
        return self.bind(list(texts)).make_plan(backend.preformatted(), batch)

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        """Site -> ``fn(hidden, rows, cols) -> hidden'`` for an hf model: the row appliers at ``self.strength``."""
        device, dtype = model_device_dtype(model)
        return {s: column_applier(fn, self.strength)
                for s, fn in self.row_appliers(model_width(model), device, dtype).items()}

    def same_but_strength(self, other: "Edit") -> bool:
        """True when ``other`` is this edit at another strength (same kind, spec and loaded tensors)."""
        a, b = self.spec, other.spec
        a.pop("strength", None)
        b.pop("strength", None)
        return type(self) is type(other) and a == b

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, layers={list(self.layers)}, positions={self.positions!r}, "
                f"strength={self.strength:g})")


class BoundEdit:
    """An edit bound to one batch of user prompts; ``attach(backend, batch)`` installs its hooks.

    ``strengths`` (one per prompt; None: the edit's own strength everywhere) lets one batch carry several
    strengths of the same edit (:meth:`stack`): token-row backends (vllm) apply them per request, hf per batch
    row (following row compaction)."""

    def __init__(self, edit: Edit, prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None,
                 strengths: Sequence[float] | None = None) -> None:
        self.edit = edit
        self.prompts = list(prompts)
        if tool_spans is not None and len(tool_spans) != len(self.prompts):
            raise ValueError(f"{len(tool_spans)} tool spans for {len(self.prompts)} prompts")
        self.tool_spans = None if tool_spans is None else [None if s is None else tuple(s) for s in tool_spans]
        if strengths is not None and len(strengths) != len(self.prompts):
            raise ValueError(f"{len(strengths)} strengths for {len(self.prompts)} prompts")
        self.strengths = None if strengths is None else [float(s) for s in strengths]
        self.plan: PositionPlan | None = None
        self._hooks: Any = None

    @classmethod
    def stack(cls, bounds: Sequence["BoundEdit"]) -> "BoundEdit":
        """One bound edit over the rows of ``bounds`` (in order), each row keeping its edit's strength; the edits
        must differ in strength only (``Edit.same_but_strength``)."""
        if not bounds:
            raise ValueError("nothing to stack")
        first = bounds[0].edit
        for b in bounds[1:]:
            if not first.same_but_strength(b.edit):
                raise ValueError(f"edits {first!r} and {b.edit!r} differ in more than their strength")
        prompts = [p for b in bounds for p in b.prompts]
        spans = [s for b in bounds for s in (b.tool_spans or [None] * len(b.prompts))]
        strengths = [s for b in bounds for s in b.row_strengths()]
        return cls(first, prompts, spans, strengths)

    def row_strengths(self) -> list[float]:
        """The strength of every row."""
        return list(self.strengths) if self.strengths is not None else [self.edit.strength] * len(self.prompts)

    @property
    def spec(self) -> dict[str, Any]:
        return self.edit.spec

    def make_plan(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> EditPlan:
        """What this edit does to ``batch``: the columns it edits and the strength of each row (any backend runs
        it: ``backend.intervene(batch, plan)``)."""
        backend.site_info.check_sites(self.edit.layers, lambda msg: EditSpecError(msg, field="layers"))
        spans = self.tool_spans
        if self.edit.positions == "last_input":
            spans = None                  # no tool span is needed (and none has to map onto the prompt)
        layouts = layout_backend_batch(backend, self.prompts, batch, spans)
        positions = PositionPlan.from_layouts(layouts, self.edit.positions, int(batch["input_ids"].shape[1]))
        return EditPlan(self.edit, positions, self.strengths)

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["BoundEdit"]:
        """This edit's hooks installed by ``backend`` for the forwards inside (``backend.intervene``)."""
        plan = self.make_plan(backend, batch)
        self.plan = plan.positions
        with backend.intervene(batch, plan) as state:
            self._hooks = state
            if state is not None:
                self.plan = state.plan
            try:
                yield self
            finally:
                self._hooks = None

    def select_rows(self, rows: Sequence[int]) -> None:
        """The batch was reduced to ``rows`` (finished rows dropped while decoding): edit only those from now on."""
        if self._hooks is None:
            raise RuntimeError("select_rows is only valid while the edit is attached")
        self._hooks.select_rows(rows)
        self.plan = self._hooks.plan


def edit_from_spec(spec: Mapping[str, Any], *, base_dir: str | Path | None = None,
                   source: str | Path | None = None, **kwargs: Any) -> Edit:
    """The edit of a spec: validated, then built by the class registered for its kind (``steering.registry``)."""
    norm = validate_spec(spec, path=source)
    return edit_kind(norm["kind"])(norm, base_dir=base_dir, source=source, **kwargs)


def load_edit(path: str | Path) -> Edit:
    """Read and validate an edit spec file (and the files it names) into an :class:`Edit`; no model is loaded.

    SAEs of ``sae_clamp`` edits are loaded on first use; direction vectors are read here (they are small).
    """
    p = Path(path)
    spec = load_spec(p)
    return edit_from_spec(spec, base_dir=p.parent, source=p)
