"""SpARE-style feature mining: which SAE latents separate "kept memory" from "followed the tool".

Pipeline (``docs/sae_mining.md``; methods.md section 1, steps D-H):

1. Episodes: ``tool_wrong`` episodes of the questions in the fit fold, labelled by the run's ``outcome``
   (``kept_memory`` = label 1, ``followed_tool`` = label 0; ``both`` / ``neither`` are dropped). The labels come
   from the store's joined columns (``memtoc extract --run``) or from the run's records, joined by episode_id.
   The mining questions must not meet the evaluation questions (the other folds by default): checked, refused.
2. Codes: ``z = sae.encode(h)`` at the chosen position kind (one row per episode for ``last_input``; kinds with
   several rows per episode are averaged per episode).
3. Ranking: mutual information between each latent and the label (sklearn ``mutual_info_classif``, kNN
   estimator, fixed ``random_state``; or the vectorized re-implementation ``knn-fast``, or ``binned``).
4. Cross-check: frequency separation ``|P(z>0 | kept) - P(z>0 | followed)|``; top-20 agreement with the MI
   ranking (overlap and Jaccard) per layer.
5. Selection: K = the smallest count whose cumulative MI (latents sorted by MI) exceeds ``budget`` x total MI;
   walking the MI order, a latent goes to the memory side if ``E = mean(z | kept) - mean(z | followed) > 0``,
   to the tool side if ``E < 0`` (skipped if 0), until K latents are assigned.
6. Targets ("functional activations"): a memory-side latent's target is its mean code over the kept-memory
   episodes; a tool-side latent's, its mean code over the followed-tool episodes (unweighted means).
7. Output: a ``sae_clamp`` edit spec (steer toward memory: remove the tool-side latents, add the memory-side
   latents; toward tool: the reverse), a feature table (CSV + Markdown, with each latent's top-activating tokens
   from the store's ``all`` rows) and ``mining.json`` (provenance, counts, agreement, FVU).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from memtoc.core.errors import MemtocError
from memtoc.core.vocab import CONFLICT_CONDITION
from steering.mi import ESTIMATORS, MiningError, mutual_information
from steering.mining_io import LayerResult, write_outputs
from steering.mining_select import (expectation_difference, frequency_order, frequency_separation, rank_order,
                                    select_features, side_targets, spec_features, topk_agreement)

EDIT_SCHEMA = "memtoc-edit-v1"
#: Below this mutual information (nats; a binary label carries at most ln 2 = 0.69) the selected latents are
#: noise-level: the edit is still written (it is what the budget selected), with a one-line warning recorded in
#: ``mining.json`` and the spec's ``source``.
LOW_MI = 1e-3
MINING_SCHEMA = "memtoc-mining-v1"
BEHAVIOURS = {"kept_memory": 1, "followed_tool": 0}
EDIT_POSITIONS = ("last_input", "tool_span", "from_tool_return")


@dataclass
class MiningConfig:
    activations: str
    sae: dict[int, Any]                         # site -> {"path": DIR} | {"release", "sae_id"}
    fit_fold: str
    out: str
    run: str | None = None
    layers: Sequence[int] | None = None         # default: every site with an SAE
    position_kind: str = "last_input"
    benchmark: str = "demo"
    eval_folds: Sequence[str] | None = None     # default: every fold but the fit fold
    eval_question_ids: Sequence[str] | None = None   # extra evaluation questions that must stay unseen
    budget: float = 0.5                         # the paper's headline run (+0.25 tool-ward); 0.7 = its widening run
    steer_toward: str = "memory"
    positions: str = "last_input"
    strength: float = 1.0
    estimator: str = "knn"
    n_neighbors: int = 3
    seed: int = 0
    n_bins: int = 8
    top_k_agreement: int = 20
    top_tokens: int = 8
    min_per_class: int = 2
    fvu_threshold: float = 0.5
    fvu_rows: str = "sequence"                  # sequence: every prompt token (paper); last_input: the mining rows
    fvu_skip_first: int = 1                     # sequence gate: leave out the first token (BOS / attention sink)
    name: str | None = None
    device: str = "cpu"


@dataclass
class MiningResult:
    out: Path
    spec_path: Path
    spec: dict[str, Any]
    layers: dict[int, LayerResult]
    counts: dict[str, int]
    report: dict[str, Any]


def _check_run_model(run_info: Mapping[str, Any], store_attrs: Mapping[str, Any], run: Any) -> None:
    ident = run_info.get("identity") or {}
    theirs = ident.get("weights_sha256")
    mine = store_attrs.get("weights_sha256")
    if theirs and mine and mine not in ("None", "") and theirs != mine:
        raise MiningError(f"run {run} was made with another model (weights {str(theirs)[:12]}) than the activations "
                          f"(weights {str(mine)[:12]}); its outcomes do not describe these activations")


def resolve_labels(store: Any, rows: np.ndarray, run: str | Path | None) -> tuple[np.ndarray, dict[str, Any]]:
    """Outcome of each row: the store's joined labels when present, else the run's records by episode_id. When
    both exist they must agree (a store joined with another run is refused rather than silently mixed)."""
    idx = store.index
    eids = idx["episode_id"][rows]
    store_out = idx["outcome"][rows] if "outcome" in idx else np.full(len(rows), "", dtype=object)
    has_store = bool(np.any(store_out != ""))
    source: dict[str, Any] = {}
    if run is not None:
        from memtoc.runs.runstore import RunStore

        run_store = RunStore.read(run)
        labels = {str(r["episode_id"]): str(r.get("outcome") or "") for r in run_store.episodes.records()}
        _check_run_model(run_store.run_info(), store.attrs, run)
        run_out = np.asarray([labels.get(str(e), "") for e in eids], dtype=object)
        source["run"] = str(Path(run).resolve())
        if has_store:
            both = (store_out != "") & (run_out != "")
            bad = np.flatnonzero(both & (store_out != run_out))
            if bad.size:
                i = bad[0]
                raise MiningError(f"the store's joined labels disagree with run {run} for {bad.size} rows (e.g. "
                                  f"{eids[i]}: {store_out[i]!r} in the store, {run_out[i]!r} in the run); the store "
                                  f"was labelled from {store.attrs.get('labels_source', {}).get('run', '?')} -- "
                                  "re-extract with --run, or mine without --run to use the store's labels")
            source["labels"] = "store+run (agree)"
            return np.where(store_out != "", store_out, run_out), source
        source["labels"] = "run"
        return run_out, source
    if not has_store:
        raise MiningError(f"{store.path} carries no behaviour labels (it was extracted without --run); pass --run "
                          "RUN_DIR (the evaluation run whose outcomes label the episodes)")
    source["labels"] = "store"
    source["labels_source"] = store.attrs.get("labels_source")
    return store_out, source


def _parse_eval_folds(bench: Any, fit_fold: str, eval_folds: Sequence[str] | None) -> list[str]:
    if bench.folds is None:
        raise MiningError(f"benchmark {bench.name!r} has no cross-fitting folds; mining needs a fit fold held out "
                          "from the evaluation questions")
    names = sorted(set(bench.folds.values()))
    if fit_fold not in names:
        raise MiningError(f"unknown fit fold {fit_fold!r}; folds are {', '.join(names)}")
    if eval_folds is None:
        out = [f for f in names if f != fit_fold]
        if not out:
            raise MiningError(f"benchmark {bench.name!r} has only fold {fit_fold!r}: nothing left to evaluate on")
        return out
    for f in eval_folds:
        if f not in names:
            raise MiningError(f"unknown evaluation fold {f!r}; folds are {', '.join(names)}")
    return list(eval_folds)


def check_held_out(mining_qids: Sequence[str], eval_qids: Sequence[str], *, what: str = "evaluation") -> None:
    """Refuse mining questions that are also evaluation questions (the edit would be tested on its own data)."""
    overlap = sorted(set(map(str, mining_qids)) & set(map(str, eval_qids)))
    if overlap:
        raise MiningError(f"held-out violation: {len(overlap)} of the {len(set(mining_qids))} mining questions are "
                          f"also {what} questions (e.g. {', '.join(overlap[:5])}); mine on a fit fold disjoint from "
                          "the evaluation fold")


def _top_tokens(store: Any, sae: Any, site: int, feature_ids: Sequence[int], rows: np.ndarray, n_top: int,
                chunk: int = 8192) -> dict[int, list[dict[str, Any]]]:
    """For each latent, the ``n_top`` rows (tokens) where it fires most among ``rows``."""
    from steering.sae import encode

    feats = np.asarray(sorted(set(int(f) for f in feature_ids)), dtype=np.int64)
    if not len(feats) or not len(rows) or n_top < 1:
        return {}
    n_keep = 4 * n_top          # candidates kept per latent; identical contexts (shared prompt prefixes) collapse
    best_v = np.full((0, len(feats)), -np.inf, dtype=np.float32)
    best_r = np.zeros((0, len(feats)), dtype=np.int64)
    for i in range(0, len(rows), chunk):
        r = rows[i:i + chunk]
        z = encode(sae, store.read(site, r))[:, feats]
        v = np.concatenate([best_v, z], 0)
        rr = np.concatenate([best_r, np.repeat(r[:, None], len(feats), 1)], 0)
        keep = np.argsort(-v, axis=0, kind="stable")[:n_keep]
        best_v = np.take_along_axis(v, keep, 0)
        best_r = np.take_along_axis(rr, keep, 0)
    idx = store.index
    out: dict[int, list[dict[str, Any]]] = {}
    for col, f in enumerate(feats.tolist()):
        items: list[dict[str, Any]] = []
        seen: set[tuple[str, float]] = set()
        for v, r in zip(best_v[:, col].tolist(), best_r[:, col].tolist()):
            tok = str(idx["token_str"][r])
            if v <= 0 or len(items) >= n_top:
                break
            if (tok, v) in seen:            # the same token in the same context, from another episode
                continue
            seen.add((tok, v))
            items.append({"token": tok, "value": float(v), "episode_id": str(idx["episode_id"][r]),
                          "token_index": int(idx["token_index"][r])})
        out[f] = items
    return out


FVU_ROWS = ("sequence", "last_input")


def gate_rows(store: Any, rows: np.ndarray, mode: str, skip_first: int = 1) -> np.ndarray | None:
    """Store rows the reconstruction gate is measured on. ``sequence`` (the paper's full-sequence FVU): every
    prompt-token row (position kind ``all``) of the episodes of ``rows``, without the first ``skip_first`` tokens;
    ``last_input``: None, i.e. the mining rows themselves (the older gate)."""
    if mode not in FVU_ROWS:
        raise MiningError(f"--fvu-rows must be one of {', '.join(FVU_ROWS)}, got {mode!r}")
    if mode == "last_input":
        return None
    idx = store.index
    eps = np.unique(idx["episode_id"][rows].astype(str))
    out = np.flatnonzero((idx["position_kind"] == "all") & np.isin(idx["episode_id"].astype(str), eps)
                         & (idx["token_index"] >= int(skip_first)))
    if len(out) < 2:
        raise MiningError(f"{store.path} has no full-sequence rows (position kind 'all') for the mined episodes: "
                          "the paper's gate is the full-sequence FVU; extract with --position-kinds last_input,all, or "
                          "gate on the last input with --fvu-rows last_input")
    return out


def _parse_positions(positions: str) -> str:
    kinds = [p.strip() for p in str(positions).split(",") if p.strip()]
    bad = [p for p in kinds if p not in EDIT_POSITIONS]
    if not kinds or bad:
        raise MiningError(f"--position-kinds {positions!r}: choose one of {', '.join(EDIT_POSITIONS)}")
    if len(kinds) != 1:
        raise MiningError(f"--position-kinds takes one position kind for the edit, got {positions!r}")
    return kinds[0]


def mine_features(cfg: MiningConfig, *, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)
                  ) -> MiningResult:
    """Run the mining job (see the module docstring) and write the spec, the tables and ``mining.json``."""
    from activations.store import open_store
    from memtoc.bench.benchmark import load_benchmark
    from steering.direction import group_means
    from steering.sae import (check_sae_site, encode, fvu, load_sae, read_sae_meta, resolve_sae_path,
                              store_fingerprint)

    t_start = time.time()
    if cfg.estimator not in ESTIMATORS:
        raise MiningError(f"unknown MI estimator {cfg.estimator!r}; choose {', '.join(ESTIMATORS)}")
    if cfg.steer_toward not in ("memory", "tool"):
        raise MiningError(f"--steer-toward must be memory or tool, got {cfg.steer_toward!r}")
    if not 0 < cfg.budget <= 1:
        raise MiningError(f"--budget must be in (0, 1], got {cfg.budget}")
    edit_position = _parse_positions(cfg.positions)
    if not cfg.sae:
        raise MiningError("no SAE given: --sae SITE=DIR[,SITE=DIR]")
    sites = sorted(int(s) for s in (cfg.layers if cfg.layers is not None else cfg.sae))
    missing = [s for s in sites if s not in cfg.sae]
    if missing:
        raise MiningError(f"no SAE for site(s) {missing}: give --sae {missing[0]}=DIR")
    bench = load_benchmark(cfg.benchmark)
    eval_folds = _parse_eval_folds(bench, cfg.fit_fold, cfg.eval_folds)
    fit_qids = {q for q, f in bench.folds.items() if f == cfg.fit_fold}
    eval_qids = {q for q, f in bench.folds.items() if f in eval_folds} | set(map(str, cfg.eval_question_ids or ()))
    out = Path(cfg.out)

    with open_store(cfg.activations) as store:
        for s in sites:
            if s not in store.layers:
                raise MiningError(f"site {s} is not stored in {cfg.activations}; stored sites: {store.layers}")
        idx = store.index
        kinds = sorted(set(idx["position_kind"].tolist()))
        cand = np.flatnonzero((idx["position_kind"] == cfg.position_kind) & (idx["condition"] == CONFLICT_CONDITION))
        if not len(cand):
            raise MiningError(f"{cfg.activations} has no tool_wrong rows of position kind {cfg.position_kind!r} "
                              f"(position kinds present: {', '.join(kinds) or 'none'})")
        outcome, label_source = resolve_labels(store, cand, cfg.run)
        qids = idx["question_id"][cand].astype(str)
        in_fit = np.isin(qids, list(fit_qids))
        labelled = np.isin(outcome, list(BEHAVIOURS))
        rows = cand[in_fit & labelled]
        row_out = outcome[in_fit & labelled]
        mining_qids = sorted(set(idx["question_id"][rows].astype(str).tolist()))
        check_held_out(mining_qids, eval_qids, what=f"evaluation (fold {', '.join(eval_folds)})")
        eids_rows = idx["episode_id"][rows].astype(str)
        episodes, groups = np.unique(eids_rows, return_inverse=True)
        ep_out = {e: o for e, o in zip(eids_rows.tolist(), row_out.tolist())}
        y = np.asarray([BEHAVIOURS[ep_out[e]] for e in episodes.tolist()], dtype=np.int64)
        fit_eps = set(idx["episode_id"][cand[in_fit]].astype(str).tolist())
        counts = {"kept_memory": int((y == 1).sum()), "followed_tool": int((y == 0).sum()),
                  "other_outcomes": len(fit_eps) - len(episodes),
                  "unlabelled": int(len(set(idx["episode_id"][cand[in_fit & (outcome == '')]].astype(str)))),
                  "fit_fold_episodes": len(fit_eps), "mining_questions": len(mining_qids),
                  "tool_wrong_episodes_in_store": int(len(set(idx["episode_id"][cand].astype(str))))}
        if counts["kept_memory"] < cfg.min_per_class or counts["followed_tool"] < cfg.min_per_class:
            raise MiningError(
                f"too few episodes of each behaviour in fold {cfg.fit_fold}: found {counts['kept_memory']} kept_memory "
                f"and {counts['followed_tool']} followed_tool tool_wrong episodes ({counts['other_outcomes']} with "
                f"other outcomes, {counts['unlabelled']} without a label, of {counts['fit_fold_episodes']} in the "
                f"fold); need at least {cfg.min_per_class} of each -- evaluate more questions or formulations")
        fvu_rows = gate_rows(store, rows, cfg.fvu_rows, cfg.fvu_skip_first)
        tok_rows = np.flatnonzero((idx["position_kind"] == "all") & np.isin(idx["question_id"].astype(str),
                                                                           list(fit_qids))
                                  & (idx["token_index"] >= 1))
        fingerprint = store_fingerprint(store)

        layer_results: dict[int, LayerResult] = {}
        spec_sae: dict[str, Any] = {}
        spec_feats: dict[str, Any] = {}
        spec_fvu: dict[str, float] = {}
        warnings: list[str] = []
        for s in sites:
            ref = dict(cfg.sae[s])
            sae = load_sae(ref, device=cfg.device)
            sae_path = resolve_sae_path(ref) if "path" in ref else None
            try:
                check_sae_site(sae, s, store.d_model, path=sae_path)
            except MemtocError as exc:
                raise MiningError(str(exc)) from None
            x = store.read(s, rows)
            xg = x if fvu_rows is None else store.read(s, fvu_rows)
            layer_fvu = fvu(sae, xg) if len(xg) >= 2 else float("nan")
            z = group_means(encode(sae, x), groups, len(episodes)).astype(np.float32)   # one row per episode
            t0 = time.time()
            mi = mutual_information(z, y, estimator=cfg.estimator, n_neighbors=cfg.n_neighbors,
                                    random_state=cfg.seed, n_bins=cfg.n_bins)
            mi_seconds = time.time() - t0
            mi = np.where(np.all(z == z[:1], axis=0), 0.0, mi)     # constant (e.g. dead) latents carry no information
            e = expectation_difference(z, y)
            freq = frequency_separation(z, y)
            mi_ord = rank_order(mi)
            fq_ord = frequency_order(z, y)
            mi_rank = np.empty(len(mi), dtype=np.int64)
            mi_rank[mi_ord] = np.arange(1, len(mi) + 1)
            fq_rank = np.empty(len(mi), dtype=np.int64)
            fq_rank[fq_ord] = np.arange(1, len(mi) + 1)
            agreement = topk_agreement(mi_ord, fq_ord, cfg.top_k_agreement)
            sel = select_features(mi, e, cfg.budget)
            targets = {"memory": side_targets(z, y, sel["memory"], 1), "tool": side_targets(z, y, sel["tool"], 0)}
            res = LayerResult(site=s, n_latents=int(z.shape[1]), mi=mi, expectation=e, freq=freq,
                              mean_kept=z[y == 1].mean(0), mean_followed=z[y == 0].mean(0), selection=sel,
                              targets=targets, agreement=agreement, fvu=float(layer_fvu), mi_seconds=mi_seconds,
                              mi_rank=mi_rank, freq_rank=fq_rank)
            res.top_tokens = _top_tokens(store, sae, s, sel["memory"] + sel["tool"], tok_rows, cfg.top_tokens)
            layer_results[s] = res
            n_sel = len(sel["memory"]) + len(sel["tool"])
            log(f"site {s}: {res.n_latents} latents, total MI {sel['total_mi']:.4f} nats, K={sel['k']} -> "
                f"{len(sel['memory'])} memory-side + {len(sel['tool'])} tool-side; top-{agreement['k']} agreement "
                f"with frequency ranking {agreement['overlap']}/{agreement['k']} (Jaccard {agreement['jaccard']:.2f}); "
                f"FVU {layer_fvu:.3f}; MI {cfg.estimator} {mi_seconds:.1f} s")
            if layer_fvu > cfg.fvu_threshold:
                log(f"site {s}: WARNING FVU {layer_fvu:.3f} > threshold {cfg.fvu_threshold}: the SAE reconstructs "
                    "these activations poorly; the edit machinery refuses it unless the spec says force")
            if not n_sel:
                log(f"site {s}: no latent selected (no mutual information with the behaviour); left out of the spec")
                continue
            top_mi = float(np.max(mi[sel["memory"] + sel["tool"]]))
            if top_mi < LOW_MI:
                warnings.append(f"site {s}: WARNING the selected latents carry at most {top_mi:.4f} nats of mutual "
                                f"information with the behaviour (below {LOW_MI}): they barely tell kept_memory from "
                                "followed_tool, so the edit is unlikely to steer (label more episodes)")
                log(warnings[-1])
            if "path" in ref:
                out.mkdir(parents=True, exist_ok=True)
                spec_sae[str(s)] = {"path": os.path.relpath(Path(sae_path).resolve(), out.resolve())}
            else:
                spec_sae[str(s)] = {"release": ref["release"], "sae_id": ref["sae_id"]}
            spec_feats[str(s)] = spec_features(sel, targets, cfg.steer_toward)
            spec_fvu[str(s)] = float(layer_fvu)

    if not spec_feats:
        raise MiningError("no latent carries mutual information with the behaviour at any mined site "
                          f"({', '.join(map(str, sites))}); nothing to write")
    spec_sites = sorted(int(s) for s in spec_feats)
    name = cfg.name or (f"spare-{cfg.steer_toward}-fold{cfg.fit_fold}-L" + "_".join(map(str, spec_sites)))
    spec = {
        "schema_version": EDIT_SCHEMA, "name": name, "kind": "sae_clamp", "layers": spec_sites,
        "positions": edit_position, "strength": float(cfg.strength), "apply_to_closed_book": False,
        "sae": spec_sae, "features": spec_feats, "steer_toward": cfg.steer_toward, "fvu": spec_fvu,
        "fvu_threshold": float(cfg.fvu_threshold), "fvu_rows": cfg.fvu_rows, "force": False,
        "description": f"SpARE-style SAE clamp mined by memtoc mine-features: steer toward {cfg.steer_toward}",
        "source": {"tool": "memtoc mine-features", "report": "mining.json", "fit_fold": cfg.fit_fold,
                   "eval_folds": eval_folds, "activations": str(Path(cfg.activations).resolve()),
                   "run": str(Path(cfg.run).resolve()) if cfg.run else None, "estimator": cfg.estimator,
                   "budget": float(cfg.budget), "position_kind": cfg.position_kind,
                   "n_episodes": {"kept_memory": counts["kept_memory"], "followed_tool": counts["followed_tool"]},
                   "warnings": warnings},
    }
    report = {
        "schema_version": MINING_SCHEMA, "spec": "edit.json", "config": _jsonable(asdict(cfg)),
        "store": fingerprint, "labels": label_source, "benchmark": {"name": bench.name, "files": bench.files},
        "fit_fold": cfg.fit_fold, "eval_folds": eval_folds, "mining_question_ids": mining_qids,
        "mining_episode_ids": episodes.tolist(), "counts": counts, "warnings": warnings,
        # a path is kept relative to this directory, as in edit.json: readers (memtoc features) resolve it there
        "sae": {str(s): {"ref": _report_ref(cfg.sae[s], out),
                         "memtoc_sae": read_sae_meta(resolve_sae_path(cfg.sae[s])) if "path" in cfg.sae[s] else None}
                for s in sites},
        "layers": {str(s): {"n_latents": r.n_latents, "k": r.selection["k"], "total_mi": r.selection["total_mi"],
                            "memory": r.selection["memory"], "tool": r.selection["tool"], "agreement": r.agreement,
                            "fvu": r.fvu, "mi_seconds": round(r.mi_seconds, 3)} for s, r in layer_results.items()},
        "definitions": {
            "label": "1 = kept_memory, 0 = followed_tool (tool_wrong episodes; both/neither dropped)",
            "expectation": "E_j = mean(z_j | kept_memory) - mean(z_j | followed_tool); E > 0 = memory side",
            "frequency_separation": "|P(z_j > 0 | kept_memory) - P(z_j > 0 | followed_tool)|, ties by |E_j|/pooled sd",
            "target": "memory side: mean z_j over kept_memory episodes; "
                      "tool side: mean z_j over followed_tool episodes",
            "budget": "K = smallest count whose cumulative MI (descending) exceeds budget x total MI",
            "fvu": "sum ||x - x_hat||^2 / sum ||x - mean x||^2 over "
                   + ("every prompt token (kind 'all', token_index >= %d) of the mined episodes" % cfg.fvu_skip_first
                      if cfg.fvu_rows == "sequence" else "the mining rows (last input)"),
        },
        "seconds": round(time.time() - t_start, 2),
    }
    spec_path = write_outputs(out, spec, report, layer_results, cfg.steer_toward)
    log(f"edit spec -> {spec_path} ({sum(len(f['remove']) + len(f['add']) for f in spec_feats.values())} latents at "
        f"sites {spec_sites}); feature table -> {out / 'features.md'}")
    return MiningResult(out=out, spec_path=spec_path, spec=spec, layers=layer_results, counts=counts, report=report)


def _report_ref(ref: Mapping[str, Any], out: Path) -> Any:
    """The SAE reference as the report keeps it: a local path relative to the mining directory (the directory
    and its SAE move together; a path typed relative to the working directory would not resolve from there)."""
    from steering.sae import resolve_sae_path

    if "path" not in ref:
        return _jsonable(ref)
    return {**_jsonable(ref), "path": os.path.relpath(resolve_sae_path(ref).resolve(), Path(out).resolve())}


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
