"""SAEs through sae-lens: load one (local directory or pretrained release), train a small one on stored
activations, and measure its reconstruction (FVU) on the episodes' own activations.

Everything architectural is sae-lens's (SAE classes, losses, the ``SAETrainer`` loop, saving and loading); this
module only supplies the data: ``SAETrainer`` takes any iterator of ``[batch, d_in]`` tensors, so the HDF5
store is cycled through in shuffled batches. Sites are the activation store's, written into the SAE's metadata
as TransformerLens hook names. A trained SAE directory holds sae-lens's ``cfg.json`` +
``sae_weights.safetensors`` plus ``memtoc_sae.json`` (store identity, site, sizes, seed, steps, final FVU).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from memtoc.backends.parts import site_hook_name
from memtoc.core.errors import MemtocError
from steering.spec import resolve

SAE_META_FILE = "memtoc_sae.json"
SAE_META_SCHEMA = "memtoc-sae-v1"
ARCHITECTURES = ("topk", "standard")


class SAEError(MemtocError):
    """An SAE that cannot be loaded, trained or used as asked (missing files, wrong site, no hub access)."""


# -- sites and hook names ----------------------------------------------------------------------------------

def site_of_hook_name(name: str | None) -> int | None:
    """The store site a residual-stream hook name denotes, or None for anything else (MLP/attention outputs,
    unknown conventions). Understands TransformerLens (``blocks.L.hook_resid_post|pre``, bridge ``hook_out|in``)
    and EleutherAI / HF module names (``layers.L``, ``model.layers.L``) as the block's output (site L + 1), and the
    toolkit's ``site_S``. ``layers.L.mlp``, ``blocks.L.hook_mlp_out``, ``hook_resid_mid`` ... are not sites."""
    if not name:
        return None
    m = re.fullmatch(r"blocks\.(\d+)\.(hook_resid_post|hook_out|hook_resid_pre|hook_in)", name)
    if m:
        layer = int(m.group(1))
        return layer + 1 if m.group(2) in ("hook_resid_post", "hook_out") else layer
    m = re.fullmatch(r"(?:model\.)?layers\.(\d+)(?:\.output)?", name)
    if m:
        return int(m.group(1)) + 1
    m = re.fullmatch(r"site[_.]?(\d+)", name)       # the toolkit's own numbering
    if m:
        return int(m.group(1))
    return None


def site_of_sae(sae: Any) -> int:
    """The store site of an SAE, from the hook name in its config (:func:`site_of_hook_name`); an SAE of a
    non-residual hook (``layers.24.mlp``) is refused: it cannot be applied to the residual stream."""
    hook = sae_hook_name(sae)
    site = site_of_hook_name(hook)
    if site is None:
        raise SAEError(f"the SAE's hook {hook!r} is not a residual-stream site (block output or input); it cannot "
                       "be mapped onto a store site" if hook else
                       "the SAE names no hook (cfg.metadata.hook_name); give its site as SITE=...")
    return site


# -- loading -----------------------------------------------------------------------------------------------

def _import_sae_lens() -> Any:
    try:
        import sae_lens
    except ImportError as exc:  # pragma: no cover - sae-lens is a dependency
        raise SAEError(f"sae-lens is not installed ({exc}); install the toolkit with its steering extra") from None
    return sae_lens


def resolve_sae_path(ref: Mapping[str, Any], base_dir: str | Path | None = None) -> Path:
    return resolve(None if base_dir is None else Path(base_dir), str(ref["path"]))


def load_sae(ref: Mapping[str, Any] | str | Path, *, base_dir: str | Path | None = None, device: str = "cpu") -> Any:
    """An ``sae_lens.SAE`` from ``{"path": DIR}`` (a directory saved by sae-lens; relative paths are taken from
    ``base_dir``) or ``{"release": R, "sae_id": I}`` (``SAE.from_pretrained``: needs the hub or its cache)."""
    if isinstance(ref, (str, Path)):
        ref = {"path": str(ref)}
    sae_lens = _import_sae_lens()
    if "path" in ref:
        path = resolve_sae_path(ref, base_dir)
        if not (path / "cfg.json").is_file() or not (path / "sae_weights.safetensors").is_file():
            raise SAEError(f"{path} is not an SAE directory saved by sae-lens (needs cfg.json and "
                           "sae_weights.safetensors; train one with `memtoc sae train`)")
        try:
            return sae_lens.SAE.load_from_disk(str(path), device=device)
        except Exception as exc:  # noqa: BLE001 - any loader failure is reported with the path
            raise SAEError(f"cannot load the SAE in {path}: {type(exc).__name__}: {exc}") from exc
    if "release" in ref and "sae_id" in ref:
        release, sae_id = str(ref["release"]), str(ref["sae_id"])
        try:
            return sae_lens.SAE.from_pretrained(release, sae_id, device=device)
        except Exception as exc:  # noqa: BLE001 - offline, unknown release, bad id: one actionable message
            raise SAEError(
                f"cannot load the pretrained SAE release {release!r}, sae_id {sae_id!r} "
                f"({type(exc).__name__}: {str(exc)[:300]}). Pretrained releases come from the Hugging Face hub; on a "
                "machine without hub access load it elsewhere, save it with `sae.save_model(DIR)` and refer to it "
                "as {\"path\": DIR}") from exc
    raise SAEError(f"SAE reference {dict(ref)!r} needs 'path', or 'release' and 'sae_id'")


