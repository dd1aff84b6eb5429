"""The SAE and mining jobs (``memtoc sae train``, ``memtoc mine-features``, ``mt.sae_train``, ``mt.mine_features``):
which sites of a store, which dictionaries (``--sae``), and the calls into ``steering.sae`` / ``steering.mining``.
The command line and the Python API are adapters over these functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.options import opt

__all__ = ["parse_sae_arg", "resolve_sae_arg", "SaeTrainConfig", "SaeFvuConfig", "SaeFvuResult", "MineFeaturesConfig",
           "run_sae_train", "run_sae_fvu", "run_mine_features"]


def _mining_error(message: str) -> Exception:
    """``steering.mi.MiningError`` (imported here: the steering package loads torch, which ``--help`` must not)."""
    from steering.mi import MiningError

    return MiningError(message)


def _pretrained_ref(item: str, ref: str) -> dict[str, str]:
    parts = ref.split(":", 2)
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise _mining_error(f"--sae {item!r}: use [SITE=]pretrained:RELEASE:SAE_ID")
    return {"release": parts[1], "sae_id": parts[2]}


def _bare_refs(item: str) -> list[tuple[int, dict[str, str]]]:
    """Site(s) of an SAE reference given without ``SITE=``: a pretrained release's from its hook name
    (``blocks.L.hook_resid_post`` is site L + 1), a trained directory's from its ``memtoc_sae.json``, a folder of
    ``site_SSS`` directories one per subdirectory."""
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
        raise _mining_error(f"--sae {item!r}: say which site it is for (SITE={item}); it has no memtoc_sae.json")
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
                raise _mining_error(f"--sae names site {site} twice")
            out[site] = ref_d
    if not out:
        raise _mining_error("--sae is empty")
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


@dataclass
class SaeTrainConfig:
    """``memtoc sae train``: one SAE per site on an activation store (sae-lens SAETrainer)."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"activations": "input-store", "out": "output-dir"}

    activations: str = field(default="", metadata=opt(
        "HDF5 activation store (memtoc extract --position-kinds all)", required=True, path=True))
    layers: str = field(default="", metadata=opt(
        "sites: N, N-M, comma list (0 = embedding output, s = block s-1), 'stored' (every stored site) or "
        "'paper[:DICTIONARY]' (the MemToC paper's SAE band of the model family)", required=True))
    d_sae: int | None = field(default=None, metadata=opt("number of latents (default 4 x d_model)"))
    architecture: str = field(default="topk", metadata=opt(
        "topk (k active features) or standard (ReLU with an L1 penalty); both sae-lens", choices=("topk", "standard")))
    k: int = field(default=32, metadata=opt("topk: active latents per token", low=1))
    l1_coefficient: float = field(default=5.0, metadata=opt("standard: L1 penalty"))
    steps: int = field(default=2000, metadata=opt("training steps"))
    batch_size: int = field(default=512, metadata=opt("activation rows per step"))
    lr: float = field(default=5e-4, metadata=opt("learning rate", low=0, above=True))
    seed: int = field(default=0, metadata=opt("torch seed of the training"))
    position_kinds: str = field(default="all", metadata=opt(
        "comma list of the store's position kinds to train on"))
    conditions: str | None = field(default=None, metadata=opt(
        "comma list of conditions (default: every stored row)"))
    skip_first: int = field(default=1, metadata=opt("drop the first N tokens of each prompt (BOS/sink)", low=0))
    val_fraction: float = field(default=0.1, metadata=opt("share of episodes held out for the FVU report"))
    max_rows: int | None = field(default=500_000, metadata=opt("train on at most N rows (seeded sample)"))
    normalize: bool = field(default=True, metadata=opt(
        "train on raw activations (default: scaled to mean norm sqrt(d), folded back into the saved weights)"))
    device: str = field(default="cpu", metadata=opt("cpu | cuda | cuda:N"))
    threads: int | None = field(default=None, metadata=opt("torch CPU threads while training (small SAEs: 1)"))
    overwrite: bool = field(default=False, metadata=opt(
        "replace an existing SAE directory instead of refusing"))
    out: str = field(default="sae", metadata=opt(
        "SAE directory (one site), or the parent of site_NNN/ directories (several sites)", required=True,
        path=True))

    def __post_init__(self) -> None:
        """Numeric options no training can use, refused when the options are read (before the store is opened),
        one line naming the option."""
        from memtoc.core.checks import OptionValueError, check_int
        from memtoc.jobs import is_finite

        for flag, value in (("--steps", self.steps), ("--batch-size", self.batch_size), ("--k", self.k)):
            check_int(value, flag)
        for flag, value in (("--d-sae", self.d_sae), ("--threads", self.threads), ("--max-rows", self.max_rows)):
            if value is not None:
                check_int(value, flag)
        if not is_finite(self.l1_coefficient) or self.l1_coefficient < 0:
            raise OptionValueError(f"--l1-coefficient {self.l1_coefficient!r}: must be a finite number >= 0")
        if isinstance(self.val_fraction, bool) or not isinstance(self.val_fraction, (int, float)) \
                or not 0 <= self.val_fraction < 1:
            raise OptionValueError(f"--val-fraction {self.val_fraction!r}: must be in [0, 1) (the share of "
                                   "episodes held out)")


