"""Edits: what an edit does to the residual stream, bound to a batch and applied through ``steering.hooks``.

An :class:`Edit` is built from a validated spec (``steering.spec``). ``edit.bind(prompts, tool_spans)`` gives a
:class:`BoundEdit` for one batch of user prompts (tool spans = character spans of the tool output inside each
user prompt, None for rows without one); ``Backend.generate`` / ``Backend.forward`` enter
``bound.attach(backend, batch)``, which lays the batch out (``activations.positions``), decides which columns
are edited (``steering.hooks.PositionPlan``) and registers one hook per site.

Kinds:

- :class:`DirectionEdit` adds ``strength * scale[s] * unit[s]`` at the selected positions of site ``s``.
- :class:`SAEClampEdit` applies SpARE's clamp (methods.md section 1, step H) through an SAE: with ``z`` the SAE
  code of the unedited ``h``, ``v = strength * targets``, removal ``r_j = min(v_j, z_j)`` (never negative) on
  the features to remove and addition ``a_j = max(v_j - z_j, 0)`` on the features to add,
  ``h' = h - sum_j r_j W_dec[j] + sum_j a_j W_dec[j]``. The decoder bias cancels and the SAE's reconstruction
  error stays in ``h'``.
"""

from __future__ import annotations

import copy
import hashlib
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from activations.positions import layout_backend_batch
from memtoc.backends.parts import residual_width
from steering.hooks import Applier, PositionPlan, edit_hooks
from steering.spec import (DIRECTIONS, SCHEMA_VERSION, EditSpecError, load_spec, resolve, save_spec,
                           validate_spec)

UNIT_TOLERANCE = 1e-3