def read_sae_meta(path: str | Path) -> dict[str, Any] | None:
    """The ``memtoc_sae.json`` of a trained SAE directory (None when absent, e.g. a converted release)."""
    f = Path(path) / SAE_META_FILE
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SAEError(f"{f}: corrupt ({exc.msg})") from None


def sae_hook_name(sae: Any) -> str | None:
    meta = getattr(sae.cfg, "metadata", None)
    return None if meta is None else meta.get("hook_name")


def check_sae_site(sae: Any, site: int, d_model: int, *, path: str | Path | None = None) -> None:
    """Refuse an SAE trained on another width or another site than the one it is applied to (the SpARE fork bug
    of reading ``layers.L.mlp`` SAEs into the residual stream)."""
    where = f"the SAE {path}" if path else "the SAE"
    if int(sae.cfg.d_in) != int(d_model):
        raise SAEError(f"{where} has d_in={sae.cfg.d_in} but the activations at site {site} have width {d_model}")
    meta = read_sae_meta(path) if path is not None and Path(path).is_dir() else None
    if meta is not None and int(meta.get("site", site)) != int(site):
        raise SAEError(f"{where} was trained on site {meta['site']} ({meta.get('hook_name')}), not site {site}")
    hook = sae_hook_name(sae)
    hook_site = site_of_hook_name(hook)
    if hook and hook_site is None and meta is None:
        raise SAEError(f"{where} was trained at hook {hook!r}, which is not a residual-stream site; it cannot be "
                       f"applied at site {site}")
    if hook_site is not None and hook_site != int(site):
        raise SAEError(f"{where} was trained at {hook!r} = site {hook_site}, not site {site} "
                       f"({site_hook_name(site)})")


# -- encode / reconstruct / FVU ----------------------------------------------------------------------------

def _batches(n: int, size: int) -> Iterator[slice]:
    for i in range(0, n, size):
        yield slice(i, min(i + size, n))


def _map_rows(sae: Any, x: Any, fn: Callable[[Any], Any], width: int | None, batch_size: int) -> np.ndarray:
    """``fn`` of the SAE's dtype and device over rows of ``x`` in batches -> float32 ``[n, width]`` numpy array."""
    import torch

    x = np.asarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], x.shape[1] if width is None else width), dtype=np.float32)
    dtype = getattr(sae, "dtype", torch.float32)
    with torch.no_grad():
        for sl in _batches(x.shape[0], batch_size):
            out[sl] = fn(torch.from_numpy(x[sl]).to(device=sae.device, dtype=dtype)).float().cpu().numpy()
    return out


def encode(sae: Any, x: Any, *, batch_size: int = 4096) -> np.ndarray:
    """``sae.encode`` over rows of ``x`` in batches -> float32 ``[n, d_sae]`` numpy array."""
    def dense(t: Any) -> Any:
        z = sae.encode(t)
        return z.to_dense() if z.is_sparse else z

    return _map_rows(sae, x, dense, int(sae.cfg.d_sae), batch_size)


def reconstruct(sae: Any, x: Any, *, batch_size: int = 4096) -> np.ndarray:
    """``sae.decode(sae.encode(x))`` (no error term) -> float32 numpy array."""
    return _map_rows(sae, x, lambda t: sae.decode(sae.encode(t)), None, batch_size)


