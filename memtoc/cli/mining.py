"""``memtoc sae train|fvu`` and ``memtoc mine-features``: thin layers over ``steering.sae`` and ``steering.mining``
(and the parsing of their ``--sae`` option)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memtoc.jobs.mining import (_csv, _sites, _store_attrs, _stored_sites, parse_sae_arg,  # noqa: F401
                                resolve_sae_arg, run_mine_features, run_sae_train)


def cmd_sae_train(args: argparse.Namespace) -> int:
    paths = run_sae_train(
        args.activations, args.layers, args.out, d_sae=args.d_sae, architecture=args.architecture, k=args.k,
        l1_coefficient=args.l1_coefficient, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        seed=args.seed, position_kinds=_csv(args.position_kinds), conditions=_csv(args.conditions),
        skip_first=args.skip_first, val_fraction=args.val_fraction, max_rows=args.max_rows,
        normalize=not args.no_normalize, device=args.device, overwrite=args.overwrite, num_threads=args.threads)
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
    res = run_mine_features(
        args.activations, args.sae, out=args.out, layers=args.layers, sae_fallback=args.sae_fallback,
        device=args.device, fit_fold=args.fit_fold, run=args.run, position_kind=args.position_kind,
        benchmark=args.benchmark, eval_folds=_csv(args.eval_fold), budget=args.budget,
        steer_toward=args.steer_toward, positions=args.positions, strength=args.strength,
        estimator=args.mi_estimator, n_neighbors=args.n_neighbors, seed=args.seed, n_bins=args.n_bins,
        top_tokens=args.top_tokens, min_per_class=args.min_per_class, fvu_threshold=args.fvu_threshold,
        fvu_rows=args.fvu_rows, fvu_skip_first=args.fvu_skip_first, name=args.name)
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
    t.add_argument("--activations", required=True, help="HDF5 activation store (memtoc extract --position-kinds all)")
    t.add_argument("--layers", required=True, help="sites: N, N-M, comma list (0 = embedding output, s = block s-1), "
                   "'stored' (every stored site) or 'paper[:DICTIONARY]' (the MemToC paper's SAE band of the model "
                   "family)")
    t.add_argument("--d-sae", type=int, default=None, help="number of latents (default 4 x d_model)")
    t.add_argument("--architecture", choices=("topk", "standard"), default="topk",
                   help="topk (k active features) or standard (ReLU with an L1 penalty); both sae-lens")
    t.add_argument("--k", type=int, default=32, help="topk: active latents per token")
    t.add_argument("--l1-coefficient", type=float, default=5.0, help="standard: L1 penalty")
    t.add_argument("--steps", type=int, default=2000, help="training steps")
    t.add_argument("--batch-size", type=int, default=512, help="activation rows per step")
    t.add_argument("--lr", type=float, default=5e-4, help="learning rate")
    t.add_argument("--seed", type=int, default=0, help="torch seed of the training")
    t.add_argument("--position-kinds", default="all", help="comma list of the store's position kinds to train on")
    t.add_argument("--conditions", default=None, help="comma list of conditions (default: every stored row)")
    t.add_argument("--skip-first", type=int, default=1, help="drop the first N tokens of each prompt (BOS/sink)")
    t.add_argument("--val-fraction", type=float, default=0.1, help="share of episodes held out for the FVU report")
    t.add_argument("--max-rows", type=int, default=500_000, help="train on at most N rows (seeded sample)")
    t.add_argument("--no-normalize", action="store_true", help="train on raw activations (default: scaled to mean "
                   "norm sqrt(d), folded back into the saved weights)")
    t.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads while training (small SAEs: 1)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing SAE directory instead of refusing")
    t.add_argument("--out", required=True,
                   help="SAE directory (one site), or the parent of site_NNN/ directories (several sites)")
    t.set_defaults(func=cmd_sae_train)

    f = sub.add_parser("fvu", help="fraction of variance unexplained of an SAE on the episodes' activations",
                       description="FVU = sum ||x - x_hat||^2 / sum ||x - mean x||^2 per site; exit status 1 when a "
                                   "site fails the gate.")
    f.add_argument("--sae", required=True, help="an SAE directory, or SITE=DIR[,SITE=DIR], or SITE=pretrained:R:ID")
    f.add_argument("--activations", required=True, help="HDF5 store (memtoc extract) to measure the reconstruction on")
    f.add_argument("--layers", default=None, help="sites to evaluate (default: the SAE's own site)")
    f.add_argument("--position-kinds", default="all", help="rows to measure on: all = the full prompt sequences "
                   "(the paper's gate); last_input = the older last-input gate")
    f.add_argument("--conditions", default=None,
                   help="comma list of conditions whose rows are measured (default: every row)")
    f.add_argument("--skip-first", type=int, default=1, help="leave out the first N tokens of each prompt (BOS)")
    f.add_argument("--threshold", type=float, default=0.5,
                   help="highest fraction of variance unexplained that passes the gate")
    f.add_argument("--allow-other-site", action="store_true", help="evaluate an SAE at a site it was not trained on")
    f.add_argument("--out", dest="output", default=None, help="also write the report as JSON")
    f.set_defaults(func=cmd_sae_fvu)

    m = subparsers.add_parser(
        "mine-features", help="SpARE feature mining: SAE latents that separate kept-memory from followed-tool episodes",
        description="Rank SAE latents by mutual information with the behaviour on tool_wrong episodes of the fit fold, "
                    "cross-check with frequency separation, select by a cumulative-MI budget and write a sae_clamp "
                    "edit spec plus a feature table. See docs/sae_mining.md.")
    m.add_argument("--activations", required=True, help="HDF5 store with rows of --position-kinds (and 'all' rows "
                   "for the top-activating tokens)")
    m.add_argument("--run", default=None, help="evaluation run whose outcomes label the episodes (default: the "
                   "store's labels joined by extract --run)")
    m.add_argument("--sae", required=True, help="SITE=DIR[,SITE=DIR] or SITE=pretrained:RELEASE:SAE_ID, or "
                   "'paper[:DICTIONARY]' = the MemToC paper's pretrained dictionaries for the store's model (App. C), "
                   "falling back loudly to --sae-fallback where they do not fit the model or the hub is unreachable")
    m.add_argument("--sae-fallback", default=None, help="SAEs to mine with when --sae paper cannot be used (e.g. "
                   "the directory of `memtoc sae train`)")
    m.add_argument("--layers", default=None, help="sites to mine (default: every site given in --sae); 'paper' / "
                   "'paper:DICTIONARY' = the MemToC paper's SAE band of the store's model family; 'stored'")
    m.add_argument("--position-kinds", dest="position_kind", default="last_input", help="store rows the statistics use")
    m.add_argument("--benchmark", default="demo", help="benchmark of the store's episodes (for its folds)")
    m.add_argument("--fit-fold", required=True, help="fold whose questions are mined (held out from evaluation)")
    m.add_argument("--eval-fold", default=None, help="evaluation fold(s) that must not meet the fit fold (default: "
                   "every other fold)")
    m.add_argument("--budget", type=float, default=0.5, help="cumulative-MI proportion K (default 0.5, the MemToC "
                   "paper's headline run, +0.25 tool-ward; 0.7 its widening run; 0.07 SpARE's ODQA value)")
    m.add_argument("--steer-toward", choices=("memory", "tool"), default="memory",
                   help="the behaviour the written edit pushes toward")
    m.add_argument("--edit-positions", dest="positions", default="last_input",
                   help="edit positions: last_input | tool_span (the paper's tool-output-span probe) | "
                   "from_tool_return; --edit-positions is the same flag under a name no other step takes")
    m.add_argument("--strength", type=float, default=1.0, help="strength of the written edit")
    m.add_argument("--mi-estimator", choices=("knn", "knn-fast", "binned"), default="knn",
                   help="knn = sklearn mutual_info_classif; knn-fast = the same estimator vectorized (use for 10k+ "
                   "latents); binned = plug-in MI over quantile bins")
    m.add_argument("--n-neighbors", type=int, default=3, help="neighbours of the k-NN mutual-information estimator")
    m.add_argument("--n-bins", type=int, default=8, help="bins of the binned mutual-information estimator")
    m.add_argument("--seed", type=int, default=0, help="random_state of the MI estimator")
    m.add_argument("--top-tokens", type=int, default=8, help="tokens listed per feature (its strongest activations)")
    m.add_argument("--min-per-class", type=int, default=2,
                   help="fewest kept-memory and followed-tool episodes each needed in the fit fold")
    m.add_argument("--fvu-threshold", type=float, default=0.5,
                   help="highest fraction of variance unexplained an SAE may have to be used")
    m.add_argument("--fvu-rows", choices=("sequence", "last_input"), default="sequence",
                   help="gate rows: every prompt token of the mined episodes (the paper's full-sequence FVU) or the "
                   "last-input mining rows")
    m.add_argument("--fvu-skip-first", type=int, default=1, help="sequence gate: leave out the first N tokens")
    m.add_argument("--name", default=None, help="name of the written edit (default: derived from the sites)")
    m.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (SAE encoding)")
    m.add_argument("--out", required=True, help="directory for edit.json, features.csv/.md, mining.json")
    m.set_defaults(func=cmd_mine)