class Edit:
    """Base class: a validated spec plus whatever the kind needs (vectors, SAEs), shared between copies."""

    kind = ""

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
        """A copy that pushes toward ``direction`` (memory | tool) with strength ``magnitude`` (>= 0)."""
        raise NotImplementedError

    def save(self, path: str | Path) -> Path:
        return save_spec(path, self._spec)

    # -- application -------------------------------------------------------------------------------------------
    def bind(self, prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None = None
             ) -> "BoundEdit":
        return BoundEdit(self, prompts, tool_spans)

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        """Site -> ``fn(hidden, rows, cols) -> hidden'`` for this model (tensors moved to its device/dtype)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, layers={list(self.layers)}, positions={self.positions!r}, "
                f"strength={self.strength:g})")


class BoundEdit:
    """An edit bound to one batch of user prompts; ``attach(backend, batch)`` installs its hooks."""

    def __init__(self, edit: Edit, prompts: Sequence[str], tool_spans: Sequence[tuple[int, int] | None] | None
                 ) -> None:
        self.edit = edit
        self.prompts = list(prompts)
        if tool_spans is not None and len(tool_spans) != len(self.prompts):
            raise ValueError(f"{len(tool_spans)} tool spans for {len(self.prompts)} prompts")
        self.tool_spans = None if tool_spans is None else [None if s is None else tuple(s) for s in tool_spans]
        self.plan: PositionPlan | None = None
        self._hooks: Any = None

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
        model = backend.parts.model
        appliers = {} if self.plan.empty else self.edit.appliers(model)
        with edit_hooks(model, appliers, self.plan) as state:
            self._hooks = state
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


def _model_width(model: torch.nn.Module) -> int:
    return residual_width(model)


def _model_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


# ---------------------------------------------------------------------------------------------------------------
# direction

def vectors_bytes(vectors: Mapping[int, torch.Tensor]) -> bytes:
    """The safetensors serialisation of ``{site.{s}: float32 [d]}`` (what ``vectors_sha256`` hashes)."""
    from safetensors.torch import save

    return save({f"site.{int(s)}": torch.as_tensor(v, dtype=torch.float32).detach().cpu().contiguous()
                 for s, v in sorted(vectors.items())})


class DirectionEdit(Edit):
    """``h[pos] += strength * scale[s] * unit[s]`` at each site ``s``."""

    kind = "direction"

    def __init__(self, spec: Mapping[str, Any], *, vectors: Mapping[int, torch.Tensor] | None = None,
                 base_dir: str | Path | None = None, source: str | Path | None = None) -> None:
        spec = dict(spec)
        if vectors is not None and "vectors_sha256" not in spec:
            spec["vectors_sha256"] = hashlib.sha256(vectors_bytes(vectors)).hexdigest()
        super().__init__(spec, base_dir=base_dir, source=source)
        if vectors is None:
            vectors = self._load_vectors()
        self.vectors = self._check_vectors(vectors)

    @classmethod
    def build(cls, *, name: str, layers: Sequence[int], vectors: Mapping[int, torch.Tensor],
              scale: Mapping[int, float], positions: str = "last_input", strength: float = 1.0,
              toward: str = "memory", apply_to_closed_book: bool = False, **extra: Any) -> "DirectionEdit":
        """An in-memory direction edit (``save_direction_edit`` writes it as spec + vectors file)."""
        spec = {"schema_version": SCHEMA_VERSION, "name": name, "kind": "direction", "layers": list(layers),
                "positions": positions, "strength": float(strength), "apply_to_closed_book": apply_to_closed_book,
                "scale": {str(s): float(scale[s]) for s in layers}, "toward": toward, **extra}
        return cls(spec, vectors=vectors)

    def _load_vectors(self) -> dict[int, torch.Tensor]:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        rel = self._spec.get("vectors")
        if not rel:
            raise EditSpecError("a direction edit needs its vectors (a safetensors file)", path=self.source,
                                field="vectors")
        p = resolve(self.base_dir, rel)
        try:
            tensors = load_file(str(p))
        except (OSError, SafetensorError) as exc:
            raise EditSpecError(f"cannot read vectors file {p}: {exc}", path=self.source, field="vectors") from None
        out = {}
        for s in self.layers:
            key = f"site.{s}"
            if key not in tensors:
                raise EditSpecError(f"{p} has no tensor {key!r} (has {sorted(tensors)})", path=self.source,
                                    field="vectors")
            out[s] = tensors[key]
        return out

    def _check_vectors(self, vectors: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        out = {}
        dims = set()
        for s in self.layers:
            if s not in vectors:
                raise EditSpecError(f"no vector for site {s}", path=self.source, field="vectors")
            v = torch.as_tensor(vectors[s]).detach().to("cpu", torch.float32).reshape(-1)
            if not torch.isfinite(v).all():
                raise EditSpecError(f"vector site.{s} has non-finite values", path=self.source, field="vectors")
            norm = float(v.norm())
            if abs(norm - 1.0) > UNIT_TOLERANCE:
                raise EditSpecError(f"vector site.{s} must be a unit vector (norm {norm:.6g}); the magnitude belongs "
                                    "in 'scale' and 'strength'", path=self.source, field="vectors")
            dims.add(v.numel())
            out[s] = v
        if len(dims) > 1:
            raise EditSpecError(f"vectors of different widths {sorted(dims)}", path=self.source, field="vectors")
        return out

    def delta(self, site: int) -> torch.Tensor:
        """The float32 vector added at ``site``: ``strength * scale * unit``."""
        return self.strength * float(self._spec["scale"][str(site)]) * self.vectors[site]

    def steer(self, direction: str, magnitude: float) -> "DirectionEdit":
        if direction not in DIRECTIONS:
            raise EditSpecError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                                field="direction")
        sign = 1.0 if direction == self._spec.get("toward", "memory") else -1.0
        return self.with_strength(sign * float(magnitude) if magnitude else 0.0)

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        width = _model_width(model)
        d = next(iter(self.vectors.values())).numel()
        if d != width:
            raise EditSpecError(f"vectors have width {d}, the model's residual stream has {width}",
                                path=self.source, field="vectors")
        device, dtype = _model_device_dtype(model)
        out = {}
        for s in self.layers:
            vec = self.delta(s).to(device=device, dtype=dtype)

            def fn(h: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, _v: torch.Tensor = vec) -> torch.Tensor:
                h = h.clone()
                h[rows, cols] += _v.to(h.dtype)
                return h
            out[s] = fn
        return out


def save_direction_edit(path: str | Path, edit: DirectionEdit, *, vectors_file: str | Path | None = None) -> Path:
    """Write ``edit`` as a spec file plus a vectors file (default: ``<spec stem>.safetensors`` beside it)."""
    path = Path(path)
    vp = Path(vectors_file) if vectors_file is not None else path.with_suffix(".safetensors")
    if vp.resolve().parent == path.resolve().parent:
        rel = vp.name
    else:
        rel = str(vp.resolve())
    data = vectors_bytes(edit.vectors)
    vp.parent.mkdir(parents=True, exist_ok=True)
    tmp = vp.with_name(vp.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(vp)
    spec = edit.spec
    spec["vectors"] = rel
    spec["vectors_sha256"] = hashlib.sha256(data).hexdigest()
    return save_spec(path, spec)


# ---------------------------------------------------------------------------------------------------------------
# SAE clamp

_HOOK_PATTERNS = (
    (re.compile(r"^blocks\.(\d+)\.hook_resid_post$"), 1),
    (re.compile(r"^blocks\.(\d+)\.hook_out$"), 1),
    (re.compile(r"^blocks\.(\d+)\.hook_resid_pre$"), 0),
    (re.compile(r"^blocks\.(\d+)\.hook_in$"), 0),
    (re.compile(r"^(?:model\.)?layers\.(\d+)$"), 1),
    (re.compile(r"^site[_.]?(\d+)$"), 0),
)


def sae_site(hook_name: str | None) -> int | None:
    """The residual site an SAE was trained on, from its hook name; None when the name is not a residual site.

    ``blocks.L.hook_resid_post`` / ``layers.L`` -> L + 1; ``blocks.L.hook_resid_pre`` -> L; ``site_S`` -> S.
    """
    if not hook_name:
        return None
    for pat, shift in _HOOK_PATTERNS:
        m = pat.match(str(hook_name))
        if m:
            return int(m.group(1)) + shift
    return None


def _hook_name(sae: Any) -> str | None:
    cfg = getattr(sae, "cfg", None)
    meta = getattr(cfg, "metadata", None)
    for obj in (meta, cfg):
        if obj is None:
            continue
        try:
            name = getattr(obj, "hook_name", None)
        except Exception:  # noqa: BLE001 - metadata objects may raise on unknown keys
            name = None
        if name:
            return str(name)
    return None


def default_load_sae(ref: Mapping[str, Any]) -> Any:
    """Load an SAE through sae-lens (``steering.sae.load_sae`` is preferred when it exists)."""
    try:
        from steering.sae import load_sae  # provided by the SAE part of the steering package
    except ImportError:
        load_sae = None
    if load_sae is not None:
        return load_sae(dict(ref))
    try:
        from sae_lens import SAE
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise EditSpecError(f"sae_clamp edits need sae-lens (pip install -e '.[interp]'): {exc}", field="sae") from None
    if "path" in ref:
        return SAE.load_from_disk(str(ref["path"]), device="cpu")
    return SAE.from_pretrained(ref["release"], ref["sae_id"], device="cpu")


class SAEClampEdit(Edit):
    """SpARE's remove/add clamp through one SAE per site (see the module docstring).

    ``saes`` (site -> object with ``encode(x)`` and ``W_dec [d_sae, d_in]``, e.g. a ``sae_lens.SAE``) may be
    given directly; otherwise each site's SAE is loaded on first use from ``spec["sae"]`` (paths relative to
    the spec file). SAEs run in float32; the delta is cast to the model's dtype.
    """

    kind = "sae_clamp"

    def __init__(self, spec: Mapping[str, Any], *, saes: Mapping[int, Any] | None = None,
                 base_dir: str | Path | None = None, source: str | Path | None = None) -> None:
        super().__init__(spec, base_dir=base_dir, source=source)
        self._saes: dict[int, Any] = dict(saes) if saes is not None else {}
        self._device_cache: dict[tuple, dict[str, Any]] = {}

    def swapped(self) -> "SAEClampEdit":
        """The opposite steer: remove the features this edit adds (to their targets) and add those it removes."""
        feats = {}
        for s, f in self._spec["features"].items():
            feats[s] = {"remove": list(f["add"]), "remove_targets": list(f["add_targets"]),
                        "add": list(f["remove"]), "add_targets": list(f["remove_targets"])}
        other = "tool" if self._spec["steer_toward"] == "memory" else "memory"
        new = self._copy_with(features=feats, steer_toward=other)
        new._device_cache = {}
        return new

    def steer(self, direction: str, magnitude: float) -> "SAEClampEdit":
        if direction not in DIRECTIONS:
            raise EditSpecError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}",
                                field="direction")
        base = self if direction == self._spec["steer_toward"] else self.swapped()
        return base.with_strength(float(magnitude))

    def sae(self, site: int) -> Any:
        if site not in self._saes:
            ref = dict(self._spec["sae"][str(site)])
            if "path" in ref:
                ref["path"] = str(resolve(self.base_dir, ref["path"]))
            self._saes[site] = default_load_sae(ref)
        return self._saes[site]

    def _check_sae(self, site: int, sae: Any, width: int) -> None:
        f = f"sae.{site}"
        if not hasattr(sae, "encode") or getattr(sae, "W_dec", None) is None:
            raise EditSpecError("the SAE object has no encode() / W_dec", path=self.source, field=f)
        W = sae.W_dec
        if W.dim() != 2 or int(W.shape[1]) != width:
            raise EditSpecError(f"SAE W_dec has shape {tuple(W.shape)}; expected [d_sae, {width}] for this model",
                                path=self.source, field=f)
        feats = self._spec["features"][str(site)]
        too_big = [i for i in feats["remove"] + feats["add"] if i >= int(W.shape[0])]
        if too_big:
            raise EditSpecError(f"feature id(s) {too_big[:5]} >= d_sae {int(W.shape[0])}", path=self.source,
                                field=f"features.{site}")
        hook = _hook_name(sae)
        trained = sae_site(hook)
        if hook is not None and trained is None and re.search(r"mlp|attn|hook_z", hook):
            raise EditSpecError(f"the SAE was trained on {hook!r}, not on the residual stream", path=self.source,
                                field=f)
        if trained is not None and trained != site:
            raise EditSpecError(f"the SAE was trained on {hook!r} (site {trained}) but is applied at site {site}",
                                path=self.source, field=f)
        norm = getattr(getattr(sae, "cfg", None), "normalize_activations", "none")
        if norm in ("layer_norm", "covariance_whitening"):
            raise EditSpecError(f"SAEs with normalize_activations={norm!r} are not supported (the decoder rows are "
                                "not residual-space directions)", path=self.source, field=f)

    def _prepare_site(self, site: int, device: torch.device, width: int | None = None) -> dict[str, Any]:
        key = (site, str(device))
        prep = self._device_cache.get(key)
        if prep is not None:
            return prep
        sae = self.sae(site)
        if width is None:
            width = int(sae.W_dec.shape[1])
        self._check_sae(site, sae, width)
        if hasattr(sae, "to"):
            sae = sae.to(device)
            self._saes[site] = sae
        W = sae.W_dec.detach().to(device=device, dtype=torch.float32)
        f = self._spec["features"][str(site)]
        rm = torch.as_tensor(f["remove"], dtype=torch.long, device=device)
        ad = torch.as_tensor(f["add"], dtype=torch.long, device=device)
        prep = {"sae": sae, "remove": rm, "add": ad,
                "remove_targets": torch.as_tensor(f["remove_targets"], dtype=torch.float32, device=device),
                "add_targets": torch.as_tensor(f["add_targets"], dtype=torch.float32, device=device),
                "W_remove": W[rm], "W_add": W[ad]}
        self._device_cache[key] = prep
        return prep

    def edit_rows(self, site: int, h: torch.Tensor) -> torch.Tensor:
        """``h'`` for residual rows ``h`` ``[n, d]`` at ``site`` (the math of the hook, usable on stored rows)."""
        prep = self._prepare_site(site, h.device)
        return h + self._delta(prep, h).to(h.dtype)

    def _delta(self, prep: Mapping[str, Any], h: torch.Tensor) -> torch.Tensor:
        x = h.to(torch.float32)
        with torch.no_grad():
            z = prep["sae"].encode(x).to(torch.float32)
        return clamp_delta(z, prep["remove"], self.strength * prep["remove_targets"], prep["W_remove"],
                           prep["add"], self.strength * prep["add_targets"], prep["W_add"])

    def appliers(self, model: torch.nn.Module) -> dict[int, Applier]:
        device, _ = _model_device_dtype(model)
        width = _model_width(model)
        out = {}
        for s in self.layers:
            prep = self._prepare_site(s, device, width)

            def fn(h: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, _p: dict = prep) -> torch.Tensor:
                sel = h[rows, cols]
                h = h.clone()
                h[rows, cols] = sel + self._delta(_p, sel).to(h.dtype)
                return h
            out[s] = fn
        return out