def fvu(sae: Any, x: Any, *, batch_size: int = 4096) -> float:
    """Fraction of variance unexplained: ``sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`` over the rows of ``x``
    (float64 sums; ``mean`` is the per-dimension mean over these rows). 0 = perfect, 1 = no better than the mean.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] < 2:
        raise SAEError(f"FVU needs at least 2 activation rows, got shape {x.shape}")
    resid = 0.0
    for sl in _batches(x.shape[0], batch_size):
        d = x[sl].astype(np.float64) - reconstruct(sae, x[sl], batch_size=batch_size).astype(np.float64)
        resid += float(np.einsum("ij,ij->", d, d))
    xd = x.astype(np.float64)
    total = float(np.einsum("ij,ij->", xd - xd.mean(0), xd - xd.mean(0)))
    if total <= 0:
        raise SAEError("FVU is undefined: the activation rows have zero variance")
    return resid / total


def mean_l0(sae: Any, x: Any, *, batch_size: int = 4096) -> float:
    z = encode(sae, x, batch_size=batch_size)
    return float((z != 0).sum(1).mean()) if len(z) else 0.0


# -- activations from the store ----------------------------------------------------------------------------

def store_rows(store: Any, *, position_kinds: Sequence[str] = ("all",), conditions: Sequence[str] | None = None,
               question_ids: Sequence[str] | None = None, skip_first: int = 1) -> np.ndarray:
    """Row numbers of a store with the given position kinds (and conditions / questions), without the first
    ``skip_first`` tokens of each prompt (the BOS / attention-sink position that SAEs reconstruct badly)."""
    idx = store.index
    mask = np.isin(idx["position_kind"], list(position_kinds))
    if conditions is not None:
        mask &= np.isin(idx["condition"], list(conditions))
    if question_ids is not None:
        mask &= np.isin(idx["question_id"], list(question_ids))
    if skip_first:
        mask &= idx["token_index"] >= int(skip_first)
    return np.flatnonzero(mask)


def store_fingerprint(store: Any) -> dict[str, Any]:
    attrs = store.attrs
    keep = ("identity_sha256", "model_id", "weights_sha256", "architecture", "benchmark", "prompt_version",
            "n_rows", "n_episodes", "created_utc", "storage_dtype")
    return {"path": str(Path(store.path).resolve()), **{k: attrs.get(k) for k in keep if k in attrs}}


# -- training ----------------------------------------------------------------------------------------------

def _shuffled_batches(x: Any, batch_size: int, seed: int) -> Iterator[Any]:
    """Infinite iterator of ``[batch, d]`` tensors: each epoch is a fresh seeded permutation of the rows."""
    import torch

    g = torch.Generator().manual_seed(int(seed))
    n = x.shape[0]
    while True:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n - batch_size + 1, batch_size):
            yield x[perm[i:i + batch_size]]


def _split_episodes(episode_ids: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of validation rows: whole episodes (prompt tokens of one episode never straddle the split)."""
    uniq = np.unique(episode_ids)
    n_val = int(round(len(uniq) * val_fraction))
    if val_fraction <= 0 or len(uniq) < 5 or n_val < 1:
        return np.zeros(len(episode_ids), dtype=bool)
    rng = np.random.default_rng(seed)
    val_eps = rng.permutation(uniq)[:n_val]
    return np.isin(episode_ids, val_eps)


