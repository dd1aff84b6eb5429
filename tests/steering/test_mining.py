"""Feature mining: MI ranking, frequency cross-check, budget selection, the mining job, held-out guard, end to end."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock
from steering.mi import MiningError, mi_binned, mi_knn_fast, mi_knn_sklearn
from steering.mining import MiningConfig, mine_features
from memtoc.jobs.mining import parse_sae_arg
from steering.mining_select import (budget_count, expectation_difference, frequency_order, frequency_separation,
                                    rank_order, select_features, side_targets, spec_features, topk_agreement)
from steering.sae import site_hook_name

SPEC_FIELDS = {"schema_version", "name", "kind", "layers", "positions", "strength", "apply_to_closed_book", "sae",
               "features", "steer_toward", "fvu", "fvu_threshold", "force"}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- synthetic data ------------------------------------------------------------------------------------------

def planted(n_eps=200, n_feat=2000, planted_ids=(11, 222, 777, 1500, 1999), seed=0):
    """Sparse non-negative codes; the planted latents fire mostly for one label (alternating sides)."""
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n_eps // 2)
    rng.shuffle(y)
    p_fire = rng.uniform(0.05, 0.4, n_feat)
    z = (rng.random((n_eps, n_feat)) < p_fire) * rng.exponential(1.0, (n_eps, n_feat))
    for i, j in enumerate(planted_ids):
        on = y == (i % 2)                    # even planted index: fires for label 0, odd: for label 1
        fire = np.where(on, rng.random(n_eps) < 0.85, rng.random(n_eps) < 0.1)
        z[:, j] = fire * (1.0 + rng.exponential(1.0, n_eps))
    return z.astype(np.float32), y, list(planted_ids)


def test_mi_ranking_recovers_planted_features_and_frequency_agrees():
    z, y, ids = planted()
    mi = mi_knn_sklearn(z, y, random_state=0)
    for name, est in (("knn", mi), ("knn-fast", mi_knn_fast(z, y, random_state=0)), ("binned", mi_binned(z, y))):
        top = set(rank_order(est)[:5].tolist())
        assert top == set(ids), (name, sorted(top))
    agree = topk_agreement(rank_order(mi), frequency_order(z, y), k=20)
    assert agree["overlap"] >= len(ids) and 0 < agree["jaccard"] <= 1
    assert set(frequency_order(z, y)[:5].tolist()) == set(ids)
    # sides: planted index 0, 2, 4 fire for label 0 (followed tool), 1, 3 for label 1 (kept memory)
    e = expectation_difference(z, y)
    f = frequency_separation(z, y)
    assert all(e[j] < 0 and f["delta"][j] < 0 for j in ids[0::2]) and all(e[j] > 0 and f["delta"][j] > 0
                                                                           for j in ids[1::2])
    # reproducible: a fixed random_state gives identical MI
    np.testing.assert_array_equal(mi_knn_sklearn(z[:, :300], y, random_state=0),
                                  mi_knn_sklearn(z[:, :300], y, random_state=0))


def _knn_reference(c, d, k=3):
    """The Ross (2014) estimator written out with exact distances (points strictly closer than the k-th
    same-label neighbour, the point itself included)."""
    from scipy.special import digamma

    n = len(c)
    rad, kk, lc = np.empty(n), np.empty(n), np.empty(n)
    for lab in np.unique(d):
        m = d == lab
        kc = min(k, m.sum() - 1)
        dist = np.abs(c[m][:, None] - c[m][None, :])
        np.fill_diagonal(dist, np.inf)
        rad[m] = np.sort(dist, 1)[:, kc - 1]
        kk[m], lc[m] = kc, m.sum()
    cnt = np.array([(np.abs(c - c[i]) < rad[i]).sum() for i in range(n)])
    return max(0.0, digamma(n) + digamma(kk).mean() - digamma(lc).mean() - digamma(cnt).mean())


def test_fast_knn_estimator_is_sklearns_estimator():
    from steering.mi import _prepare_like_sklearn

    rng = np.random.default_rng(3)
    n, f = 240, 400
    y = rng.integers(0, 2, n)
    z = (np.maximum(rng.standard_normal((n, f)) - 0.8, 0) * rng.exponential(1, (n, f))).astype(np.float32)
    z[:, :10] += (2 * y[:, None] * rng.random((n, 10))).astype(np.float32)
    z[:, 10] = 0                                    # a dead latent
    fast, ref = mi_knn_fast(z, y, random_state=0, chunk=128), mi_knn_sklearn(z, y, random_state=0)
    close = np.isclose(fast, ref, rtol=0, atol=1e-9)
    assert close.mean() >= 0.99, np.flatnonzero(~close)
    assert rank_order(fast)[:20].tolist() == rank_order(ref)[:20].tolist()
    # and exactly the estimator's definition (same preprocessing), also for tiny classes
    for n_small in (9, 40):
        zs, ys = z[:n_small, :25], y[:n_small].copy()
        ys[:2] = [0, 1]
        pre = _prepare_like_sklearn(zs, 0)
        want = np.array([_knn_reference(pre[:, j], ys) for j in range(zs.shape[1])])
        np.testing.assert_allclose(mi_knn_fast(zs, ys, random_state=0), want, rtol=0, atol=1e-12)


def test_budget_selection_and_sides_on_a_hand_built_case():
    mi = np.array([0.5, 0.3, 0.1, 0.1, 0.0])
    e = np.array([+1.0, -2.0, 0.0, +0.5, +1.0])
    assert budget_count(mi, 0.5) == 2          # cumulative 0.5 is not > 0.5; 0.8 is
    assert budget_count(mi, 0.7) == 2 and budget_count(mi, 0.85) == 3 and budget_count(mi, 0.3) == 1
    assert budget_count(mi, 1.0) == 4          # never exceeded: every latent with MI > 0
    assert budget_count(np.zeros(4), 0.5) == 0
    with pytest.raises(MiningError):
        budget_count(mi, 0)
    assert select_features(mi, e, 0.7) == {"k": 2, "memory": [0], "tool": [1], "total_mi": pytest.approx(1.0)}
    sel = select_features(mi, e, 0.85)         # K = 3: latent 2 (E = 0) is skipped, latent 3 fills the budget
    assert sel["memory"] == [0, 3] and sel["tool"] == [1]
    sel = select_features(mi, e, 1.0)          # latent 4 has no MI: never selected
    assert sel["memory"] == [0, 3] and sel["tool"] == [1]
    # targets: the mean code over the episodes of the side's behaviour (1 = kept memory, 0 = followed tool)
    z = np.array([[2.0, 0.0, 0, 1.0, 0], [4.0, 1.0, 0, 3.0, 0], [0.0, 5.0, 0, 0.0, 0], [1.0, 7.0, 0, 0.0, 0]])
    y = np.array([1, 1, 0, 0])
    t = {"memory": side_targets(z, y, sel["memory"], 1), "tool": side_targets(z, y, sel["tool"], 0)}
    np.testing.assert_allclose(t["memory"], [3.0, 2.0])
    np.testing.assert_allclose(t["tool"], [6.0])
    assert spec_features(sel, t, "memory") == {"remove": [1], "remove_targets": [6.0], "add": [0, 3],
                                               "add_targets": [3.0, 2.0]}
    assert spec_features(sel, t, "tool") == {"remove": [0, 3], "remove_targets": [3.0, 2.0], "add": [1],
                                             "add_targets": [6.0]}


# -- the mining job on a synthetic store ----------------------------------------------------------------------

D = 16
MEM_LATENT, TOOL_LATENT = 3, 7


def identity_sae(root: Path, site: int, d: int = D) -> Path:
    """A ReLU SAE with identity encoder/decoder: its code is relu(x), so planted dimensions are its latents."""
    import sae_lens

    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=d, d_sae=d))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(d))
        sae.W_dec.copy_(torch.eye(d))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    sae.cfg.metadata["hook_name"] = site_hook_name(site)
    sae.save_model(str(root))
    return root


def synthetic_store(path: Path, *, n_questions=40, labels_in_store=True, outcome_of=None, seed=0, site=2):
    """One tool_wrong episode per demo question (fold A = even ids); kept-memory episodes carry latent 3,
    followed-tool episodes latent 7. Each episode also has 3 `all` rows (token 0 is a huge BOS that must be
    ignored); latent 3 peaks at token "MEM" in fold A and even higher at "LEAK" in fold B (must be ignored)."""
    rng = np.random.default_rng(seed)
    outcome_of = outcome_of or (lambda q: "neither" if q % 10 == 8 else ["kept_memory", "followed_tool"][(q // 2) % 2])
    truth = {}
    with ActivationWriter.open(path, identity={"synthetic": seed}, provenance={"model_id": "synthetic"},
                               sites=[site], d_model=D, storage_dtype="float32") as w:
        for q in range(n_questions):
            out = outcome_of(q)
            eid = f"{q}-0-tool_wrong-v0"
            truth[eid] = out
            last = np.maximum(rng.standard_normal(D) - 1.0, 0)
            if out == "kept_memory":
                last[MEM_LATENT] = 2.0 + rng.random()
            elif out == "followed_tool":
                last[TOOL_LATENT] = 3.0 + rng.random()
            toks = np.zeros((3, D))
            toks[0, :] = 50.0                                          # BOS / sink row (token_index 0)
            toks[1, MEM_LATENT] = (9.0 if q % 2 == 0 else 20.0) + q / 100
            toks[2, MEM_LATENT] = 1.0
            acts = np.vstack([toks, last[None]])
            index = {"episode_id": [eid] * 4, "question_id": [f"{q}.0"] * 4, "condition": ["tool_wrong"] * 4,
                     "arm": ["tool"] * 4, "formulation": ["reference"] * 4,
                     "position_kind": ["all", "all", "all", "last_input"], "token_index": [0, 1, 2, 2],
                     "token_id": [0, 1, 2, 2],
                     "token_str": ["<s>", "MEM" if q % 2 == 0 else "LEAK", "x", "x"]}
            if labels_in_store:
                index["outcome"] = [out] * 4
                index["kept_memory"] = [int(out == "kept_memory")] * 4
                index["followed_tool"] = [int(out == "followed_tool")] * 4
            w.append(RowBlock(episodes=[{"episode_id": eid, "n_rows": 4}], index=index, acts={site: acts}))
        w.finish(planned=[])
    return path, truth


def _cfg(tmp_path, store, **kw):
    base = dict(activations=str(store), sae={2: {"path": str(identity_sae(tmp_path / "sae", 2))}}, fit_fold="A",
                out=str(tmp_path / "mined"), budget=0.5, seed=0)
    base.update(kw)
    return MiningConfig(**base)


def test_mining_job_on_a_synthetic_store(tmp_path):
    store, truth = synthetic_store(tmp_path / "acts.h5")
    res = mine_features(_cfg(tmp_path, store), log=lambda s: None)
    lay = res.layers[2]
    fold_a = {e: o for e, o in truth.items() if int(e.split("-")[0]) % 2 == 0}
    assert res.counts["kept_memory"] == sum(o == "kept_memory" for o in fold_a.values())
    assert res.counts["followed_tool"] == sum(o == "followed_tool" for o in fold_a.values())
    assert res.counts["other_outcomes"] == sum(o == "neither" for o in fold_a.values()) > 0
    assert set(rank_order(lay.mi)[:2].tolist()) == {MEM_LATENT, TOOL_LATENT}
    assert MEM_LATENT in lay.selection["memory"] and TOOL_LATENT in lay.selection["tool"]
    assert all(lay.expectation[j] > 0 for j in lay.selection["memory"])
    assert all(lay.expectation[j] < 0 for j in lay.selection["tool"])
    # targets are the class means of relu(x) (the identity SAE's code), computed here independently
    from activations.store import open_store

    with open_store(store) as st:
        idx = st.index
        rows = np.flatnonzero(idx["position_kind"] == "last_input")
        x = np.maximum(st.read(2, rows), 0)
        outs = idx["outcome"][rows]
        q_even = np.array([int(float(q)) % 2 == 0 for q in idx["question_id"][rows]])
    mem_target = x[(outs == "kept_memory") & q_even][:, MEM_LATENT].mean()
    tool_target = x[(outs == "followed_tool") & q_even][:, TOOL_LATENT].mean()
    spec = json.loads(res.spec_path.read_text())
    assert SPEC_FIELDS <= set(spec) and spec["kind"] == "sae_clamp" and spec["schema_version"] == "memtoc-edit-v1"
    assert spec["layers"] == [2] and spec["positions"] == "last_input" and spec["strength"] == 1.0
    assert spec["apply_to_closed_book"] is False and spec["force"] is False and spec["fvu_threshold"] == 0.5
    assert (res.out / spec["sae"]["2"]["path"]).resolve() == (tmp_path / "sae").resolve()
    f = spec["features"]["2"]
    assert f["add"][f["add"].index(MEM_LATENT)] == MEM_LATENT and TOOL_LATENT in f["remove"]
    assert f["add_targets"][f["add"].index(MEM_LATENT)] == pytest.approx(mem_target, rel=1e-5)
    assert f["remove_targets"][f["remove"].index(TOOL_LATENT)] == pytest.approx(tool_target, rel=1e-5)
    assert spec["fvu"]["2"] < 0.5            # relu(x) reconstructs the mostly non-negative rows well
    # the table: CSV and Markdown, top tokens from fold-A `all` rows without the first token
    with (res.out / "features.csv").open() as fh:
        table = list(csv.DictReader(fh))
    mem_row = next(r for r in table if int(r["feature"]) == MEM_LATENT)
    assert mem_row["side"] == "memory" and mem_row["role"] == "add" and mem_row["site"] == "2"
    toks = json.loads(mem_row["top_tokens"])
    assert toks[0][0] == "MEM" and all(t[0] not in ("LEAK", "<s>") for t in toks)
    md = (res.out / "features.md").read_text()
    assert "| 2 | 3 | memory | add |" in md and "`MEM`" in md
    report = json.loads((res.out / "mining.json").read_text())
    assert report["eval_folds"] == ["B"] and all(int(float(q)) % 2 == 0 for q in report["mining_question_ids"])
    assert report["layers"]["2"]["agreement"]["overlap"] >= 2
    # steer toward tool: the reverse roles
    tool = mine_features(_cfg(tmp_path, store, steer_toward="tool", out=str(tmp_path / "t")), log=lambda s: None)
    ft = tool.spec["features"]["2"]
    assert ft["remove"] == f["add"] and ft["add"] == f["remove"] and ft["remove_targets"] == f["add_targets"]


def test_mining_refuses_overlap_with_the_evaluation_questions(tmp_path):
    store, _ = synthetic_store(tmp_path / "acts.h5")
    with pytest.raises(MiningError, match=r"held-out violation: (\d+) of the \1 mining questions are also evaluation"):
        mine_features(_cfg(tmp_path, store, eval_folds=["A"]), log=lambda s: None)
    with pytest.raises(MiningError, match=r"held-out violation: 1 of the 16 mining questions.*e\.g\. 4\.0\)"):
        mine_features(_cfg(tmp_path, store, eval_question_ids=["4.0", "5.0"]), log=lambda s: None)
    assert not (tmp_path / "mined" / "edit.json").exists()


def test_too_few_episodes_of_a_behaviour(tmp_path):
    store, _ = synthetic_store(tmp_path / "acts.h5", outcome_of=lambda q: "followed_tool" if q != 2 else "kept_memory")
    with pytest.raises(MiningError, match=r"found 1 kept_memory and 19 followed_tool .*need at least 2 of each"):
        mine_features(_cfg(tmp_path, store), log=lambda s: None)


def test_labels_from_the_run_and_disagreement(tmp_path):
    from memtoc.runs.runstore import RunStore

    store, truth = synthetic_store(tmp_path / "acts.h5", labels_in_store=False)
    with pytest.raises(MiningError, match="no behaviour labels.*--run"):
        mine_features(_cfg(tmp_path, store), log=lambda s: None)
    run = RunStore.open(tmp_path / "run", identity={"model": "synthetic"}, run_info={})
    run.episodes.append([{"episode_id": e, "outcome": o} for e, o in truth.items()])
    res = mine_features(_cfg(tmp_path, store, run=str(tmp_path / "run")), log=lambda s: None)
    assert MEM_LATENT in res.layers[2].selection["memory"] and res.report["labels"]["labels"] == "run"
    # a store labelled by one run and mined with a run that says otherwise is refused
    labelled, _ = synthetic_store(tmp_path / "labelled.h5")
    flipped = RunStore.open(tmp_path / "flipped", identity={"model": "synthetic"}, run_info={})
    flipped.episodes.append([{"episode_id": e, "outcome": {"kept_memory": "followed_tool"}.get(o, o)}
                             for e, o in truth.items()])
    with pytest.raises(MiningError, match="disagree with run"):
        mine_features(_cfg(tmp_path, labelled, run=str(tmp_path / "flipped")), log=lambda s: None)


def test_wrong_site_sae_and_sae_argument(tmp_path):
    store, _ = synthetic_store(tmp_path / "acts.h5")
    other = identity_sae(tmp_path / "sae_site1", 1)
    with pytest.raises(MiningError, match="site 1, not site 2"):
        mine_features(_cfg(tmp_path, store, sae={2: {"path": str(other)}}), log=lambda s: None)
    assert parse_sae_arg("2=a/b,5=pretrained:rel:layer_4/width_16k") == {
        2: {"path": "a/b"}, 5: {"release": "rel", "sae_id": "layer_4/width_16k"}}
    with pytest.raises(MiningError, match="say which site"):
        parse_sae_arg(str(tmp_path))


# -- end to end on the tiny model -----------------------------------------------------------------------------

def _rewrite(path: Path, fn) -> None:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    path.write_text("".join(json.dumps(fn(r), ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")


def test_end_to_end_on_the_tiny_model(tmp_path, tiny_backend, tiny_model_dir, capsys, monkeypatch):
    """evaluate -> extract --run -> sae train -> mine-features on the tiny random model.

    The tiny model's answers match neither the tool value nor memory, so every outcome is "neither". The run is
    copied and its tool_wrong records are edited to alternate between kept_memory and followed_tool (by question
    within each formulation) so that both behaviours exist; the extraction then joins these edited labels.
    """
    from memtoc.jobs.extract import ExtractConfig, extract
    from memtoc.cli import main
    from memtoc.jobs.evaluate import evaluate
    from memtoc.core.values import build_config
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    run = tmp_path / "run"
    common = dict(model=str(tiny_model_dir), benchmark="demo", formulations="reference,paraphrase_a",
                  conditions="tool_wrong", limit=6, device="cpu", dtype="float32")
    evaluate(build_config(EvaluationConfig, {**common, "out": str(run), "batch_size": 6, "max_new_tokens": 8,
                                             "progress": False}), backend=tiny_backend, log=lambda s: None)
    recs = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(recs) == 12
    edited = tmp_path / "run_edited"
    shutil.copytree(run, edited)
    if len({r["outcome"] for r in recs} & {"kept_memory", "followed_tool"}) < 2:
        def flip(r):
            q = int(float(r["question_id"]))
            out = "kept_memory" if (q // 2) % 2 == 0 else "followed_tool"
            r.update(outcome=out, kept_memory=out == "kept_memory", followed_tool=out == "followed_tool")
            return r
        _rewrite(edited / "episodes.jsonl", flip)
    acts = tmp_path / "acts.h5"
    res = extract(build_config(ExtractConfig, {**common, "out": str(acts), "layers": "all", "run": str(edited),
                                               "position_kinds": "last_input,all", "batch_size": 6, "progress": False}),
                  backend=tiny_backend, log=lambda s: None)
    assert res.complete and res.n_labelled == 12
    assert main(["sae", "train", "--activations", str(acts), "--layers", "2", "--d-sae", "64", "--k", "8",
                 "--steps", "300", "--batch-size", "128", "--lr", "3e-3", "--threads", "1",
                 "--out", str(tmp_path / "sae")]) == 0
    assert main(["sae", "fvu", "--sae", str(tmp_path / "sae"), "--activations", str(acts)]) == 0
    out = tmp_path / "mined"
    assert main(["mine-features", "--activations", str(acts), "--run", str(edited), "--sae",
                 f"2={tmp_path / 'sae'}", "--layers", "2", "--position-kinds", "last_input", "--benchmark", "demo",
                 "--fit-fold", "A", "--budget", "0.5", "--steer-toward", "memory", "--edit-positions", "last_input",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "edit spec:" in printed
    spec = json.loads((out / "edit.json").read_text(encoding="utf-8"))
    assert SPEC_FIELDS <= set(spec)
    assert spec["schema_version"] == "memtoc-edit-v1" and spec["kind"] == "sae_clamp" and spec["layers"] == [2]
    assert spec["positions"] == "last_input" and spec["steer_toward"] == "memory" and spec["strength"] == 1.0
    assert spec["apply_to_closed_book"] is False and spec["force"] is False and spec["fvu_threshold"] == 0.5
    assert (out / spec["sae"]["2"]["path"]).resolve() == (tmp_path / "sae").resolve()
    f = spec["features"]["2"]
    assert set(f) == {"remove", "remove_targets", "add", "add_targets"} and f["remove"] + f["add"]
    assert len(f["remove"]) == len(f["remove_targets"]) and len(f["add"]) == len(f["add_targets"])
    assert all(isinstance(i, int) and 0 <= i < 64 for i in f["remove"] + f["add"])
    assert all(t >= 0 for t in f["remove_targets"] + f["add_targets"])
    assert 0 <= spec["fvu"]["2"] < 0.5
    report = json.loads((out / "mining.json").read_text())
    assert report["counts"]["kept_memory"] >= 2 and report["counts"]["followed_tool"] >= 2
    assert set(report["mining_question_ids"]) <= {"0.0", "2.0", "4.0"}
    rows = list(csv.DictReader((out / "features.csv").open()))
    assert len(rows) == len(f["remove"]) + len(f["add"]) and all(json.loads(r["top_tokens"]) for r in rows)
    try:                          # the edit machinery's own validator, when it is present in this checkout
        from steering.spec import load_spec
    except ImportError:
        load_spec = None
    if load_spec is not None:
        assert load_spec(out / "edit.json")["features"]["2"]["add"] == f["add"]
    # an SAE path typed relative to the working directory: the report keeps it relative to the mining directory,
    # so `memtoc features` (which resolves it there) finds the SAE from any directory
    monkeypatch.chdir(tmp_path)
    assert main(["mine-features", "--activations", str(acts), "--run", str(edited), "--sae", "2=sae", "--layers",
                 "2", "--position-kinds", "last_input", "--benchmark", "demo", "--fit-fold", "A",
                 "--out", "mined-rel"]) == 0
    rel = json.loads((tmp_path / "mined-rel" / "mining.json").read_text())["sae"]["2"]["ref"]["path"]
    assert (tmp_path / "mined-rel" / rel).resolve() == (tmp_path / "sae").resolve()
    monkeypatch.chdir(out)
    assert main(["features", "--mining", str(tmp_path / "mined-rel"), "--out", str(tmp_path / "pages")]) == 0
    assert (tmp_path / "pages" / "features.html").is_file()


def test_an_edit_from_noise_level_mi_is_written_with_a_one_line_warning(tmp_path, monkeypatch):
    """Latents whose MI with the behaviour is noise-level (shown as 0.0000) still make the budget's edit, but the
    job says so in one line and records it in mining.json and the spec's source."""
    import steering.mining as mining

    def tiny_mi(z, y, **kw):
        mi = np.zeros(z.shape[1])
        mi[[MEM_LATENT, TOOL_LATENT]] = [2e-5, 1e-5]
        return mi

    monkeypatch.setattr(mining, "mutual_information", tiny_mi)
    store, _ = synthetic_store(tmp_path / "acts.h5")
    said: list[str] = []
    res = mine_features(_cfg(tmp_path, store), log=said.append)
    warned = [line for line in said if "WARNING" in line and "mutual information" in line]
    assert len(warned) == 1 and "site 2" in warned[0] and "0.0000 nats" in warned[0] and "\n" not in warned[0]
    assert res.spec_path.is_file() and MEM_LATENT in res.spec["features"]["2"]["add"]
    report = json.loads((res.out / "mining.json").read_text())
    assert report["warnings"] == warned and res.spec["source"]["warnings"] == warned
    # informative latents: no such warning
    monkeypatch.undo()
    said.clear()
    mine_features(_cfg(tmp_path, store, out=str(tmp_path / "ok")), log=said.append)
    assert not any("mutual information with the behaviour (below" in line for line in said)
