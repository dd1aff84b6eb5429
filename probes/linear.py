"""Linear probes on stored activations (``memtoc probe``).

Per site: ``Pipeline(StandardScaler, LogisticRegression(C=0.05))`` (lbfgs, L2; ``penalty=`` is deprecated in
sklearn 1.8 and never passed), evaluated by five-fold cross-validation grouped by question (every question's
rows sit in exactly one test fold; the scaler is refit inside each fold). Scores are AUROCs of the decision
function per fold and pooled out of fold, with a cluster-bootstrap interval over questions; optionally a null
from label permutations within questions.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from probes.model import ProbeError


# -- the numpy core -------------------------------------------------------------------------------------------

def auroc(y: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney form, ties counted half); NaN when a class is missing."""
    from scipy.stats import rankdata

    y = np.asarray(y).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(scores)
    return float((r[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def grouped_folds(y: np.ndarray, groups: np.ndarray, *, n_splits: int = 5,
                  seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Stratified group k-fold splits; raises if a group would straddle folds or there are too few groups."""
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    groups = np.asarray(groups)
    n_groups = len(np.unique(groups))
    if n_groups < 2:
        raise ProbeError(f"{n_groups} group (question) for grouped cross-validation; need at least 2")
    if n_groups < n_splits:
        # small-n default that works (a notebook's limit=4): leave one group out, said
        warnings.warn(f"{n_groups} groups (questions) for {n_splits}-fold grouped cross-validation: using "
                      f"{n_groups} folds (one group per fold); pass --folds / folds= to choose", stacklevel=2)
        n_splits = n_groups
    cls_counts = np.bincount(np.asarray(y, dtype=int), minlength=2)
    try:
        if cls_counts.min() >= n_splits:
            cv = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
            folds = list(cv.split(np.zeros(len(y)), y, groups))
        else:
            raise ValueError("too few members of a class to stratify")
    except ValueError:
        folds = list(GroupKFold(n_splits=n_splits, shuffle=True, random_state=seed).split(np.zeros(len(y)), y, groups))
    seen: dict[Any, int] = {}
    for i, (tr, te) in enumerate(folds):
        if set(groups[tr]) & set(groups[te]):
            raise ProbeError("a group appears in both the training and the test part of a fold")
        for g in set(groups[te]):
            if seen.setdefault(g, i) != i:
                raise ProbeError(f"group {g!r} appears in two test folds")
    return folds


def make_probe(C: float = 0.05, max_iter: int = 5000) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    return Pipeline([("scale", StandardScaler()), ("logreg", LogisticRegression(C=C, max_iter=max_iter))])


def cross_validated_scores(X: np.ndarray, y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]], *,
                           C: float = 0.05, max_iter: int = 5000) -> tuple[np.ndarray, list[float], int]:
    """Out-of-fold decision scores, per-fold AUROCs and the number of convergence warnings."""
    from sklearn.exceptions import ConvergenceWarning

    X = np.asarray(X, dtype=np.float64)
    oof = np.full(len(y), np.nan)
    per_fold = []
    n_warn = 0
    for tr, te in folds:
        if len(np.unique(y[tr])) < 2:
            raise ProbeError("a training fold holds a single class; use fewer folds or more data")
        clf = make_probe(C, max_iter)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            clf.fit(X[tr], y[tr])
        n_warn += sum(issubclass(w.category, ConvergenceWarning) for w in caught)
        oof[te] = clf.decision_function(X[te])
        per_fold.append(auroc(y[te], oof[te]))
    return oof, per_fold, n_warn


def bootstrap_interval(y: np.ndarray, scores: np.ndarray, groups: np.ndarray, *, n_boot: int = 1000,
                       seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the pooled AUROC under a cluster bootstrap over groups (questions)."""
    if n_boot <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    uniq, inv = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(inv == g) for g in range(len(uniq))]
    stats = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(uniq), len(uniq))
        idx = np.concatenate([members[g] for g in pick])
        a = auroc(y[idx], scores[idx])
        if not np.isnan(a):
            stats.append(a)
    if not stats:
        return float("nan"), float("nan")
    lo, hi = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def permute_within_groups(y: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = y.copy()
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        out[idx] = y[rng.permutation(idx)]
    return out


@dataclass
class SiteResult:
    site: int
    auroc_pooled: float
    auroc_mean: float
    auroc_sd: float
    ci_low: float
    ci_high: float
    auroc_folds: list[float]
    n_convergence_warnings: int = 0
    null_mean: float | None = None
    null_p: float | None = None


@dataclass
class ProbeReport:
    sites: list[SiteResult]
    meta: dict[str, Any] = field(default_factory=dict)
    folds: list[list[str]] = field(default_factory=list)   # test-fold groups

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "sites": [asdict(s) for s in self.sites], "fold_groups": self.folds}

    def best(self) -> SiteResult:
        return max(self.sites, key=lambda s: -1 if np.isnan(s.auroc_pooled) else s.auroc_pooled)


def run_probes(features: Mapping[int, np.ndarray] | Callable[[int], np.ndarray], sites: Sequence[int],
               y: np.ndarray, groups: np.ndarray, *, C: float = 0.05, n_splits: int = 5, seed: int = 0,
               n_boot: int = 1000, n_permutations: int = 0, max_iter: int = 5000,
               meta: Mapping[str, Any] | None = None, progress: bool = False) -> ProbeReport:
    """Probe every site with the same grouped folds. ``features`` maps a site to ``[n, d]`` (or is a getter)."""
    y = np.asarray(y).astype(int)
    groups = np.asarray(groups)
    if set(np.unique(y)) - {0, 1} or len(np.unique(y)) < 2:
        raise ProbeError("labels must hold both classes 0 and 1")
    folds = grouped_folds(y, groups, n_splits=n_splits, seed=seed)
    n_splits = len(folds)                              # clamped to the number of groups when there are fewer
    get = features if callable(features) else features.__getitem__
    results = []
    it = sites
    if progress:
        import sys
        from tqdm import tqdm
        it = tqdm(sites, desc="probe", unit="layer", file=sys.stderr)
    for site in it:
        X = np.asarray(get(site), dtype=np.float64)
        if X.shape[0] != len(y):
            raise ProbeError(f"site {site}: {X.shape[0]} feature rows for {len(y)} labels")
        oof, per_fold, n_warn = cross_validated_scores(X, y, folds, C=C, max_iter=max_iter)
        pooled = auroc(y, oof)
        lo, hi = bootstrap_interval(y, oof, groups, n_boot=n_boot, seed=seed)
        fa = np.array(per_fold, dtype=float)
        res = SiteResult(site=int(site), auroc_pooled=pooled, auroc_mean=float(np.nanmean(fa)),
                         auroc_sd=float(np.nanstd(fa, ddof=1)) if np.sum(~np.isnan(fa)) > 1 else float("nan"),
                         ci_low=lo, ci_high=hi, auroc_folds=[float(a) for a in per_fold],
                         n_convergence_warnings=n_warn)
        if n_permutations > 0:
            rng = np.random.default_rng(seed + 1)
            null = []
            for _ in range(n_permutations):
                yp = permute_within_groups(y, groups, rng)
                if len(np.unique(yp)) < 2:
                    continue
                null_oof, _, _ = cross_validated_scores(X, yp, folds, C=C, max_iter=max_iter)
                null.append(auroc(yp, null_oof))
            if null:
                res.null_mean = float(np.mean(null))
                res.null_p = float((1 + sum(a >= pooled for a in null)) / (1 + len(null)))
        results.append(res)
    fold_groups = [sorted(str(g) for g in set(groups[te])) for _, te in folds]
    info = {"C": C, "n_splits": n_splits, "seed": seed, "n_boot": n_boot, "n_permutations": n_permutations,
            "n": int(len(y)), "n_positive": int(y.sum()), "n_negative": int((1 - y).sum()),
            "n_groups": int(len(np.unique(groups))), "model": "StandardScaler + LogisticRegression(lbfgs, L2)",
            **(meta or {})}
    return ProbeReport(sites=results, meta=info, folds=fold_groups)


# -- the activation-store adapter --------------------------------------------------------------------------

_MISSING = ("", "-1", "None", "nan")


@dataclass
class ProbeData:
    rows: np.ndarray          # store rows, one per example (or the first row of each reduced group)
    y: np.ndarray
    groups: np.ndarray
    row_sets: list[np.ndarray] | None   # rows averaged per example when ``reduce == "mean"``
    meta: dict[str, Any]

    def features(self, store: Any, site: int) -> np.ndarray:
        if self.row_sets is None:
            return store.read(site, self.rows)
        X = store.read(site, np.concatenate(self.row_sets))
        ends = np.cumsum([len(rs) for rs in self.row_sets])[:-1]
        return np.stack([part.mean(0) for part in np.split(X, ends)])


def load_probe_data(store: Any, *, label: str, positive: str | None = None, negative: str | None = None,
                    groups: str = "question_id", position_kind: str | None = "last_input", run: str | None = None,
                    reduce: str = "none") -> ProbeData:
    """Rows, binary labels and groups of a store for a probe of ``label`` (an index column, or a run field).

    ``positive`` / ``negative`` pick the two label values (compared as strings; rows with other values are
    dropped); without them the label must take exactly two values and the larger (sorted) one is positive.
    ``reduce``: ``none`` (one example per stored row), ``last`` (the row with the largest ``token_index`` per
    episode) or ``mean`` (the mean of an episode's rows) -- for position kinds with several tokens per episode.
    """
    idx = store.index
    n = len(idx["row"])
    if groups not in idx:
        raise ProbeError(f"no index column {groups!r} for the groups; columns: {', '.join(idx)}")
    mask = np.ones(n, dtype=bool)
    if position_kind:
        if "position_kind" not in idx:
            raise ProbeError("the store has no position_kind column")
        kinds = sorted(set(str(k) for k in idx["position_kind"]))
        if position_kind not in kinds:
            raise ProbeError(f"position kind {position_kind!r} not in the store (it holds {', '.join(kinds)})")
        mask &= np.asarray([str(k) == position_kind for k in idx["position_kind"]])
    values = None
    if label in idx:
        values = np.asarray([str(v) for v in idx[label]], dtype=object)
        if all(v in _MISSING for v in values[mask]):
            values = None
    if values is None:
        if run is None:
            raise ProbeError(f"label {label!r} is not an index column of the store (or is empty); columns: "
                             f"{', '.join(idx)}; pass --run RUN_DIR to take it from a run's episode records")
        from memtoc.runs.runstore import RunStore

        joined = {str(r["episode_id"]): str(r.get(label)) for r in RunStore.read(run).episodes.records()}
        values = np.asarray([joined.get(str(e), "") for e in idx["episode_id"]], dtype=object)
    present = sorted(set(values[mask]) - set(_MISSING))
    if positive is None or negative is None:
        if len(present) != 2:
            raise ProbeError(f"label {label!r} takes values {present}; name the two classes with --positive / "
                             "--negative")
        negative, positive = (negative or present[0]), (positive or present[1])
        if negative == positive:
            negative = present[0] if positive == present[1] else present[1]
    for v in (positive, negative):
        if v not in present:
            raise ProbeError(f"label {label!r} has no rows with value {v!r} (values: {present})")
    mask &= np.isin(values, [positive, negative])
    rows = np.flatnonzero(mask)
    row_sets = None
    if reduce not in ("none", "last", "mean"):
        raise ProbeError(f"unknown --reduce {reduce!r}; choose none, last or mean")
    if reduce != "none":
        by_ep: dict[str, list[int]] = {}
        for r in rows:
            by_ep.setdefault(str(idx["episode_id"][r]), []).append(int(r))
        if reduce == "last":
            tok = idx.get("token_index")
            rows = np.array([max(rs, key=lambda r: int(tok[r]) if tok is not None else r) for rs in by_ep.values()])
        else:
            row_sets = [np.array(rs) for rs in by_ep.values()]
            rows = np.array([rs[0] for rs in by_ep.values()])
    y = (values[rows] == positive).astype(int)
    g = np.asarray([str(v) for v in idx[groups][rows]], dtype=object)
    meta = {"label": label, "positive": positive, "negative": negative, "groups": groups,
            "position_kind": position_kind, "reduce": reduce, "label_source": "run" if label not in idx else "store"}
    return ProbeData(rows=rows, y=y, groups=g, row_sets=row_sets, meta=meta)


# -- output -----------------------------------------------------------------------------------------------------

def plot_auroc(report: ProbeReport, path: str | Path, *, title: str | None = None) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s.site for s in report.sites]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.fill_between(xs, [s.ci_low for s in report.sites], [s.ci_high for s in report.sites], alpha=0.25,
                    label="95% bootstrap interval (questions)")
    ax.plot(xs, [s.auroc_pooled for s in report.sites], marker="o", ms=3, label="pooled out-of-fold AUROC")
    ax.errorbar(xs, [s.auroc_mean for s in report.sites], yerr=[0 if np.isnan(s.auroc_sd) else s.auroc_sd
                                                              for s in report.sites],
                fmt="none", ecolor="gray", alpha=0.6, label="fold mean ± sd")
    if any(s.null_mean is not None for s in report.sites):
        ax.plot(xs, [np.nan if s.null_mean is None else s.null_mean for s in report.sites], ls=":", color="gray",
                label="permutation null (mean)")
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("site (0 = embeddings, s = output of block s-1)")
    ax.set_ylabel("AUROC")
    m = report.meta
    what = f"{m['label']}: {m.get('positive')} vs {m.get('negative')}" if m.get("label") else "linear probe"
    ax.set_title(title or f"{what} ({m.get('n_splits')}-fold grouped CV, C={m.get('C')})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_probe_report(report: ProbeReport, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "probe.json", "csv": out / "probe.csv", "markdown": out / "probe.md",
             "plot": out / "probe_auroc.png"}
    from memtoc.core.fileio import json_ready, write_json_atomic

    write_json_atomic(paths["json"], json_ready(report.to_dict()))
    head = ["site", "auroc_pooled", "ci_low", "ci_high", "auroc_mean", "auroc_sd", "null_mean", "null_p",
            "n_convergence_warnings"]
    lines = [",".join(head)]
    md = ["| site | AUROC (pooled) | 95% CI | fold mean ± sd | null p |", "|---:|---:|---|---|---:|"]
    for s in report.sites:
        d = asdict(s)
        lines.append(",".join("" if d[h] is None or (isinstance(d[h], float) and np.isnan(d[h])) else f"{d[h]:.6g}"
                              if isinstance(d[h], float) else str(d[h]) for h in head))
        md.append(f"| {s.site} | {s.auroc_pooled:.3f} | [{s.ci_low:.3f}, {s.ci_high:.3f}] | "
                  f"{s.auroc_mean:.3f} ± {s.auroc_sd:.3f} | {'' if s.null_p is None else f'{s.null_p:.3g}'} |")
    paths["csv"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    m = report.meta
    header = [f"# Linear probe: {m.get('label')} = {m.get('positive')} vs {m.get('negative')}", "",
              f"- {m['n']} examples ({m['n_positive']} positive, {m['n_negative']} negative) from {m['n_groups']} "
              f"groups ({m.get('groups')}); position kind {m.get('position_kind')}",
              f"- {m['model']}, C={m['C']}; {m['n_splits']}-fold cross-validation grouped by {m.get('groups')} "
              f"(seed {m['seed']}); interval: cluster bootstrap over groups ({m['n_boot']} resamples)", ""]
    paths["markdown"].write_text("\n".join(header + md) + "\n", encoding="utf-8")
    plot_auroc(report, paths["plot"])
    return paths