def fit_sae(x_train: np.ndarray, *, d_sae: int | None = None, architecture: str = "topk", k: int = 32,
            l1_coefficient: float = 5.0, steps: int = 2000, batch_size: int = 512, lr: float = 5e-4, seed: int = 0,
            normalize: bool = True, device: str = "cpu", num_threads: int | None = None,
            metadata: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """Train a sae-lens training SAE on the rows of ``x_train`` with ``SAETrainer`` -> ``(sae, trainer)``.

    Seeded shuffled batches and weights (the caller's RNG state is restored); the decoder bias starts at the data
    mean. ``normalize``: inputs scaled to mean norm sqrt(d_in) by a factor computed exactly from all rows and
    folded into the weights at the end of ``fit``.
    """
    import torch

    sae_lens = _import_sae_lens()
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.training.sae_trainer import SAETrainer

    if architecture not in ARCHITECTURES:
        raise SAEError(f"unknown SAE architecture {architecture!r}; choose {', '.join(ARCHITECTURES)}")
    if steps < 1 or batch_size < 1:
        raise SAEError(f"--steps and --batch-size must be at least 1 (got {steps}, {batch_size})")
    x_train = np.ascontiguousarray(np.asarray(x_train, dtype=np.float32))
    if x_train.ndim != 2 or x_train.shape[0] < 2:
        raise SAEError(f"training needs at least 2 activation rows, got shape {x_train.shape}")
    d_in = int(x_train.shape[1])
    d_sae = int(d_sae or 4 * d_in)
    if architecture == "topk" and not 1 <= k <= d_sae:
        raise SAEError(f"k={k} must be between 1 and d_sae={d_sae}")
    batch = min(int(batch_size), len(x_train))
    scale = float(d_in ** 0.5 / np.linalg.norm(x_train, axis=1).mean()) if normalize else None
    common = dict(d_in=d_in, d_sae=d_sae, device=device,
                  normalize_activations="expected_average_only_in" if normalize else "none")
    threads_before = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(int(num_threads))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            if architecture == "topk":
                sae = sae_lens.TopKTrainingSAE(sae_lens.TopKTrainingSAEConfig(k=int(k), **common))
            else:
                sae = sae_lens.StandardTrainingSAE(sae_lens.StandardTrainingSAEConfig(
                    l1_coefficient=float(l1_coefficient), **common))
            for key, value in (metadata or {}).items():
                sae.cfg.metadata[key] = value
            with torch.no_grad():  # decoder bias starts at the data mean (in the scaled space the trainer sees)
                sae.b_dec.data.copy_(torch.from_numpy(x_train.mean(0) * (scale or 1.0)).to(sae.b_dec.dtype))
            trainer_cfg = SAETrainerConfig(total_training_samples=int(steps) * batch, train_batch_size_samples=batch,
                                           lr=float(lr), lr_end=float(lr), device=device,
                                           logger=LoggingConfig(log_to_wandb=False),
                                           dead_feature_window=max(50, min(1000, steps // 4)),
                                           feature_sampling_window=max(100, steps))
            provider = _shuffled_batches(torch.from_numpy(x_train), batch, seed)
            trainer = SAETrainer(cfg=trainer_cfg, sae=sae, data_provider=provider)
            if scale is not None:
                trainer.activation_scaler.scaling_factor = scale   # exact, from every training row (not estimated)
            sae = trainer.fit()
    finally:
        torch.set_num_threads(threads_before)
    sae.eval()
    return sae, trainer


def train_sae(store_path: str | Path, site: int, *, out_dir: str | Path, d_sae: int | None = None,
              architecture: str = "topk", k: int = 32, l1_coefficient: float = 5.0, steps: int = 2000,
              batch_size: int = 512, lr: float = 5e-4, seed: int = 0, position_kinds: Sequence[str] = ("all",),
              conditions: Sequence[str] | None = None, skip_first: int = 1, val_fraction: float = 0.1,
              max_rows: int | None = 500_000, normalize: bool = True, device: str = "cpu", overwrite: bool = False,
              num_threads: int | None = None, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Path:
    """Train an SAE for one site on the store's activations with sae-lens and save it to ``out_dir``.

    ``architecture``: ``topk`` (``k`` active latents) or ``standard`` (ReLU + L1 ``l1_coefficient``); ``d_sae``
    defaults to 4 x d_in. Training rows: the store's rows of ``position_kinds`` minus the first ``skip_first``
    tokens, at most ``max_rows`` (a seeded sample); ``val_fraction`` of the episodes is held out for the FVU.
    ``normalize``: see :func:`fit_sae` (the saved SAE takes raw activations). Returns ``out_dir``.
    """
    from activations.store import open_store

    sae_lens = _import_sae_lens()
    if architecture not in ARCHITECTURES:
        raise SAEError(f"unknown SAE architecture {architecture!r}; choose {', '.join(ARCHITECTURES)}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise SAEError(f"{out_dir} exists and is not empty; use another --out or --overwrite")
    t0 = time.time()
    with open_store(store_path) as store:
        if int(site) not in store.layers:
            raise SAEError(f"site {site} is not stored in {store_path}; stored sites: {store.layers}")
        kinds_present = sorted(set(store.index["position_kind"].tolist()))
        rows = store_rows(store, position_kinds=position_kinds, conditions=conditions, skip_first=skip_first)
        if len(rows) < 2:
            raise SAEError(f"{store_path} has {len(rows)} rows of position kind(s) {', '.join(position_kinds)} "
                           f"(present: {', '.join(kinds_present) or 'none'}); extract with --position-kinds all")
        if max_rows is not None and len(rows) > max_rows:
            rows = np.sort(np.random.default_rng(seed).choice(rows, size=int(max_rows), replace=False))
        x = store.read(int(site), rows)
        episode_ids = store.index["episode_id"][rows]
        fingerprint = store_fingerprint(store)
        model_id = store.attrs.get("model_id")
    if not np.all(np.isfinite(x)):
        raise SAEError(f"site {site}: the stored activations contain non-finite values")
    val_mask = _split_episodes(episode_ids, val_fraction, seed)
    x_train, x_val = x[~val_mask], x[val_mask]
    d_in = int(x.shape[1])
    d_sae = int(d_sae or 4 * d_in)
    sae, trainer = fit_sae(x_train, d_sae=d_sae, architecture=architecture, k=k, l1_coefficient=l1_coefficient,
                           steps=steps, batch_size=batch_size, lr=lr, seed=seed, normalize=normalize, device=device,
                           num_threads=num_threads,
                           metadata={"model_name": model_id, "hook_name": site_hook_name(site)})
    batch = int(trainer.cfg.train_batch_size_samples)
    scale = float(d_in ** 0.5 / np.linalg.norm(x_train, axis=1).mean()) if normalize else None

    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    sae.save_inference_model(str(tmp))
    saved = load_sae({"path": str(tmp)}, device=device)       # what every consumer will load
    fvu_train = fvu(saved, x_train)
    fvu_val = fvu(saved, x_val) if len(x_val) >= 2 else None
    meta = {
        "schema_version": SAE_META_SCHEMA, "site": int(site), "hook_name": site_hook_name(site),
        "site_convention": "site 0 = embedding output; site s = output of block s-1 (pre final norm)",
        "store": fingerprint, "position_kinds": list(position_kinds), "conditions": list(conditions or []) or None,
        "skip_first": int(skip_first), "d_in": d_in, "d_sae": d_sae, "architecture": architecture,
        "k": int(k) if architecture == "topk" else None,
        "l1_coefficient": float(l1_coefficient) if architecture == "standard" else None,
        "seed": int(seed), "steps": int(steps), "batch_size": batch, "lr": float(lr),
        "normalize_scale": scale, "n_train_rows": int(len(x_train)), "n_val_rows": int(len(x_val)),
        "n_val_episodes": int(len(np.unique(episode_ids[val_mask]))),
        "fvu_train": fvu_train, "fvu_val": fvu_val, "fvu": fvu_val if fvu_val is not None else fvu_train,
        "l0_train": mean_l0(saved, x_train[:20000]),
        "dead_features": int(trainer.dead_neurons.sum().item()),
        "trainer": "sae_lens.training.sae_trainer.SAETrainer", "sae_lens_version": sae_lens.__version__,
        "seconds": round(time.time() - t0, 2), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (tmp / SAE_META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out_dir)
    log(f"site {site}: SAE ({architecture}, d_sae={d_sae}) trained on {len(x_train)} rows in {meta['seconds']} s; "
        f"FVU train {fvu_train:.4f}" + (f", held-out {fvu_val:.4f}" if fvu_val is not None else "")
        + f" -> {out_dir}")
    return out_dir


# -- FVU report over a store -------------------------------------------------------------------------------

def store_fvu(sae_refs: Mapping[int, Any], store_path: str | Path, *, position_kinds: Sequence[str] = ("all",),
              conditions: Sequence[str] | None = None, question_ids: Sequence[str] | None = None,
              skip_first: int = 1, check_site: bool = True) -> dict[int, dict[str, Any]]:
    """FVU of each site's SAE on the store's rows of ``position_kinds`` (``sae_refs``: site -> ref or SAE).
    Default: the paper's gate, full-sequence FVU without the first token, as in training."""
    from activations.store import open_store

    out: dict[int, dict[str, Any]] = {}
    with open_store(store_path) as store:
        rows = store_rows(store, position_kinds=position_kinds, conditions=conditions, question_ids=question_ids,
                          skip_first=skip_first)
        if len(rows) < 2:
            present = sorted(set(store.index["position_kind"].tolist()))
            raise SAEError(f"{store_path} has {len(rows)} rows of position kind(s) {', '.join(position_kinds)} "
                           f"(present: {', '.join(present) or 'none'})")
        for site, ref in sae_refs.items():
            if int(site) not in store.layers:
                raise SAEError(f"site {site} is not stored in {store_path}; stored sites: {store.layers}")
            sae = ref if hasattr(ref, "encode") else load_sae(ref)
            path = ref.get("path") if isinstance(ref, Mapping) else None
            if check_site:
                check_sae_site(sae, int(site), store.d_model, path=path)
            x = store.read(int(site), rows)
            out[int(site)] = {"fvu": fvu(sae, x), "n_rows": int(len(rows)), "l0": mean_l0(sae, x),
                              "sae": str(path) if path else None}
    return out
