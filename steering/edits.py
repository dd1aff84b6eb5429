"""Edits: what an edit does to the residual stream, bound to a batch and applied through ``steering.hooks``.

An :class:`Edit` is built from a validated spec (``steering.spec``). ``edit.bind(prompts, tool_spans)`` gives a
:class:`BoundEdit` for one batch of user prompts (tool spans = character spans of the tool output inside each
user prompt, None for rows without one); ``Backend.generate`` / ``Backend.forward`` enter
``bound.attach(backend, batch)``, which lays the batch out (``activations.positions``), decides which columns
are edited (``steering.hooks.PositionPlan``) and registers one hook per site.

Each kind is a subclass of :class:`Edit` in its own module under ``steering/kinds/`` (``direction``:
mean-difference steering; ``sae_clamp``: SpARE's remove/add clamp), registered with
``steering.registry.register_edit_kind``; a kind supplies its spec checks (``validate_fields``,
``check_files``), ``row_appliers(width, device, dtype)`` (the per-site function of the edited rows, with a
strength per row: ``steering.hooks.RowApplier``), ``steer`` and ``toward``. The hf backend runs a row applier
through its column hooks (``appliers(model)``, one strength per batch); a token-row backend (vllm) through
``steering.hooks.PlanTokenHook``, where a bound edit may carry one strength per row (``bind(..., strengths=)``,
``BoundEdit.stack``), so several strengths share one engine pass. ``docs/extending.md`` shows how to add one.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from activations.positions import layout_backend_batch
from memtoc.backends.base import InterventionUnsupportedError, TokenRowBackend
from memtoc.backends.device_ops import math_dtype
from memtoc.backends.parts import residual_width
from steering.hooks import (Applier, PlanTokenHook, PositionPlan, RowApplier, column_applier, edit_hooks,
                            per_row_column_applier)
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

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["BoundEdit"]:
        """Bound to ``batch`` and attached in one step, so an edit can be passed to any ``forward`` / ``generate``
        call as it is (no :meth:`bind` first): its positions are read from the batch's own formatted strings."""
        texts = getattr(batch, "texts", None)
        if texts is None:
            raise TypeError("an unbound edit needs a TokenBatch (backend.encode) to find its positions; "
                            "call edit.bind(prompts) for any other batch")
        with self.bind(list(texts)).attach(backend.preformatted(), batch) as bound:
            yield bound

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        """Site -> ``fn(hidden, rows, cols) -> hidden'`` for an hf model: the row appliers at ``self.strength``."""
        device, dtype = _model_device_dtype(model)
        return {s: column_applier(fn, self.strength)
                for s, fn in self.row_appliers(_model_width(model), device, dtype).items()}

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
    row (``steering.hooks.per_row_column_applier``, following row compaction)."""

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

    def make_plan(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> PositionPlan:
        spans = self.tool_spans
        if self.edit.positions == "last_input":
            spans = None                  # no tool span is needed (and none has to map onto the prompt)
        layouts = layout_backend_batch(backend, self.prompts, batch, spans)
        return PositionPlan.from_layouts(layouts, self.edit.positions, int(batch["input_ids"].shape[1]))

    @contextmanager
    def attach(self, backend: Any, batch: Mapping[str, torch.Tensor]) -> Iterator["BoundEdit"]:
        self.plan = self.make_plan(backend, batch)
        if isinstance(backend, TokenRowBackend):       # vllm: the plan mapped onto flattened token rows
            if self.plan.empty or not self.edit.has_row_appliers:
                if not self.edit.has_row_appliers:
                    raise InterventionUnsupportedError(f"a {self.edit.kind!r} edit has no row appliers, which the "
                                                       f"{backend.name!r} backend needs")
                yield self
                return
            hook = PlanTokenHook(self.plan, self.edit, self.row_strengths(), batch.n_pad, backend.site_info.d_model)
            with backend.token_hooks(sorted(hook.sites), hook):
                yield self
            return
        model = backend.parts.model
        if self.strengths is not None and len(set(self.strengths)) > 1:    # strengths as rows of this batch
            if not self.edit.has_row_appliers:
                raise InterventionUnsupportedError(
                    f"a {self.edit.kind!r} edit has no row appliers, so it runs one strength per batch")
            self.plan = self.plan.with_strengths(self.strengths)
            appliers = {} if self.plan.empty else {
                s: per_row_column_applier(fn)
                for s, fn in self.edit.row_appliers(_model_width(model), *_model_device_dtype(model)).items()}
        else:
            if self.strengths is not None and self.strengths and self.strengths[0] != self.edit.strength:
                self.edit = self.edit.with_strength(self.strengths[0])
            appliers = {} if self.plan.empty else self.edit.appliers(model)
        with edit_hooks(model, appliers, self.plan) as state:
            self._hooks = state
            try:
                yield self
            finally:
                self._hooks = None

    def prefix_limit(self) -> int:
        """Leading tokens no row edits: the decoder may prefill up to this many as one shared prefix."""
        if self.plan is None:
            raise RuntimeError("prefix_limit is only valid while the edit is attached")
        return self.plan.prefix_limit() if self.edit.prefix_sharing else 0

    def row_prefix_limits(self) -> list[int]:
        """Each row's leading tokens no edit touches (rows repeating one prompt share its prefill up to there)."""
        if self.plan is None:
            raise RuntimeError("row_prefix_limits is only valid while the edit is attached")
        return self.plan.row_prefix_limits() if self.edit.prefix_sharing else [0] * self.plan.batch_size

    def use_prefix(self, n: int, shift: int = 0) -> None:
        """The decoder prefills the first ``n`` columns in passes no edit touches (0: no shared prefix), and the
        edited columns sit ``shift`` columns right of their place in the plain left-padded batch."""
        if self._hooks is None:
            raise RuntimeError("use_prefix is only valid while the edit is attached")
        self._hooks.prefix, self._hooks.shift = int(n), int(shift)

    def select_rows(self, rows: Sequence[int]) -> None:
        """The batch was reduced to ``rows`` (finished rows dropped while decoding): edit only those from now on."""
        if self._hooks is None:
            raise RuntimeError("select_rows is only valid while the edit is attached")
        self._hooks.select_rows(rows)
        self.plan = self._hooks.plan


def _model_width(model: torch.nn.Module) -> int | None:
    """The residual width, or None for a module with no decoder stack (a kind that needs the width refuses it)."""
    from memtoc.backends.parts import SiteSpecError

    try:
        return residual_width(model)
    except SiteSpecError:
        return None


def _model_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """The first parameter's device, and its dtype where math runs in it (float32 for float8 storage)."""
    p = next(model.parameters())
    return p.device, math_dtype(p.dtype)


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
