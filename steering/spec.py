"""Edit specs (JSON, ``schema_version: "memtoc-edit-v1"``): validation, normalisation, atomic writing.

A spec is checked completely before any model loads; every error names the file and the field. The format is
documented in ``docs/steering.md``. Common fields::

    schema_version        "memtoc-edit-v1"
    name                  non-empty string (recorded in every edited episode record)
    kind                  "direction" | "sae_clamp"
    layers                [site, ...]  activation-store sites: an edit at site s changes the output of block s-1
                          (site 0 = the embedding output, i.e. the input of block 0)
    positions             "last_input" | "tool_span" | "from_tool_return"
    strength              number
    apply_to_closed_book  bool (default false)

``direction``: ``vectors`` (safetensors file, relative to the spec file; tensors ``site.{s}`` = unit direction,
float32 ``[d_model]``), ``scale`` ({site: projection gap}), optional ``vectors_sha256`` (checked when present),
optional ``toward`` ("memory" | "tool", default "memory": what a positive strength pushes toward).
``sae_clamp``: ``sae`` ({site: {"path": dir} | {"release": r, "sae_id": i}}), ``features`` ({site: {"remove",
"remove_targets", "add", "add_targets"}}), ``steer_toward`` ("memory" | "tool"), ``fvu`` ({site: value}),
``fvu_threshold`` (default 0.5), ``force`` (default false).

Any other top-level key (``description``, ``source``, ...) is kept as free-form provenance.
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from memtoc.errors import MemtocError

SCHEMA_VERSION = "memtoc-edit-v1"
KINDS = ("direction", "sae_clamp")
POSITIONS = ("last_input", "tool_span", "from_tool_return")
DIRECTIONS = ("memory", "tool")
DEFAULT_FVU_THRESHOLD = 0.5
FEATURE_KEYS = ("remove", "remove_targets", "add", "add_targets")


class EditSpecError(MemtocError):
    """An edit spec that cannot be used. The message names the file (when there is one) and the field."""

    def __init__(self, message: str, *, path: str | Path | None = None, field: str | None = None) -> None:
        parts = []
        if path is not None:
            parts.append(str(path))
        if field is not None:
            parts.append(f"field '{field}'")
        where = ", ".join(parts)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = None if path is None else str(path)
        self.field = field


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Checker:
    def __init__(self, path: str | Path | None) -> None:
        self.path = path

    def fail(self, field: str, message: str) -> None:
        raise EditSpecError(message, path=self.path, field=field)

    def site_map(self, spec: Mapping[str, Any], field: str, layers: list[int]) -> dict[str, Any]:
        """A {site: value} object whose keys are exactly the edit's layers; keys normalised to strings."""
        raw = spec.get(field)
        if not isinstance(raw, Mapping):
            self.fail(field, f"must be an object keyed by site ({', '.join(map(str, layers))})")
        out: dict[str, Any] = {}
        for key, value in raw.items():
            try:
                site = int(str(key))
            except ValueError:
                self.fail(f"{field}.{key}", "keys must be site indices (integers)")
            if str(site) in out:
                self.fail(f"{field}.{key}", "site given twice")
            out[str(site)] = value
        missing = [s for s in layers if str(s) not in out]
        extra = sorted(int(k) for k in out if int(k) not in layers)
        if missing:
            self.fail(field, f"no entry for site(s) {missing} listed in 'layers'")
        if extra:
            self.fail(field, f"entries for site(s) {extra} that are not in 'layers' {layers}")
        return {str(s): out[str(s)] for s in layers}


