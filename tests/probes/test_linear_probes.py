"""Linear probes: planted signal, shuffled labels, grouping, the activation-store adapter and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from probes.linear import auroc, bootstrap_interval, grouped_folds, load_probe_data, run_probes
from probes.model import ProbeError


def _planted(n_groups=30, per_group=4, d=20, strength=3.0, seed=0):
    rng = np.random.default_rng(seed)
    groups = np.repeat([f"q{i}" for i in range(n_groups)], per_group)
    y = np.tile([0, 1], n_groups * per_group // 2)
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    X = rng.normal(size=(len(y), d)) + strength * np.outer(y - 0.5, w)
    return X, y, groups


def test_auroc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + y, 1)          # rounding makes ties
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert np.isnan(auroc(np.ones(5), np.arange(5)))


def test_planted_signal_is_found_and_shuffled_labels_are_not():
    X, y, groups = _planted()
    noise = np.random.default_rng(2).normal(size=X.shape)
    rep = run_probes({0: noise, 1: X}, [0, 1], y, groups, n_boot=200, seed=0)
    s0, s1 = rep.sites
    assert s1.auroc_pooled > 0.97 and s1.ci_low > 0.9 and s1.ci_low <= s1.auroc_pooled <= s1.ci_high
    assert abs(s0.auroc_pooled - 0.5) < 0.15
    assert len(s1.auroc_folds) == 5 and s1.auroc_mean > 0.95
    shuffled = np.random.default_rng(3).permutation(y)
    rep = run_probes({1: X}, [1], shuffled, groups, n_boot=200, seed=0)
    assert abs(rep.sites[0].auroc_pooled - 0.5) < 0.15
    assert rep.sites[0].ci_low < 0.5 < rep.sites[0].ci_high


def test_folds_never_split_a_group():
    X, y, groups = _planted(n_groups=23, per_group=6)
    folds = grouped_folds(y, groups, n_splits=5, seed=4)
    test_of = {}
    for i, (tr, te) in enumerate(folds):
        assert not set(groups[tr]) & set(groups[te])
        for g in set(groups[te]):
            assert test_of.setdefault(g, i) == i
    assert set(test_of) == set(groups)                       # every group is tested exactly once
    rep = run_probes({0: X}, [0], y, groups, n_boot=0)
    flat = [g for fold in rep.folds for g in fold]
    assert sorted(flat) == sorted(set(groups)) and len(flat) == len(set(flat))


def test_grouping_prevents_leakage_through_question_identity():
    # Labels are constant within a question and unrelated to anything but a per-question fingerprint: a probe that
    # may see the same question in training and test scores ~1; grouped folds score ~0.5.
    rng = np.random.default_rng(5)
    n_groups, per = 40, 5
    groups = np.repeat(np.arange(n_groups), per)
    y = np.repeat(rng.integers(0, 2, n_groups), per)
    fingerprints = rng.normal(size=(n_groups, 30)) * 3
    X = fingerprints[groups] + 0.1 * rng.normal(size=(len(y), 30))
    grouped = run_probes({0: X}, [0], y, groups, n_boot=0, C=1.0).sites[0].auroc_pooled
    ungrouped = run_probes({0: X}, [0], y, np.arange(len(y)), n_boot=0, C=1.0).sites[0].auroc_pooled
    assert ungrouped > 0.9 and abs(grouped - 0.5) < 0.2


def test_fewer_groups_than_folds_clamps_the_folds_with_a_warning():
    X, y, groups = _planted(n_groups=3)
    with pytest.warns(UserWarning, match="3 groups .* using 3 folds"):
        report = run_probes({0: X}, [0], y, groups, n_boot=0)
    assert report.meta["n_splits"] == 3 and len(report.folds) == 3
    assert sorted(g for fold in report.folds for g in fold) == sorted({str(g) for g in groups})   # one group each
    assert all(len(f) == 1 for f in report.folds)
    with pytest.raises(ProbeError, match="1 group"):
        run_probes({0: X}, [0], y, np.zeros_like(groups))


def test_bootstrap_interval_is_reproducible():
    X, y, groups = _planted(strength=0.8)
    s = X @ np.ones(X.shape[1])
    a = bootstrap_interval(y, s, groups, n_boot=300, seed=9)
    assert a == bootstrap_interval(y, s, groups, n_boot=300, seed=9)
    assert a[0] < auroc(y, s) < a[1]


# -- the store adapter -------------------------------------------------------------------------------------------

def _write_store(path: Path, run_dir: Path | None = None) -> Path:
    from activations.store import ActivationWriter, RowBlock

    rng = np.random.default_rng(7)
    d, sites = 8, [0, 1, 2]
    w = rng.normal(size=d)
    writer = ActivationWriter.open(path, identity={"test": 1}, provenance={"model": "synthetic"}, sites=sites,
                                   d_model=d, storage_dtype="float32")
    episodes, records = [], []
    for q in range(24):
        for cond in ("tool_right", "tool_wrong"):
            eid = f"{q}-0-{cond}-v0"
            outcome = "" if cond == "tool_right" else ("kept_memory" if (q % 3 == 0) else "followed_tool")
            records.append({"episode_id": eid, "question_id": f"{q}.0", "condition": cond,
                            "outcome": outcome or "followed_tool"})
            kinds = ["last_input"] + ["tool_span"] * 3
            y_cond = 1.0 if cond == "tool_wrong" else 0.0
            acts = {s: rng.normal(size=(4, d)) for s in sites}
            acts[2] += 3.0 * (y_cond - 0.5) * w                    # condition is linear at site 2 only
            acts[1] += 3.0 * ((outcome == "kept_memory") - 0.5) * w  # behaviour is linear at site 1
            block = RowBlock(
                episodes=[{"episode_id": eid, "n_rows": 4, "n_prompt_tokens": 30, "n_generated_tokens": 0}],
                index={"episode_id": [eid] * 4, "question_id": [f"{q}.0"] * 4, "condition": [cond] * 4,
                       "arm": [cond] * 4, "formulation": ["reference"] * 4, "position_kind": kinds,
                       "token_index": [29, 10, 11, 12], "token_id": [1, 2, 3, 4], "token_str": ["a", "b", "c", "d"],
                       "outcome": [outcome] * 4},
                acts={s: a.astype(np.float32) for s, a in acts.items()})
            writer.append(block)
            episodes.append(eid)
    writer.finish(planned=episodes)
    writer.close()
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text("{}")
        (run_dir / "closed_book.jsonl").write_text("")
        (run_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("acts")
    return _write_store(root / "acts.h5", root / "run")


def test_store_adapter_selects_rows_labels_and_groups(store_path):
    from activations.store import open_store

    with open_store(store_path) as store:
        data = load_probe_data(store, label="condition", groups="question_id")
        assert len(data.rows) == 48 and data.meta["positive"] == "tool_wrong"
        idx = store.index
        assert all(idx["position_kind"][r] == "last_input" for r in data.rows)
        assert all((idx["condition"][r] == "tool_wrong") == bool(y) for r, y in zip(data.rows, data.y))
        assert list(data.groups) == [idx["question_id"][r] for r in data.rows]
        rep = run_probes(lambda s: data.features(store, s), store.layers, data.y, data.groups, n_boot=100)
        by_site = {s.site: s.auroc_pooled for s in rep.sites}
        assert by_site[2] > 0.95 and abs(by_site[0] - 0.5) < 0.2
        # several tokens per episode: mean or last token per episode
        mean = load_probe_data(store, label="condition", position_kind="tool_span", reduce="mean")
        assert len(mean.rows) == 48
        X = mean.features(store, 2)
        first = [r for r in np.flatnonzero(idx["position_kind"] == "tool_span")
                 if idx["episode_id"][r] == idx["episode_id"][mean.rows[0]]]
        np.testing.assert_allclose(X[0], store.read(2, first).mean(0), rtol=1e-6)
        last = load_probe_data(store, label="condition", position_kind="tool_span", reduce="last")
        assert all(idx["token_index"][r] == 12 for r in last.rows)
        with pytest.raises(ProbeError, match="name the two classes"):
            load_probe_data(store, label="token_str", position_kind="")
        with pytest.raises(ProbeError, match="position kind"):
            load_probe_data(store, label="condition", position_kind="generated")


def test_behaviour_label_from_store_or_run(store_path):
    from activations.store import open_store

    with open_store(store_path) as store:
        d = load_probe_data(store, label="outcome", positive="kept_memory", negative="followed_tool")
        assert len(d.rows) == 24 and d.y.sum() == 8 and d.meta["label_source"] == "store"
        with pytest.raises(ProbeError, match="--run"):
            load_probe_data(store, label="followed_tool_by_run")
        r = load_probe_data(store, label="condition", positive="tool_wrong", negative="tool_right",
                            run=str(store_path.parent / "run"))
        assert len(r.rows) == 48


def test_cli_probe(store_path, tmp_path, capsys):
    from memtoc.cli import main

    out = tmp_path / "probe"
    assert main(["probe", "--activations", str(store_path), "--label", "outcome", "--positive", "kept_memory",
                 "--negative", "followed_tool", "--groups", "question_id", "--folds", "4", "--n-boot", "50",
                 "--out", str(out), "--no-progress"]) == 0
    assert "best site 1" in capsys.readouterr().out
    saved = json.loads((out / "probe.json").read_text())
    assert [s["site"] for s in saved["sites"]] == [0, 1, 2] and saved["meta"]["C"] == 0.05
    assert (out / "probe_auroc.png").stat().st_size > 1000 and (out / "probe.csv").exists()
    assert main(["probe", "--activations", str(store_path), "--label", "condition", "--layers", "2",
                 "--n-permutations", "3", "--n-boot", "20", "--out", str(tmp_path / "p2"), "--no-progress"]) == 0
    saved = json.loads((tmp_path / "p2" / "probe.json").read_text())
    assert saved["sites"][0]["site"] == 2 and saved["sites"][0]["null_p"] is not None
