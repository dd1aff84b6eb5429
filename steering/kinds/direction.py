"""``kind: "direction"``: mean-difference steering, ``h[pos] += strength * scale[s] * unit[s]`` at each site ``s``.

Spec fields: ``vectors`` (safetensors file, relative to the spec file; tensors ``site.{s}`` = unit direction,
float32 ``[d_model]``), ``scale`` ({site: projection gap}), optional ``vectors_sha256`` (checked when present),
optional ``toward`` ("memory" | "tool": the behaviour a positive strength pushes toward; null: not known, so the
edit cannot be steered by side; absent: "memory", as specs written before the field could be null read),
optional ``toward_basis`` (why: given, or derived from the contrast) and ``contrast`` (``{"toward": A, "from": B}``:
the sides of the contrast the vector points toward and away from, in the contrast's own terms).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from steering.edits import Edit
from memtoc.backends.plans import EditRows, RowApplier
from steering.registry import register_edit_kind
from steering.spec import (DIRECTIONS, SCHEMA_VERSION, EditSpecError, SpecChecker, is_number, resolve,
                           save_spec)

UNIT_TOLERANCE = 1e-3


def vectors_bytes(vectors: Mapping[int, torch.Tensor]) -> bytes:
    """The safetensors serialisation of ``{site.{s}: float32 [d]}`` (what ``vectors_sha256`` hashes)."""
    from safetensors.torch import save

    return save({f"site.{int(s)}": torch.as_tensor(v, dtype=torch.float32).detach().cpu().contiguous()
                 for s, v in sorted(vectors.items())})


@register_edit_kind("direction")
class DirectionEdit(Edit):
    """``h[pos] += strength * scale[s] * unit[s]`` at each site ``s``."""

    own_fields = ("vectors", "scale")

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
    def validate_fields(cls, c: SpecChecker, spec: dict[str, Any], layers: list[int]) -> None:
        vectors = spec.get("vectors")
        if vectors is not None and (not isinstance(vectors, str) or not vectors.strip()):
            c.fail("vectors", "must be the path of a safetensors file (relative to the spec file)")
        if vectors is None and c.path is not None:
            c.fail("vectors", "missing: the safetensors file with tensors site.{s}")
        sha = spec.get("vectors_sha256")
        if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
            c.fail("vectors_sha256", "must be a hex sha256 string")
        scale = c.site_map(spec, "scale", layers)
        for s, v in scale.items():
            if not is_number(v):
                c.fail(f"scale.{s}", f"must be a finite number, got {v!r}")
            scale[s] = float(v)
        spec["scale"] = scale
        toward = spec.setdefault("toward", "memory")          # absent: an older spec, read as before
        if toward is not None and toward not in DIRECTIONS:
            c.fail("toward", f"must be one of {', '.join(DIRECTIONS)} or null, got {toward!r}")
        sides = spec.get("contrast")
        if sides is not None and not (isinstance(sides, Mapping) and set(sides) == {"toward", "from"}
                                      and all(isinstance(v, str) and v for v in sides.values())):
            c.fail("contrast", f"must be {{\"toward\": side A, \"from\": side B}} (non-empty strings), got {sides!r}")

    @classmethod
    def check_files(cls, spec: Mapping[str, Any], *, path: str | Path | None, base_dir: Path | None) -> None:
        from memtoc.core.fileio import sha256_file

        if spec.get("vectors"):
            vp = resolve(base_dir, spec["vectors"])
            if not vp.is_file():
                raise EditSpecError(f"vectors file {vp} does not exist", path=path, field="vectors")
            want = spec.get("vectors_sha256")
            if want and sha256_file(vp) != want:
                raise EditSpecError(f"{vp} does not match vectors_sha256 (the file changed since the spec was written)",
                                    path=path, field="vectors_sha256")

    @property
    def toward(self) -> str | None:
        return self._spec.get("toward", "memory")

    @classmethod
    def build(cls, *, name: str, layers: Sequence[int], vectors: Mapping[int, torch.Tensor],
              scale: Mapping[int, float], positions: str = "last_input", strength: float = 1.0,
              toward: str | None = "memory", apply_to_closed_book: bool = False, **extra: Any) -> "DirectionEdit":
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

    def row_appliers(self, width: int, device: torch.device, dtype: torch.dtype) -> dict[int, RowApplier]:
        d = next(iter(self.vectors.values())).numel()
        if d != width:
            raise EditSpecError(f"vectors have width {d}, the model's residual stream has {width}",
                                path=self.source, field="vectors")
        # The vector is rounded once, to the activation's dtype at apply time: ``dtype`` (the model's parameters)
        # may be a storage type no math runs in (an FP8 checkpoint's float8 weights).
        out = {}
        for s in self.layers:
            unit = self.vectors[s].to(device=device, dtype=torch.float32)
            scale = float(self._spec["scale"][str(s)])
            vec = self.delta(s).to(device=device, dtype=torch.float32)     # at the edit's own strength

            def fn(x: torch.Tensor, where: EditRows, _u: torch.Tensor = unit, _c: float = scale,
                   _v: torch.Tensor = vec) -> torch.Tensor:
                if where.scalar is not None:
                    v = _v if where.scalar == self.strength else where.scalar * _c * _u
                    return x + v.to(x.dtype)
                coef = (where.strength.to(torch.float64) * _c).to(torch.float32)      # per row
                return x + (coef[:, None] * _u).to(x.dtype)
            out[s] = fn
        return out


def save_direction_edit(path: str | Path, edit: DirectionEdit, *, vectors_file: str | Path | None = None) -> Path:
    """Write ``edit`` as a spec file plus a vectors file (default: ``<spec stem>.safetensors`` beside it)."""
    path = Path(path)
    vp = Path(vectors_file) if vectors_file is not None else path.with_suffix(".safetensors")
    rel = vp.name if vp.resolve().parent == path.resolve().parent else str(vp.resolve())
    data = vectors_bytes(edit.vectors)
    vp.parent.mkdir(parents=True, exist_ok=True)
    tmp = vp.with_name(vp.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(vp)
    spec = edit.spec
    spec["vectors"] = rel
    spec["vectors_sha256"] = hashlib.sha256(data).hexdigest()
    return save_spec(path, spec)