def clamp_delta(z: torch.Tensor, remove: torch.Tensor, remove_v: torch.Tensor, W_remove: torch.Tensor,
                add: torch.Tensor, add_v: torch.Tensor, W_add: torch.Tensor) -> torch.Tensor:
    """SpARE's clamp as a residual delta ``[n, d]``: ``-sum_j r_j W_remove[j] + sum_j a_j W_add[j]``.

    ``z`` ``[n, d_sae]`` is the SAE code of the unedited rows; ``r_j = max(min(v_j, z_j), 0)`` for the features
    ``remove`` (never more than the feature carries, never negative), ``a_j = max(v_j - z_j, 0)`` for ``add``
    (only the shortfall up to the target). ``W_remove``/``W_add`` are the decoder rows of those features.
    """
    delta = z.new_zeros((z.shape[0], W_add.shape[1] if W_add.numel() else W_remove.shape[1]))
    if remove.numel():
        r = torch.minimum(remove_v, z[:, remove]).clamp_min(0.0)
        delta = delta - r @ W_remove
    if add.numel():
        a = (add_v - z[:, add]).clamp_min(0.0)
        delta = delta + a @ W_add
    return delta


# ---------------------------------------------------------------------------------------------------------------

def edit_from_spec(spec: Mapping[str, Any], *, base_dir: str | Path | None = None,
                   source: str | Path | None = None, **kwargs: Any) -> Edit:
    norm = validate_spec(spec, path=source)
    cls = DirectionEdit if norm["kind"] == "direction" else SAEClampEdit
    return cls(norm, base_dir=base_dir, source=source, **kwargs)


def load_edit(path: str | Path) -> Edit:
    """Read and validate an edit spec file (and the files it names) into an :class:`Edit`; no model is loaded.

    SAEs of ``sae_clamp`` edits are loaded on first use; direction vectors are read here (they are small).
    """
    p = Path(path)
    spec = load_spec(p)
    return edit_from_spec(spec, base_dir=p.parent, source=p)
