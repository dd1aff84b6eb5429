"""The SAE and mining jobs (``memtoc sae train``, ``memtoc mine-features``, ``mt.sae_train``, ``mt.mine_features``):
which sites of a store, which dictionaries (``--sae``), and the calls into ``steering.sae`` / ``steering.mining``.
The command line and the Python API are adapters over these functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from steering.mi import MiningError

__all__ = ["parse_sae_arg", "resolve_sae_arg", "run_sae_train", "run_mine_features"]


def _pretrained_ref(item: str, ref: str) -> dict[str, str]:
    parts = ref.split(":", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise MiningError(f"--sae {item!r}: use [SITE=]pretrained:RELEASE:SAE_ID")
    return {"release": parts[1], "sae_id": parts[2]}


def _bare_refs(item: str) -> list[tuple[int, dict[str, str]]]:
    """Site(s) of an SAE reference given without ``SITE=``: a pretrained release's from its hook name (the
    dictionary is loaded through sae-lens' registry and ``blocks.L.hook_resid_post`` becomes site L + 1), a trained
    directory's from its ``memtoc_sae.json``, a folder of ``site_SSS`` directories (``memtoc sae train`` on several
    layers) one per subdirectory."""
    from steering.sae import load_sae, read_sae_meta, site_of_sae

    if item.startswith("pretrained:"):
        ref = _pretrained_ref(item, item)
        return [(site_of_sae(load_sae(ref)), ref)]
    meta = read_sae_meta(item)
    if meta is not None and "site" in meta:
        return [(int(meta["site"]), {"path": item})]
    subs = sorted(Path(item).glob("site_[0-9][0-9][0-9]")) if Path(item).is_dir() else []
    found = [(int(m["site"]), {"path": str(d)}) for d in subs if (m := read_sae_meta(d)) and "site" in m]
    if not found:
        raise MiningError(f"--sae {item!r}: say which site it is for (SITE={item}); it has no memtoc_sae.json")
    return found


def parse_sae_arg(text: str) -> dict[int, dict[str, str]]:
    """``SITE=DIR[,SITE=DIR]`` or ``[SITE=]pretrained:RELEASE:SAE_ID``; a bare ``DIR`` takes its site from the
    directory's ``memtoc_sae.json`` (a folder of ``site_SSS`` SAEs gives one per subdirectory), a bare pretrained
    reference from the hook name the dictionary was trained at (no offset arithmetic for the user)."""
    out: dict[int, dict[str, str]] = {}
    for item in [t.strip() for t in str(text).split(",") if t.strip()]:
        if "=" in item and item.split("=", 1)[0].strip().isdigit():
            site_s, ref = item.split("=", 1)
            pairs = [(int(site_s), _pretrained_ref(item, ref) if ref.startswith("pretrained:") else {"path": ref})]
        else:
            pairs = _bare_refs(item)
        for site, ref_d in pairs:
            if site in out:
                raise MiningError(f"--sae names site {site} twice")
            out[site] = ref_d
    if not out:
        raise MiningError("--sae is empty")
    return out


def resolve_sae_arg(text: str, activations: str, *, fallback: str | None = None, device: str = "cpu",
                    load: Any = None, log: Any = None) -> dict[int, dict[str, str]]:
    """``--sae`` as site references. ``paper[:DICTIONARY]``: the paper's pretrained dictionaries (App. C: Llama
    Scope 12-15, GemmaScope pre-trained 23-26) for the store's model, where they fit the model and the hub (or
    its cache) is reachable; otherwise -- loudly -- ``fallback`` (e.g. the self-trained SAEs of ``sae train``)."""
    import sys

    from memtoc.core.errors import MemtocError
    from memtoc.bench.paper_protocol import parse_paper_spec, pretrained_refs
    from steering.sae import SAEError, load_sae

    is_paper, dictionary = parse_paper_spec(text)
    if not is_paper:
        return parse_sae_arg(text)
    log = log or (lambda m: print(m, file=sys.stderr))
    attrs = _store_attrs(activations)
    try:
        refs = pretrained_refs(attrs.get("architecture"), int(attrs.get("n_layers") or 0), dictionary)
        (load or load_sae)(next(iter(refs.values())), device=device)      # reachable? (downloads or reads the cache)
        log(f"mine-features: the paper's pretrained dictionaries: {refs}")
        return refs
    except (MemtocError, ValueError) as exc:
        if not fallback:
            raise SAEError(f"--sae {text}: {exc}; give --sae-fallback DIR (self-trained SAEs) to mine anyway") from None
        log(f"mine-features: WARNING: FALLBACK to {fallback} (self-trained SAEs), NOT the paper's pretrained "
            f"dictionaries: {exc}")
        return parse_sae_arg(fallback)


def _sites(spec: str, stored: list[int], attrs: Any = None) -> list[int]:
    """Sites of a ``--layers`` value against a store: ``stored`` (every stored site), ``paper[:DICTIONARY]`` (the
    paper's SAE band of the store's model family, ``memtoc.bench.paper_protocol``), or a site list."""
    from activations.capture import parse_layers
    from memtoc.core.errors import MemtocError
    from memtoc.bench.paper_protocol import parse_paper_spec, sae_sites
    from steering.sae import SAEError

    if not stored:
        raise SAEError("the activation store holds no sites")
    if str(spec).strip() == "stored":      # every site the store holds (e.g. the paper band chosen at extract)
        return sorted(stored)
    is_paper, dictionary = parse_paper_spec(spec)
    if is_paper:
        attrs = attrs or {}
        try:
            sites = list(sae_sites(attrs.get("architecture"), int(attrs.get("n_layers") or 0), dictionary))
        except (MemtocError, ValueError) as exc:
            raise SAEError(f"--layers {spec}: {exc}") from None
    else:
        try:
            sites = list(parse_layers(spec, max(stored) + 1))
        except Exception as exc:  # noqa: BLE001 - LayerSpecError and friends: one message
            raise SAEError(str(exc)) from None
    missing = [s for s in sites if s not in stored]
    if missing:
        raise SAEError(f"site(s) {missing} are not stored in the activations; stored sites: {stored}")
    return sites


def _stored_sites(path: str) -> list[int]:
    from activations.store import open_store

    with open_store(path) as st:
        return st.layers


def _store_attrs(path: str) -> dict[str, Any]:
    from activations.store import open_store

    with open_store(path) as st:
        return {k: st.attrs.get(k) for k in ("architecture", "n_layers")}


def _csv(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    return items or None


def run_sae_train(activations: str, layers: str, out: str, *, position_kinds: Sequence[str] | None = None,
                  conditions: Sequence[str] | None = None, **train: Any) -> list[tuple[int, Path]]:
    """One SAE per site of ``layers`` (``stored``, ``paper``, ``N``, ``N-M``, a comma list) trained on the store's
    rows (``steering.sae.train_sae``; ``train``: its options); several sites go to ``OUT/site_SSS``."""
    from steering.sae import train_sae

    sites = _sites(layers, _stored_sites(activations), _store_attrs(activations))
    target = Path(out)
    return [(site, train_sae(activations, site, out_dir=target if len(sites) == 1 else target / f"site_{site:03d}",
                             position_kinds=list(position_kinds or ["all"]),
                             conditions=list(conditions) if conditions else None, **train))
            for site in sites]


def run_mine_features(activations: str, sae: str, *, out: str, layers: str | None = None,
                      sae_fallback: str | None = None, device: str = "cpu", **options: Any) -> Any:
    """Mutual-information mining of the SAE latents over the store (``steering.mining.mine_features``) with the
    dictionaries ``sae`` names; ``options``: :class:`steering.mining.MiningConfig`'s other fields."""
    from steering.mining import MiningConfig, mine_features

    refs = resolve_sae_arg(sae, activations, fallback=sae_fallback, device=device)
    sites = _sites(layers, _stored_sites(activations), _store_attrs(activations)) if layers else None
    return mine_features(MiningConfig(activations=activations, sae=refs, out=out, layers=sites, device=device,
                                      **options))
