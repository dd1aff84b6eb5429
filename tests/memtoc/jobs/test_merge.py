"""``memtoc merge`` / ``merge-activations``: shards of one tiny-model experiment join into the single-run result."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.core.errors import MemtocError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.jobs.merge import merge_activation_stores, merge_runs


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    # batch_size 1: no padding, so an episode's answer does not depend on which shard (batch) it ran in
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right", limit=2, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def _by_key(path: Path, key: str) -> dict[str, dict]:
    return {r[key]: r for r in (json.loads(l) for l in path.read_text(encoding="utf-8").splitlines())}


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_backend, tiny_model_dir):
    root = tmp_path_factory.mktemp("merge")
    log = lambda s: None  # noqa: E731
    evaluate(_cfg(tiny_model_dir, root / "a", conditions="tool_wrong"), backend=tiny_backend, log=log)
    evaluate(_cfg(tiny_model_dir, root / "b", conditions="tool_right"), backend=tiny_backend, log=log)
    evaluate(_cfg(tiny_model_dir, root / "one"), backend=tiny_backend, log=log)
    return root


def test_merged_shards_equal_one_run(shards):
    res = merge_runs([shards / "a", shards / "b"], shards / "merged", log=lambda s: None)
    merged, one = shards / "merged", shards / "one"
    for name, key in (("episodes.jsonl", "episode_id"), ("closed_book.jsonl", "key")):
        assert _by_key(merged / name, key) == _by_key(one / name, key), name
    assert res.n_duplicates == 2            # the 2 questions' closed-book records are in both shards
    info = json.loads((merged / "run.json").read_text())
    assert info["identity_sha256"] == json.loads((one / "run.json").read_text())["identity_sha256"]
    assert [Path(m["path"]).name for m in info["merged_from"]] == ["a", "b"] and info["status"] == "complete"
    s_m = json.loads((merged / "summary.json").read_text())
    s_1 = json.loads((one / "summary.json").read_text())
    assert s_m["metrics"]["metrics"] == s_1["metrics"]["metrics"]
    assert s_m["n_episodes"] == s_1["n_episodes"]
    assert not list(shards.glob(".merged.merge-tmp-*"))  # temp dir renamed away


def test_identical_overlap_is_fine_and_cli(shards):
    rc = main(["merge", str(shards / "a"), str(shards / "one"), "--out", str(shards / "cli")])
    assert rc == 0
    assert _by_key(shards / "cli" / "episodes.jsonl", "episode_id") == _by_key(shards / "one" / "episodes.jsonl",
                                                                               "episode_id")
    # an existing --out is refused unless --overwrite
    assert main(["merge", str(shards / "a"), "--out", str(shards / "cli")]) == 2
    assert main(["merge", str(shards / "a"), "--out", str(shards / "cli"), "--overwrite"]) == 0
    assert len(_by_key(shards / "cli" / "episodes.jsonl", "episode_id")) == len(
        _by_key(shards / "a" / "episodes.jsonl", "episode_id"))


def test_conflicting_duplicate_names_the_episode(shards, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(shards / "a", bad)
    lines = (bad / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    rec = json.loads(lines[0])
    rec["response"] = rec["response"] + " changed"
    lines[0] = json.dumps(rec)
    (bad / "episodes.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(MemtocError, match=rec["episode_id"]) as ei:
        merge_runs([shards / "a", bad], tmp_path / "out", log=lambda s: None)
    assert "response" in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_different_settings_refused_naming_fields(shards, tmp_path, tiny_backend, tiny_model_dir):
    other = tmp_path / "other"
    evaluate(_cfg(tiny_model_dir, other, conditions="tool_wrong", limit=1, max_new_tokens=5,
                  prompt_intervention="warn"), backend=tiny_backend, log=lambda s: None)
    with pytest.raises(MemtocError) as ei:
        merge_runs([shards / "a", other], tmp_path / "out", log=lambda s: None)
    assert "max_new_tokens" in str(ei.value) and "prompt_intervention" in str(ei.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(MemtocError, match="one of the inputs"):
        merge_runs([shards / "a"], shards / "a", log=lambda s: None)


# -- activation stores ------------------------------------------------------------------------------------

def _xcfg(out, model_dir, **kw):
    from memtoc.jobs.extract import ExtractConfig

    base = dict(model=str(model_dir), out=str(out), conditions="tool_wrong", limit=2, layers="0,2-3",
                position_kinds="last_input,tool_span", batch_size=2, device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(ExtractConfig, base)


@pytest.fixture(scope="module")
def store_shards(tmp_path_factory, tiny_backend, tiny_model_dir):
    from memtoc.jobs.extract import extract

    root = tmp_path_factory.mktemp("merge_h5")
    log = lambda s: None  # noqa: E731
    extract(_xcfg(root / "a.h5", tiny_model_dir, conditions="tool_wrong,no_tool"), backend=tiny_backend, log=log)
    extract(_xcfg(root / "b.h5", tiny_model_dir, conditions="tool_right,no_tool"), backend=tiny_backend, log=log)
    return root


def _episode_view(path):
    """episode_id -> (index rows without the row number, activations per site)."""
    from activations.store import open_store

    out = {}
    with open_store(path) as st:
        eps, idx = st.episodes, st.index
        for eid, a, b in zip(eps["episode_id"], eps["row_start"], eps["row_stop"]):
            rows = {c: v[a:b].tolist() for c, v in idx.items() if c != "row"}
            out[eid] = (rows, {s: st.read(s, slice(int(a), int(b))) for s in st.layers})
    return out


def test_merged_store_reads_back_equal_to_shards(store_shards):
    from activations.store import open_store

    out = store_shards / "merged.h5"
    res = merge_activation_stores([store_shards / "a.h5", store_shards / "b.h5"], out, log=lambda s: None)
    va, vb, vm = (_episode_view(store_shards / "a.h5"), _episode_view(store_shards / "b.h5"), _episode_view(out))
    assert res.n_duplicates == 2 and res.complete     # the 2 no_tool episodes are in both shards
    assert set(vm) == set(va) | set(vb)
    for eid, (rows, acts) in vm.items():
        ref_rows, ref_acts = va.get(eid) or vb[eid]
        assert rows == ref_rows, eid
        for s in acts:
            assert np.array_equal(acts[s], ref_acts[s]), (eid, s)
    with open_store(out) as m, open_store(store_shards / "a.h5") as a:
        assert m.complete and m.layers == a.layers and m.attrs["identity_sha256"] == a.attrs["identity_sha256"]
        assert [Path(x["path"]).name for x in m.attrs["merged_from"]] == ["a.h5", "b.h5"]
        assert m.attrs["model_id"] == a.attrs["model_id"]
        # the index is the shards' rows concatenated (shard a first, then b's new episodes)
        n_a = len(a)
        assert np.array_equal(m.read(0, slice(0, n_a)), a.read(0))
        assert len(m) == sum(len(r[0]["token_index"]) for r in vm.values())


def test_merge_activations_refusals(store_shards, tmp_path, tiny_backend, tiny_model_dir):
    import shutil

    from memtoc.jobs.extract import extract

    other = tmp_path / "other.h5"
    extract(_xcfg(other, tiny_model_dir, layers="0,3", limit=1), backend=tiny_backend, log=lambda s: None)
    assert main(["merge-activations", str(store_shards / "a.h5"), str(other), "--out", str(tmp_path / "m.h5")]) == 2
    with pytest.raises(MemtocError, match="sites"):
        merge_activation_stores([store_shards / "a.h5", other], tmp_path / "m.h5", log=lambda s: None)
    assert not (tmp_path / "m.h5").exists()
    # a conflicting duplicate: same episode, different activations
    bad = tmp_path / "bad.h5"
    shutil.copy(store_shards / "a.h5", bad)
    with h5py.File(bad, "r+") as f:
        ds = f["acts/site_002"]
        ds[0] = ds[0] + 1.0
    from activations.store import open_store

    with open_store(bad) as st:
        first = str(st.index["episode_id"][0])
    with pytest.raises(MemtocError, match=first):
        merge_activation_stores([store_shards / "a.h5", bad], tmp_path / "m.h5", log=lambda s: None)
    assert not (tmp_path / "m.h5").exists()