@dataclass
class SaeFvuConfig:
    """``memtoc sae fvu``: FVU = sum ||x - x_hat||^2 / sum ||x - mean x||^2 per site, with a gate."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"activations": "input-store", "out": "output"}

    sae: str = field(default="", metadata=opt(
        "an SAE directory, or SITE=DIR[,SITE=DIR], or SITE=pretrained:R:ID", required=True))
    activations: str = field(default="", metadata=opt(
        "HDF5 store (memtoc extract) to measure the reconstruction on", required=True, path=True))
    layers: str | None = field(default=None, metadata=opt("sites to evaluate (default: the SAE's own site)"))
    position_kinds: str = field(default="all", metadata=opt(
        "rows to measure on: all = the full prompt sequences (the paper's gate); last_input = the older last-input "
        "gate"))
    conditions: str | None = field(default=None, metadata=opt(
        "comma list of conditions whose rows are measured (default: every row)"))
    skip_first: int = field(default=1, metadata=opt("leave out the first N tokens of each prompt (BOS)", low=0))
    threshold: float = field(default=0.5, metadata=opt(
        "highest fraction of variance unexplained that passes the gate"))
    allow_other_site: bool = field(default=False, metadata=opt(
        "evaluate an SAE at a site it was not trained on"))
    out: str | None = field(default=None, metadata=opt("also write the report as JSON", path=True))


@dataclass
class SaeFvuResult:
    report: dict[int, dict[str, Any]]    # site -> {"fvu", "l0", "n_rows", "sae"}
    threshold: float

    @property
    def failed(self) -> list[int]:
        """The sites whose FVU is above the gate."""
        return [s for s, r in sorted(self.report.items()) if not r["fvu"] <= self.threshold]


@dataclass
class MineFeaturesConfig:
    """``memtoc mine-features``: SpARE feature mining, SAE latents that separate kept-memory from followed-tool."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"activations": "input-store", "run": "input-run", "out": "output-dir"}

    activations: str = field(default="", metadata=opt(
        "HDF5 store with rows of --position-kinds (and 'all' rows for the top-activating tokens)", required=True,
        path=True))
    run: str | None = field(default=None, metadata=opt(
        "evaluation run whose outcomes label the episodes (default: the store's labels joined by extract --run)",
        path=True))
    sae: str = field(default="", metadata=opt(
        "SITE=DIR[,SITE=DIR] or SITE=pretrained:RELEASE:SAE_ID, or 'paper[:DICTIONARY]' = the MemToC paper's "
        "pretrained dictionaries for the store's model (App. C), falling back loudly to --sae-fallback where they "
        "do not fit the model or the hub is unreachable", required=True))
    sae_fallback: str | None = field(default=None, metadata=opt(
        "SAEs to mine with when --sae paper cannot be used (e.g. the directory of `memtoc sae train`)"))
    layers: str | None = field(default=None, metadata=opt(
        "sites to mine (default: every site given in --sae); 'paper' / 'paper:DICTIONARY' = the MemToC paper's SAE "
        "band of the store's model family; 'stored'"))
    position_kinds: str = field(default="last_input", metadata=opt("store rows the statistics use"))
    benchmark: str = field(default="demo", metadata=opt("benchmark of the store's episodes (for its folds)",
                                                        path=True))
    fit_fold: str = field(default="", metadata=opt(
        "fold whose questions are mined (held out from evaluation)", required=True))
    eval_fold: str | None = field(default=None, metadata=opt(
        "evaluation fold(s) that must not meet the fit fold (default: every other fold)"))
    budget: float = field(default=0.5, metadata=opt(
        "cumulative-MI proportion K (default 0.5, the MemToC paper's headline run, +0.25 tool-ward; 0.7 its "
        "widening run; 0.07 SpARE's ODQA value)"))
    steer_toward: str = field(default="memory", metadata=opt(
        "the behaviour the written edit pushes toward", choices=("memory", "tool")))
    edit_positions: str = field(default="last_input", metadata=opt(
        "edit positions: last_input | tool_span (the paper's tool-output-span probe) | from_tool_return"))
    strength: float = field(default=1.0, metadata=opt("strength of the written edit"))
    mi_estimator: str = field(default="knn", metadata=opt(
        "knn = sklearn mutual_info_classif; knn-fast = the same estimator vectorized (use for 10k+ latents); "
        "binned = plug-in MI over quantile bins", choices=("knn", "knn-fast", "binned")))
    n_neighbors: int = field(default=3, metadata=opt("neighbours of the k-NN mutual-information estimator"))
    n_bins: int = field(default=8, metadata=opt("bins of the binned mutual-information estimator"))
    seed: int = field(default=0, metadata=opt("random_state of the MI estimator"))
    top_tokens: int = field(default=8, metadata=opt("tokens listed per feature (its strongest activations)"))
    min_per_class: int = field(default=2, metadata=opt(
        "fewest kept-memory and followed-tool episodes each needed in the fit fold"))
    fvu_threshold: float = field(default=0.5, metadata=opt(
        "highest fraction of variance unexplained an SAE may have to be used"))
    fvu_rows: str = field(default="sequence", metadata=opt(
        "gate rows: every prompt token of the mined episodes (the paper's full-sequence FVU) or the last-input "
        "mining rows", choices=("sequence", "last_input")))
    fvu_skip_first: int = field(default=1, metadata=opt("sequence gate: leave out the first N tokens", low=0))
    name: str | None = field(default=None, metadata=opt(
        "name of the written edit (default: derived from the sites)"))
    device: str = field(default="cpu", metadata=opt("cpu | cuda | cuda:N (SAE encoding)"))
    out: str = field(default="mine", metadata=opt(
        "directory for edit.json, features.csv/.md, mining.json", required=True, path=True))


