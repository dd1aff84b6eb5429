"""``kind: "sae_clamp"``: SpARE's remove/add clamp through one SAE per site (methods.md section 1, step H).

With ``z`` the SAE code of the unedited ``h``, ``v = strength * targets``, removal ``r_j = min(v_j, z_j)`` (never
negative) on the features to remove and addition ``a_j = max(v_j - z_j, 0)`` on the features to add,
``h' = h - sum_j r_j W_dec[j] + sum_j a_j W_dec[j]``. The decoder bias cancels and the SAE's reconstruction error
stays in ``h'``.

Spec fields: ``sae`` ({site: {"path": dir} | {"release": r, "sae_id": i}}), ``features`` ({site: {"remove",
"remove_targets", "add", "add_targets"}}), ``steer_toward`` ("memory" | "tool"), ``fvu`` ({site: value}),
``fvu_threshold`` (default 0.5), ``fvu_gate`` (``median``, the paper's: the arm passes when the median FVU of its
sites is below the threshold; ``every``: each site must be), ``force`` (default false).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Mapping

import torch

from steering.edits import Edit
from memtoc.backends.plans import EditRows, RowApplier
from steering.registry import register_edit_kind
from steering.spec import DIRECTIONS, EditSpecError, SpecChecker, is_int, is_number, resolve

DEFAULT_FVU_THRESHOLD = 0.5
#: how a multi-site arm is gated: ``median`` of its sites' FVU < threshold (the paper, App. C), or ``every`` site
FVU_GATES = ("median", "every")
DEFAULT_FVU_GATE = "median"
FEATURE_KEYS = ("remove", "remove_targets", "add", "add_targets")


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


@register_edit_kind("sae_clamp")
class SAEClampEdit(Edit):
    """SpARE's remove/add clamp through one SAE per site (see the module docstring).

    ``saes`` (site -> object with ``encode(x)`` and ``W_dec [d_sae, d_in]``, e.g. a ``sae_lens.SAE``) may be
    given directly; otherwise each site's SAE is loaded on first use from ``spec["sae"]`` (paths relative to
    the spec file). SAEs run in float32; the delta is cast to the model's dtype.
    """

    own_fields = ("sae", "features")

    def __init__(self, spec: Mapping[str, Any], *, saes: Mapping[int, Any] | None = None,
                 base_dir: str | Path | None = None, source: str | Path | None = None) -> None:
        super().__init__(spec, base_dir=base_dir, source=source)
        self._saes: dict[int, Any] = dict(saes) if saes is not None else {}
        self._device_cache: dict[tuple, dict[str, Any]] = {}

    @classmethod
    def validate_fields(cls, c: SpecChecker, spec: dict[str, Any], layers: list[int]) -> None:
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
                if not isinstance(ids, list) or not all(is_int(i) and i >= 0 for i in ids):
                    c.fail(f"{f}.{role}", "must be a list of feature ids (integers >= 0)")
                if len(set(ids)) != len(ids):
                    c.fail(f"{f}.{role}", "duplicate feature id")
                if not isinstance(targets, list) or not all(is_number(t) for t in targets):
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
        if not is_number(thr) or thr < 0:
            c.fail("fvu_threshold", f"must be a number >= 0, got {thr!r}")
        spec["fvu_threshold"] = float(thr)
        gate = spec.setdefault("fvu_gate", DEFAULT_FVU_GATE)
        if gate not in FVU_GATES:
            c.fail("fvu_gate", f"must be one of {', '.join(FVU_GATES)}, got {gate!r}")
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
                if not is_number(v) or v < 0:
                    c.fail(f"fvu.{s}", f"must be a number >= 0, got {v!r}")
                fvu[s] = float(v)
            spec["fvu"] = fvu
            thr = spec["fvu_threshold"]
            bad = {s: v for s, v in fvu.items() if v >= thr}
            if gate == "median" and fvu:
                # App. C: an arm passes on the median FVU of its sites (Llama Scope 12-15: 0.42-0.51, site 12 over
                # the bar, the arm's median 0.48 passes); a single-site arm is its one site
                med = float(statistics.median(fvu.values()))
                if med >= thr and not force:
                    c.fail("fvu", f"the arm's SAEs explain too little of the residual stream: median FVU {med:.3f} "
                           f">= fvu_threshold {thr:.3f} over sites {sorted(int(s) for s in fvu)} (sites over the "
                           f"threshold: {sorted(int(s) for s in bad)}); an edit through a poor reconstruction is "
                           "refused unless \"force\": true")
            elif bad and not force:
                worst = max(bad, key=bad.get)
                c.fail(f"fvu.{worst}", f"the SAE at site {worst} explains too little of the residual stream: FVU "
                       f"{bad[worst]:.3f} >= fvu_threshold {thr:.3f} (sites over the threshold: "
                       f"{sorted(int(s) for s in bad)}); an edit through a poor reconstruction is refused unless "
                       "\"force\": true")

    @classmethod
    def check_files(cls, spec: Mapping[str, Any], *, path: str | Path | None, base_dir: Path | None) -> None:
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
                if is_int(d_sae):
                    f = spec["features"][s]
                    too_big = [i for i in f["remove"] + f["add"] if i >= d_sae]
                    if too_big:
                        raise EditSpecError(f"feature id(s) {too_big[:5]} >= d_sae {d_sae} of {d}", path=path,
                                            field=f"features.{s}")

    @property
    def toward(self) -> str:
        return self._spec["steer_toward"]

    def swapped(self) -> "SAEClampEdit":
        """The opposite steer: remove the features this edit adds (to their targets) and add those it removes."""
        feats = {s: {"remove": list(f["add"]), "remove_targets": list(f["add_targets"]), "add": list(f["remove"]),
                     "add_targets": list(f["remove_targets"])} for s, f in self._spec["features"].items()}
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
            from steering.sae import load_sae

            self._saes[site] = load_sae(self._spec["sae"][str(site)], base_dir=self.base_dir)
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
        from steering.sae import site_of_hook_name

        hook = _hook_name(sae)
        trained = site_of_hook_name(hook)
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

    def _delta(self, prep: Mapping[str, Any], h: torch.Tensor, strength: Any = None) -> torch.Tensor:
        """The clamp's residual delta for rows ``h``; ``strength``: a float, or one per row (float64 ``[k]``)."""
        s = self.strength if strength is None else strength
        if isinstance(s, torch.Tensor):
            s = s.to(device=h.device, dtype=torch.float32)[:, None]
        x = h.to(torch.float32)
        with torch.no_grad():
            z = prep["sae"].encode(x).to(torch.float32)
        return clamp_delta(z, prep["remove"], s * prep["remove_targets"], prep["W_remove"],
                           prep["add"], s * prep["add_targets"], prep["W_add"])

    def row_appliers(self, width: int, device: torch.device, dtype: torch.dtype) -> dict[int, RowApplier]:
        out = {}
        for s in self.layers:
            prep = self._prepare_site(s, device, width)

            def fn(x: torch.Tensor, where: EditRows, _p: dict = prep) -> torch.Tensor:
                strength = where.scalar if where.scalar is not None else where.strength
                return x + self._delta(_p, x, strength).to(x.dtype)
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
