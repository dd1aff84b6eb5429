"""``memtoc sae train|fvu`` and ``memtoc mine-features``: thin layers over ``steering.sae`` and ``steering.mining``
(and the parsing of their ``--sae`` option)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from steering.mi import MiningError


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


def cmd_sae_train(args: argparse.Namespace) -> int:
    from steering.sae import train_sae

    sites = _sites(args.layers, _stored_sites(args.activations), _store_attrs(args.activations))
    out = Path(args.out)
    paths = []
    for site in sites:
        target = out if len(sites) == 1 else out / f"site_{site:03d}"
        paths.append((site, train_sae(
            args.activations, site, out_dir=target, d_sae=args.d_sae, architecture=args.architecture, k=args.k,
            l1_coefficient=args.l1_coefficient, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
            seed=args.seed, position_kinds=_csv(args.position_kinds) or ["all"], conditions=_csv(args.conditions),
            skip_first=args.skip_first, val_fraction=args.val_fraction, max_rows=args.max_rows,
            normalize=not args.no_normalize, device=args.device, overwrite=args.overwrite,
            num_threads=args.threads)))
    print("use with mine-features: --sae " + ",".join(f"{s}={p}" for s, p in paths))
    return 0


def cmd_sae_fvu(args: argparse.Namespace) -> int:
    from steering.sae import read_sae_meta, store_fvu

    stored = _stored_sites(args.activations)
    if "=" in args.sae or "pretrained:" in args.sae:
        refs = parse_sae_arg(args.sae)
        sites = _sites(args.layers, stored) if args.layers else sorted(refs)
        missing = [s for s in sites if s not in refs]
        if missing:
            from steering.sae import SAEError
            raise SAEError(f"no SAE for site(s) {missing} in --sae")
        refs = {s: refs[s] for s in sites}
    else:
        meta = read_sae_meta(args.sae) or {}
        sites = _sites(args.layers, stored) if args.layers else ([int(meta["site"])] if "site" in meta else None)
        if not sites:
            from steering.sae import SAEError
            raise SAEError(f"--layers is needed: {args.sae} has no memtoc_sae.json naming its site")
        refs = {s: {"path": args.sae} for s in sites}
    report = store_fvu(refs, args.activations, position_kinds=_csv(args.position_kinds) or ["all"],
                       conditions=_csv(args.conditions), skip_first=args.skip_first,
                       check_site=not args.allow_other_site)
    print(f"{'site':>4}  {'FVU':>8}  {'L0':>7}  {'rows':>6}  gate (FVU <= {args.threshold})  SAE")
    failed = 0
    for site, r in sorted(report.items()):
        ok = r["fvu"] <= args.threshold
        failed += not ok
        gate = "pass" if ok else "FAIL"
        print(f"{site:>4}  {r['fvu']:>8.4f}  {r['l0']:>7.1f}  {r['n_rows']:>6}  {gate:<20}  {r['sae']}")
    if args.output:
        from memtoc.core.fileio import write_json_atomic

        write_json_atomic(args.output, {str(k): v for k, v in report.items()})
    return 1 if failed else 0


def cmd_mine(args: argparse.Namespace) -> int:
    from steering.mining import MiningConfig, mine_features

    refs = parse_sae_arg(args.sae)
    layers = (_sites(args.layers, _stored_sites(args.activations), _store_attrs(args.activations))
              if args.layers else None)
    cfg = MiningConfig(activations=args.activations, sae=refs, fit_fold=args.fit_fold, out=args.out, run=args.run,
                       layers=layers, position_kind=args.position_kind, benchmark=args.benchmark,
                       eval_folds=_csv(args.eval_fold), budget=args.budget, steer_toward=args.steer_toward,
                       positions=args.positions, strength=args.strength, estimator=args.mi_estimator,
                       n_neighbors=args.n_neighbors, seed=args.seed, n_bins=args.n_bins,
                       top_tokens=args.top_tokens, min_per_class=args.min_per_class,
                       fvu_threshold=args.fvu_threshold, fvu_rows=args.fvu_rows,
                       fvu_skip_first=args.fvu_skip_first, name=args.name, device=args.device)
    res = mine_features(cfg)
    print((Path(args.out) / "features.md").read_text(encoding="utf-8").split("\n| site | feature")[0].rstrip())
    print(f"\nedit spec: {res.spec_path}\n" + json.dumps({k: res.spec[k] for k in ("name", "layers", "positions",
                                                                                   "steer_toward", "fvu")}))
    return 0


def add_mining_parsers(subparsers: Any) -> None:
    """Register ``sae`` (``train``, ``fvu``) and ``mine-features`` on ``memtoc``'s subparsers."""
    p = subparsers.add_parser("sae", help="train a small SAE on stored activations (sae-lens) or measure an SAE's FVU")
    sub = p.add_subparsers(dest="sae_command", required=True)

    t = sub.add_parser("train", help="train one SAE per site on an activation store (sae-lens SAETrainer)",
                       description="Train a TopK (or standard ReLU+L1) SAE with sae-lens on the store's rows of the "
                                   "given position kinds (default: full prompt sequences, kind 'all'). One layer "
                                   "writes --out itself; several write --out/site_SSS. See docs/sae_mining.md.")
    t.add_argument("--activations", required=True, help="HDF5 activation store (memtoc extract --positions all)")
    t.add_argument("--layers", required=True, help="sites: N, N-M, comma list (0 = embedding output, s = block s-1), "
                   "'stored' (every stored site) or 'paper[:DICTIONARY]' (the MemToC paper's SAE band of the model "
                   "family)")
    t.add_argument("--d-sae", type=int, default=None, help="number of latents (default 4 x d_model)")
    t.add_argument("--architecture", choices=("topk", "standard"), default="topk")
    t.add_argument("--k", type=int, default=32, help="topk: active latents per token")
    t.add_argument("--l1-coefficient", type=float, default=5.0, help="standard: L1 penalty")
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--batch-size", type=int, default=512)
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--position-kinds", default="all", help="comma list of the store's position kinds to train on")
    t.add_argument("--conditions", default=None, help="comma list of conditions (default: every stored row)")
    t.add_argument("--skip-first", type=int, default=1, help="drop the first N tokens of each prompt (BOS/sink)")
    t.add_argument("--val-fraction", type=float, default=0.1, help="share of episodes held out for the FVU report")
    t.add_argument("--max-rows", type=int, default=500_000, help="train on at most N rows (seeded sample)")
    t.add_argument("--no-normalize", action="store_true", help="train on raw activations (default: scaled to mean "
                   "norm sqrt(d), folded back into the saved weights)")
    t.add_argument("--device", default="cpu")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads while training (small SAEs: 1)")
    t.add_argument("--overwrite", action="store_true")
    t.add_argument("--out", required=True)
    t.set_defaults(func=cmd_sae_train)

    f = sub.add_parser("fvu", help="fraction of variance unexplained of an SAE on the episodes' activations",
                       description="FVU = sum ||x - x_hat||^2 / sum ||x - mean x||^2 per site; exit status 1 when a "
                                   "site fails the gate.")
    f.add_argument("--sae", required=True, help="an SAE directory, or SITE=DIR[,SITE=DIR], or SITE=pretrained:R:ID")
    f.add_argument("--activations", required=True)
    f.add_argument("--layers", default=None, help="sites to evaluate (default: the SAE's own site)")
    f.add_argument("--position-kinds", default="all", help="rows to measure on: all = the full prompt sequences "
                   "(the paper's gate); last_input = the older last-input gate")
    f.add_argument("--conditions", default=None)
    f.add_argument("--skip-first", type=int, default=1, help="leave out the first N tokens of each prompt (BOS)")
    f.add_argument("--threshold", type=float, default=0.5)
    f.add_argument("--allow-other-site", action="store_true", help="evaluate an SAE at a site it was not trained on")
    f.add_argument("--output", default=None, help="also write the report as JSON")
    f.set_defaults(func=cmd_sae_fvu)

    m = subparsers.add_parser(
        "mine-features", help="SpARE feature mining: SAE latents that separate kept-memory from followed-tool episodes",
        description="Rank SAE latents by mutual information with the behaviour on tool_wrong episodes of the fit fold, "
                    "cross-check with frequency separation, select by a cumulative-MI budget and write a sae_clamp "
                    "edit spec plus a feature table. See docs/sae_mining.md.")
    m.add_argument("--activations", required=True, help="HDF5 store with rows of --position-kind (and 'all' rows "
                   "for the top-activating tokens)")
    m.add_argument("--run", default=None, help="evaluation run whose outcomes label the episodes (default: the "
                   "store's labels joined by extract --run)")
    m.add_argument("--sae", required=True, help="SITE=DIR[,SITE=DIR] or SITE=pretrained:RELEASE:SAE_ID")
    m.add_argument("--layers", default=None, help="sites to mine (default: every site given in --sae); 'paper' / "
                   "'paper:DICTIONARY' = the MemToC paper's SAE band of the store's model family; 'stored'")
    m.add_argument("--position-kind", default="last_input", help="store rows the statistics use")
    m.add_argument("--benchmark", default="demo")
    m.add_argument("--fit-fold", required=True, help="fold whose questions are mined (held out from evaluation)")
    m.add_argument("--eval-fold", default=None, help="evaluation fold(s) that must not meet the fit fold (default: "
                   "every other fold)")
    m.add_argument("--budget", type=float, default=0.7, help="cumulative-MI proportion K (default 0.7, the MemToC "
                   "paper's widening run; 0.5 its qualification run; 0.07 SpARE's ODQA value)")
    m.add_argument("--steer-toward", choices=("memory", "tool"), default="memory")
    m.add_argument("--positions", "--edit-positions", dest="positions", default="last_input",
                   help="edit positions: last_input | tool_span (the paper's tool-output-span probe) | "
                   "from_tool_return; --edit-positions is the same flag under a name no other step takes")
    m.add_argument("--strength", type=float, default=1.0)
    m.add_argument("--mi-estimator", choices=("knn", "knn-fast", "binned"), default="knn",
                   help="knn = sklearn mutual_info_classif; knn-fast = the same estimator vectorized (use for 10k+ "
                   "latents); binned = plug-in MI over quantile bins")
    m.add_argument("--n-neighbors", type=int, default=3)
    m.add_argument("--n-bins", type=int, default=8)
    m.add_argument("--seed", type=int, default=0, help="random_state of the MI estimator")
    m.add_argument("--top-tokens", type=int, default=8)
    m.add_argument("--min-per-class", type=int, default=2)
    m.add_argument("--fvu-threshold", type=float, default=0.5)
    m.add_argument("--fvu-rows", choices=("sequence", "last_input"), default="sequence",
                   help="gate rows: every prompt token of the mined episodes (the paper's full-sequence FVU) or the "
                   "last-input mining rows")
    m.add_argument("--fvu-skip-first", type=int, default=1, help="sequence gate: leave out the first N tokens")
    m.add_argument("--name", default=None)
    m.add_argument("--device", default="cpu")
    m.add_argument("--out", required=True, help="directory for edit.json, features.csv/.md, mining.json")
    m.set_defaults(func=cmd_mine)