def run_sae_train(cfg: SaeTrainConfig) -> list[tuple[int, Path]]:
    """One SAE per site of ``cfg.layers`` (``stored``, ``paper``, ``N``, ``N-M``, a comma list) trained on the
    store's rows (``steering.sae.train_sae``); several sites go to ``OUT/site_SSS``. Returns (site, directory)."""
    from steering.sae import train_sae

    sites = _sites(cfg.layers, _stored_sites(cfg.activations), _store_attrs(cfg.activations))
    target = Path(cfg.out)
    train = dict(d_sae=cfg.d_sae, architecture=cfg.architecture, k=cfg.k, l1_coefficient=cfg.l1_coefficient,
                 steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, skip_first=cfg.skip_first,
                 val_fraction=cfg.val_fraction, max_rows=cfg.max_rows, normalize=cfg.normalize, device=cfg.device,
                 overwrite=cfg.overwrite, num_threads=cfg.threads)
    return [(site, train_sae(cfg.activations, site,
                             out_dir=target if len(sites) == 1 else target / f"site_{site:03d}",
                             position_kinds=_csv(cfg.position_kinds) or ["all"], conditions=_csv(cfg.conditions),
                             **train))
            for site in sites]


def run_sae_fvu(cfg: SaeFvuConfig) -> SaeFvuResult:
    """The FVU (and L0) of the SAE(s) ``cfg.sae`` on the store's rows, per site; written to ``cfg.out`` as JSON
    when given. The sites: ``cfg.layers``, else those named in ``cfg.sae``, else the SAE directory's own site."""
    from memtoc.core.fileio import check_outputs, write_json_atomic
    from steering.sae import SAEError, read_sae_meta, store_fvu

    check_outputs({"--out": cfg.out}, [cfg.activations])
    stored = _stored_sites(cfg.activations)
    if "=" in cfg.sae or "pretrained:" in cfg.sae:
        refs = parse_sae_arg(cfg.sae)
        sites = _sites(cfg.layers, stored) if cfg.layers else sorted(refs)
        missing = [s for s in sites if s not in refs]
        if missing:
            raise SAEError(f"no SAE for site(s) {missing} in --sae")
        refs = {s: refs[s] for s in sites}
    else:
        meta = read_sae_meta(cfg.sae) or {}
        sites = _sites(cfg.layers, stored) if cfg.layers else ([int(meta["site"])] if "site" in meta else None)
        if not sites:
            raise SAEError(f"--layers is needed: {cfg.sae} has no memtoc_sae.json naming its site")
        refs = {s: {"path": cfg.sae} for s in sites}
    report = store_fvu(refs, cfg.activations, position_kinds=_csv(cfg.position_kinds) or ["all"],
                       conditions=_csv(cfg.conditions), skip_first=cfg.skip_first,
                       check_site=not cfg.allow_other_site)
    if cfg.out:
        write_json_atomic(cfg.out, {str(k): v for k, v in report.items()})
    return SaeFvuResult(report, cfg.threshold)