def validate_spec(raw: Any, *, path: str | Path | None = None) -> dict[str, Any]:
    """Check a spec and return its normalised form (defaults filled, site keys as strings, layers sorted).

    Only the spec itself is checked here; files it names are checked by :func:`check_files`.
    """
    c = _Checker(path)
    if not isinstance(raw, Mapping):
        c.fail("(top level)", "an edit spec must be a JSON object")
    spec = copy.deepcopy(dict(raw))
    if spec.get("schema_version") != SCHEMA_VERSION:
        c.fail("schema_version", f"must be {SCHEMA_VERSION!r}, got {spec.get('schema_version')!r}")
    name = spec.get("name")
    if not isinstance(name, str) or not name.strip():
        c.fail("name", "must be a non-empty string")
    kind = spec.get("kind")
    if kind not in KINDS:
        c.fail("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    layers = spec.get("layers")
    if not isinstance(layers, list) or not layers:
        c.fail("layers", "must be a non-empty list of site indices")
    for s in layers:
        if not _is_int(s) or s < 0:
            c.fail("layers", f"site indices must be integers >= 0, got {s!r}")
    if len(set(layers)) != len(layers):
        c.fail("layers", f"duplicate site in {layers}")
    layers = sorted(layers)
    spec["layers"] = layers
    if spec.get("positions") not in POSITIONS:
        c.fail("positions", f"must be one of {', '.join(POSITIONS)}, got {spec.get('positions')!r}")
    if not _is_number(spec.get("strength")):
        c.fail("strength", f"must be a finite number, got {spec.get('strength')!r}")
    spec["strength"] = float(spec["strength"])
    acb = spec.setdefault("apply_to_closed_book", False)
    if not isinstance(acb, bool):
        c.fail("apply_to_closed_book", f"must be true or false, got {acb!r}")
    if kind == "direction":
        _validate_direction(c, spec, layers)
    else:
        _validate_sae_clamp(c, spec, layers)
    return spec


def _validate_direction(c: _Checker, spec: dict[str, Any], layers: list[int]) -> None:
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
        if not _is_number(v):
            c.fail(f"scale.{s}", f"must be a finite number, got {v!r}")
        scale[s] = float(v)
    spec["scale"] = scale
    toward = spec.setdefault("toward", "memory")
    if toward not in DIRECTIONS:
        c.fail("toward", f"must be one of {', '.join(DIRECTIONS)}, got {toward!r}")
    for key in ("sae", "features"):
        if key in spec:
            c.fail(key, "belongs to kind 'sae_clamp', not 'direction'")


def _validate_sae_clamp(c: _Checker, spec: dict[str, Any], layers: list[int]) -> None:
    for key in ("vectors", "scale"):
        if key in spec:
            c.fail(key, "belongs to kind 'direction', not 'sae_clamp'")
    saes = c.site_map(spec, "sae", layers)
    for s, ref in saes.items():
        f = f"sae.{s}"
        if not isinstance(ref, Mapping):
            c.fail(f, 'must be {"path": DIR} or {"release": R, "sae_id": ID}')
        has_path = "path" in ref
        has_release = "release" in ref or "sae_id" in ref
        if has_path == has_release:
            c.fail(f, 'give exactly one of {"path": DIR} or {"release": R, "sae_id": ID}')
        if has_path and (not isinstance(ref["path"], str) or not ref["path"].strip()):
            c.fail(f"{f}.path", "must be a non-empty string")
        if has_release:
            for k in ("release", "sae_id"):
                if not isinstance(ref.get(k), str) or not ref.get(k, "").strip():
                    c.fail(f"{f}.{k}", "must be a non-empty string")
        saes[s] = dict(ref)
    spec["sae"] = saes
    feats = c.site_map(spec, "features", layers)
    n_total = 0
    for s, entry in feats.items():
        f = f"features.{s}"
        if not isinstance(entry, Mapping):
            c.fail(f, "must be an object with remove, remove_targets, add, add_targets")
        unknown = sorted(set(entry) - set(FEATURE_KEYS))
        if unknown:
            c.fail(f"{f}.{unknown[0]}", f"unknown key; expected {', '.join(FEATURE_KEYS)}")
        norm = {}
        for role in ("remove", "add"):
            ids = entry.get(role, [])
            targets = entry.get(f"{role}_targets", [])
            if not isinstance(ids, list) or not all(_is_int(i) and i >= 0 for i in ids):
                c.fail(f"{f}.{role}", "must be a list of feature ids (integers >= 0)")
            if len(set(ids)) != len(ids):
                c.fail(f"{f}.{role}", "duplicate feature id")
            if not isinstance(targets, list) or not all(_is_number(t) for t in targets):
                c.fail(f"{f}.{role}_targets", "must be a list of finite numbers")
            if len(targets) != len(ids):
                c.fail(f"{f}.{role}_targets", f"has {len(targets)} values for {len(ids)} features in '{role}'")
            if any(float(t) < 0 for t in targets):
                c.fail(f"{f}.{role}_targets", "target activations must be >= 0")
            norm[role] = list(ids)
            norm[f"{role}_targets"] = [float(t) for t in targets]
            n_total += len(ids)
        both = sorted(set(norm["remove"]) & set(norm["add"]))
        if both:
            c.fail(f, f"feature(s) {both[:5]} are both removed and added")
        feats[s] = {k: norm[k] for k in FEATURE_KEYS}
    if n_total == 0:
        c.fail("features", "no feature to remove or add at any site")
    spec["features"] = feats
    if spec.get("steer_toward") not in DIRECTIONS:
        c.fail("steer_toward", f"must be one of {', '.join(DIRECTIONS)}, got {spec.get('steer_toward')!r}")
    thr = spec.setdefault("fvu_threshold", DEFAULT_FVU_THRESHOLD)
    if not _is_number(thr) or thr < 0:
        c.fail("fvu_threshold", f"must be a number >= 0, got {thr!r}")
    spec["fvu_threshold"] = float(thr)
    force = spec.setdefault("force", False)
    if not isinstance(force, bool):
        c.fail("force", f"must be true or false, got {force!r}")
    fvu_raw = spec.get("fvu")
    if fvu_raw is None:
        if not force:
            c.fail("fvu", "missing: the reconstruction gate needs the FVU of every site's SAE (or \"force\": true)")
        spec["fvu"] = None
    else:
        fvu = c.site_map(spec, "fvu", layers)
        for s, v in fvu.items():
            if not _is_number(v) or v < 0:
                c.fail(f"fvu.{s}", f"must be a number >= 0, got {v!r}")
            fvu[s] = float(v)
        spec["fvu"] = fvu
        bad = {s: v for s, v in fvu.items() if v > spec["fvu_threshold"]}
        if bad and not force:
            worst = max(bad, key=bad.get)
            c.fail(f"fvu.{worst}", f"the SAE at site {worst} explains too little of the residual stream: FVU "
                   f"{bad[worst]:.3f} > fvu_threshold {spec['fvu_threshold']:.3f} (sites over the threshold: "
                   f"{sorted(int(s) for s in bad)}); an edit through a poor reconstruction is refused unless "
                   "\"force\": true")


def resolve(base_dir: Path | None, rel: str) -> Path:
    p = Path(rel).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def check_files(spec: Mapping[str, Any], *, path: str | Path | None, base_dir: Path | None) -> None:
    """Check the files a spec names exist (and match their recorded hash) without loading a model."""
    from memtoc.fileio import sha256_file

    if spec["kind"] == "direction" and spec.get("vectors"):
        vp = resolve(base_dir, spec["vectors"])
        if not vp.is_file():
            raise EditSpecError(f"vectors file {vp} does not exist", path=path, field="vectors")
        want = spec.get("vectors_sha256")
        if want and sha256_file(vp) != want:
            raise EditSpecError(f"{vp} does not match vectors_sha256 (the file changed since the spec was written)",
                                path=path, field="vectors_sha256")
    if spec["kind"] == "sae_clamp":
        for s, ref in spec["sae"].items():
            if "path" not in ref:
                continue
            d = resolve(base_dir, ref["path"])
            if not d.is_dir():
                raise EditSpecError(f"SAE directory {d} does not exist", path=path, field=f"sae.{s}.path")
            cfg_file = d / "cfg.json"
            if cfg_file.is_file():
                try:
                    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
                except (OSError, ValueError) as exc:
                    raise EditSpecError(f"cannot read {cfg_file}: {exc}", path=path, field=f"sae.{s}.path") from None
                d_sae = cfg.get("d_sae")
                if _is_int(d_sae):
                    f = spec["features"][s]
                    too_big = [i for i in f["remove"] + f["add"] if i >= d_sae]
                    if too_big:
                        raise EditSpecError(f"feature id(s) {too_big[:5]} >= d_sae {d_sae} of {d}", path=path,
                                            field=f"features.{s}")


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read, validate and normalise a spec file (its named files checked too)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EditSpecError("no such edit spec file", path=p) from None
    except OSError as exc:
        raise EditSpecError(f"cannot read the edit spec: {exc}", path=p) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EditSpecError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", path=p) from None
    spec = validate_spec(raw, path=p)
    check_files(spec, path=p, base_dir=p.parent)
    return spec


def save_spec(path: str | Path, spec: Mapping[str, Any]) -> Path:
    """Validate and write a spec atomically (temporary file, fsync, rename). Returns the path."""
    p = Path(path)
    norm = validate_spec(spec, path=p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(norm, ensure_ascii=False, indent=1, allow_nan=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(p)
    return p