def run_mine_features(cfg: MineFeaturesConfig) -> Any:
    """Mutual-information mining of the SAE latents over the store (``steering.mining.mine_features``) with the
    dictionaries ``cfg.sae`` names (``paper``: the paper's, ``cfg.sae_fallback`` where they cannot be used)."""
    from steering.mining import MiningConfig, mine_features

    refs = resolve_sae_arg(cfg.sae, cfg.activations, fallback=cfg.sae_fallback, device=cfg.device)
    sites = (_sites(cfg.layers, _stored_sites(cfg.activations), _store_attrs(cfg.activations))
             if cfg.layers else None)
    return mine_features(MiningConfig(
        activations=cfg.activations, sae=refs, out=cfg.out, layers=sites, device=cfg.device, fit_fold=cfg.fit_fold,
        run=cfg.run, position_kind=cfg.position_kinds, benchmark=cfg.benchmark, eval_folds=_csv(cfg.eval_fold),
        budget=cfg.budget, steer_toward=cfg.steer_toward, positions=cfg.edit_positions, strength=cfg.strength,
        estimator=cfg.mi_estimator, n_neighbors=cfg.n_neighbors, seed=cfg.seed, n_bins=cfg.n_bins,
        top_tokens=cfg.top_tokens, min_per_class=cfg.min_per_class, fvu_threshold=cfg.fvu_threshold,
        fvu_rows=cfg.fvu_rows, fvu_skip_first=cfg.fvu_skip_first, name=cfg.name))
