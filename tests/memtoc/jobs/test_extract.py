"""The extraction job on the tiny model: resume, refusals, label join, CLI."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from activations import ActivationStoreError
from memtoc.jobs.extract import ExtractConfig, extract
from memtoc.core.values import build_config
from activations.store import open_store
from memtoc.bench.benchmark import load_benchmark
from memtoc.core.errors import MemtocError
from memtoc.bench.episodes import plan_episodes

REPO = Path(__file__).resolve().parents[3]


def _cfg(out, model_dir, **kw):
    base = dict(model=str(model_dir), out=str(out), conditions="tool_wrong,no_tool,tool_error", limit=4,
                layers="0,2-3", position_kinds="last_input,tool_span", batch_size=3, device="cpu", dtype="float32",
                progress=False)
    base.update(kw)
    return build_config(ExtractConfig, base)


def _same_store(a, b):
    with open_store(a) as x, open_store(b) as y:
        assert x.layers == y.layers and len(x) == len(y) > 0
        for col in y.index:
            assert np.array_equal(x.index[col], y.index[col]), col
        for name in y.episodes:
            assert np.array_equal(x.episodes[name], y.episodes[name]), name
        for s in y.layers:
            assert np.array_equal(x.read(s), y.read(s)), s
        return len(y)


class _Stop(Exception):
    pass


def _stop_after(n):
    def cb(n_batch, n_eps):
        if n_batch == n:
            raise _Stop(f"interrupted after {n} batches")
    return cb


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, tiny_backend, tiny_model_dir):
    ref = extract(_cfg(tmp_path / "ref.h5", tiny_model_dir), backend=tiny_backend, log=lambda s: None)
    assert ref.complete and ref.n_done == ref.n_planned == 12
    out = tmp_path / "acts.h5"
    with pytest.raises(_Stop):
        extract(_cfg(out, tiny_model_dir), backend=tiny_backend, on_batch=_stop_after(2))
    with open_store(out) as st:
        assert not st.complete and st.n_episodes == 6
    res = extract(_cfg(out, tiny_model_dir), backend=tiny_backend)
    assert res.complete and res.n_new_episodes == 6
    assert _same_store(out, tmp_path / "ref.h5") == ref.n_new_rows
    # Rows mean what they say: every stored row equals a fresh capture of its episode alone.
    with open_store(out) as st:
        idx = st.index
        rows = st.select(episode_id="1-0-tool_wrong-v0", position_kind="last_input")
        assert len(rows) == 1
        ep = next(e for e in plan_episodes(_eval_cfg(), load_benchmark("demo")) if e.episode_id == "1-0-tool_wrong-v0")
        batch = tiny_backend.encode([ep.prompt])
        with torch.inference_mode():
            hs = tiny_backend.model(**batch, output_hidden_states=True).hidden_states
        assert idx["token_index"][rows[0]] == batch["input_ids"].shape[1] - 1
        np.testing.assert_allclose(st.read(2, rows)[0], hs[2][0, -1].numpy(), rtol=1e-4, atol=1e-5)
    # A later job that plans more episodes clears `complete` until it finishes.
    with pytest.raises(_Stop):
        extract(_cfg(out, tiny_model_dir, conditions="all"), backend=tiny_backend, on_batch=_stop_after(1))
    with open_store(out) as st:
        assert not st.complete and st.n_episodes == 15


def _eval_cfg():
    """The evaluation of these episodes, resolved as the evaluation runs it (no protocol: the defaults)."""
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig, resolve_protocol

    return resolve_protocol(build_config(EvaluationConfig, {"conditions": "tool_wrong,no_tool,tool_error", "limit": 4}))


def test_torn_commit_is_not_complete_and_resumes_exactly(tmp_path, tiny_backend, tiny_model_dir, monkeypatch):
    """A crash while the third batch's journal line is half written (no cleanup: the process died)."""
    import activations.journal as jr

    extract(_cfg(tmp_path / "ref.h5", tiny_model_dir), backend=tiny_backend)
    out = tmp_path / "acts.h5"
    calls = {"n": 0}
    real_append = jr.append_entry

    def die_on_third_commit(jdir, entry, valid_len):
        calls["n"] += 1
        if calls["n"] == 3:
            with open(jdir / jr.JOURNAL, "ab") as fh:
                fh.write(jr.entry_line(entry)[:25])
            raise KeyboardInterrupt
        return real_append(jdir, entry, valid_len)

    monkeypatch.setattr(jr, "append_entry", die_on_third_commit)
    monkeypatch.setattr(jr, "best_effort", lambda fn: None)
    with pytest.raises(KeyboardInterrupt):
        extract(_cfg(out, tiny_model_dir), backend=tiny_backend)
    monkeypatch.undo()
    jdir = tmp_path / "acts.h5.journal"
    assert not out.exists() and (jdir / "c000003.chunk").exists()    # the torn batch's chunk is on disk ...
    assert not (jdir / jr.JOURNAL).read_bytes().endswith(b"\n")
    with open_store(out) as st:            # ... but not visible, and the store is not complete
        assert not st.complete and st.n_episodes == 6
    assert extract(_cfg(out, tiny_model_dir), backend=tiny_backend).complete
    assert not jdir.exists()
    _same_store(out, tmp_path / "ref.h5")


def test_killed_process_resumes(tmp_path, tiny_model_dir):
    """SIGKILL while a batch is half committed (chunk on disk, journal line half written), in a subprocess."""
    out = tmp_path / "acts.h5"
    script = textwrap.dedent(f"""
        import os, signal
        import activations.journal as jr
        real = jr.append_entry
        n = {{"c": 0}}
        def kill(jdir, entry, valid_len):
            n["c"] += 1
            if n["c"] == 2:
                with open(jdir / jr.JOURNAL, "ab") as fh:
                    fh.write(jr.entry_line(entry)[:30])
                os.kill(os.getpid(), signal.SIGKILL)
            return real(jdir, entry, valid_len)
        jr.append_entry = kill
        from memtoc.core.values import build_config
        from memtoc.jobs.extract import ExtractConfig, extract
        extract(build_config(ExtractConfig, dict(
            model={str(tiny_model_dir)!r}, out={str(out)!r}, conditions="tool_wrong,no_tool,tool_error", limit=4,
            layers="0,2-3", position_kinds="last_input,tool_span", batch_size=3, device="cpu", dtype="float32",
            progress=False)))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    with open_store(out) as st:
        assert not st.complete and st.n_episodes == 3
    from memtoc.backends.hf import HFBackend

    backend = HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32")
    assert extract(_cfg(out, tiny_model_dir), backend=backend).complete
    extract(_cfg(tmp_path / "ref.h5", tiny_model_dir), backend=backend)
    _same_store(out, tmp_path / "ref.h5")


def test_bad_selections_are_refused_before_anything_is_written(tmp_path, tiny_backend, tiny_model_dir):
    out = tmp_path / "x.h5"
    with pytest.raises(MemtocError, match="unknown layer '4'.*sites 0..3"):
        extract(_cfg(out, tiny_model_dir, layers="0,4"), backend=tiny_backend)
    with pytest.raises(MemtocError, match="empty position selection"):
        extract(_cfg(out, tiny_model_dir, position_kinds=" ,"), backend=tiny_backend)
    with pytest.raises(MemtocError, match="unknown --store-dtype"):
        extract(_cfg(out, tiny_model_dir, store_dtype="int8"), backend=tiny_backend)
    assert not out.exists()


def test_store_from_another_model_is_refused_and_stays_readable(tmp_path, tiny_backend, tiny_model_dir):
    import sys as _sys

    _sys.path.insert(0, str(REPO / "tests"))
    try:
        from conftest import build_tiny_model
    finally:
        _sys.path.pop(0)
    from memtoc.backends.hf import HFBackend

    other_dir = build_tiny_model(tmp_path / "other-model", seed=1)
    other = HFBackend.load(str(other_dir), device="cpu", dtype="float32")
    out = tmp_path / "acts.h5"
    extract(_cfg(out, tiny_model_dir, limit=1), backend=tiny_backend)
    before = out.read_bytes()
    with pytest.raises(ActivationStoreError, match=r"different settings \(model"):
        extract(_cfg(out, other_dir, limit=1), backend=other)
    with pytest.raises(ActivationStoreError, match="different settings.*prompt_intervention"):
        extract(_cfg(out, tiny_model_dir, limit=1, prompt_intervention="warn"), backend=tiny_backend)
    with pytest.raises(ActivationStoreError, match="different settings.*sites"):
        extract(_cfg(out, tiny_model_dir, limit=1, layers="all"), backend=tiny_backend)
    assert out.read_bytes() == before
    with open_store(out) as st:
        assert st.complete and st.n_episodes == 3


def test_disk_full_mid_job(tmp_path, tiny_backend, tiny_model_dir, monkeypatch):
    import memtoc.core.durable as durable

    extract(_cfg(tmp_path / "ref.h5", tiny_model_dir), backend=tiny_backend)
    out = tmp_path / "acts.h5"
    real = durable.write_all
    n = {"writes": 0}

    def fill_up(fd, buffers):             # every write of a batch (chunk, then journal line) goes through here
        n["writes"] += 1
        if n["writes"] > 2:               # the first batch (its chunk and its journal line) fits
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers)

    monkeypatch.setattr(durable, "write_all", fill_up)
    with pytest.raises(ActivationStoreError, match="no space left on device.*keeps its 3 committed episodes"):
        extract(_cfg(out, tiny_model_dir), backend=tiny_backend)
    monkeypatch.undo()
    with open_store(out) as st:
        assert not st.complete and st.n_episodes == 3 and st.read(3).shape == (len(st), 32)
    assert extract(_cfg(out, tiny_model_dir), backend=tiny_backend).complete
    _same_store(out, tmp_path / "ref.h5")


def test_read_only_output_directory(tmp_path, tiny_backend, tiny_model_dir, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    try:
        _unwritable(monkeypatch, ro)
        with pytest.raises(ActivationStoreError, match="not writable"):
            extract(_cfg(ro / "acts.h5", tiny_model_dir), backend=tiny_backend)
    finally:
        ro.chmod(0o755)
    assert not (ro / "acts.h5").exists()


def _unwritable(monkeypatch, target):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_act_test_store", REPO / "tests" / "activations" / "test_store.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._make_unwritable(monkeypatch, target)


def _write_run(root, episodes, provenance, *, tamper=None, model_sha=None):
    from memtoc.runs.runstore import RunStore

    identity = {"model": provenance["model"], "weights_sha256": model_sha or provenance["weights"]["sha256"],
                "prompt_version": 2}
    store = RunStore.open(root, identity=identity, run_info={"status": "complete"})
    recs = []
    for i, ep in enumerate(episodes):
        recs.append({"episode_id": ep.episode_id, "prompt": tamper if tamper and i == 0 else ep.prompt,
                     "followed_tool": i % 2 == 0, "kept_memory": i % 3 == 0,
                     "outcome": ["followed_tool", "kept_memory", "neither"][i % 3],
                     "cell": None if ep.condition == "no_tool" else f"cell{i % 4}"})
    store.episodes.append(recs)
    return recs


def test_run_labels_are_joined_by_episode_id(tmp_path, tiny_backend, tiny_model_dir):
    eps = plan_episodes(_eval_cfg(), load_benchmark("demo"))
    prov = tiny_backend.provenance()
    recs = _write_run(tmp_path / "run", eps[:7], prov)       # the run scored only some of the episodes
    out = tmp_path / "acts.h5"
    extract(_cfg(out, tiny_model_dir, limit=2), backend=tiny_backend)           # first call: no labels
    res = extract(_cfg(out, tiny_model_dir, run=str(tmp_path / "run")), backend=tiny_backend)
    assert res.complete and res.n_labelled == 7
    # Independent reference: the run's episodes.jsonl parsed directly.
    lines = [json.loads(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    by_id = {r["episode_id"]: r for r in lines}
    assert len(by_id) == len(recs)
    with open_store(out) as st:
        idx = st.index
        assert st.attrs["labels_source"]["run"] == str((tmp_path / "run").resolve())
        for i in range(len(st)):
            r = by_id.get(idx["episode_id"][i])
            if r is None:
                assert (idx["followed_tool"][i], idx["kept_memory"][i], idx["outcome"][i], idx["cell"][i]) == \
                    (-1, -1, "", "")
            else:
                assert idx["followed_tool"][i] == int(r["followed_tool"])
                assert idx["kept_memory"][i] == int(r["kept_memory"])
                assert idx["outcome"][i] == r["outcome"] and idx["cell"][i] == (r["cell"] or "")
        assert set(idx["episode_id"][idx["followed_tool"] >= 0]) == set(by_id)


def test_run_from_another_model_or_prompt_is_refused(tmp_path, tiny_backend, tiny_model_dir):
    eps = plan_episodes(_eval_cfg(), load_benchmark("demo"))
    prov = tiny_backend.provenance()
    _write_run(tmp_path / "other", eps[:3], prov, model_sha="0" * 64)
    with pytest.raises(ActivationStoreError, match="another model"):
        extract(_cfg(tmp_path / "a.h5", tiny_model_dir, run=str(tmp_path / "other")), backend=tiny_backend)
    _write_run(tmp_path / "tampered", eps[:3], prov, tamper="a different prompt")
    with pytest.raises(ActivationStoreError, match="different prompts"):
        extract(_cfg(tmp_path / "a.h5", tiny_model_dir, run=str(tmp_path / "tampered")), backend=tiny_backend)
    assert not (tmp_path / "a.h5").exists()


def test_generated_positions_in_the_store(tmp_path, tiny_backend, tiny_model_dir):
    from memtoc.core.runtime import GenerationConfig

    out = tmp_path / "g.h5"
    res = extract(_cfg(out, tiny_model_dir, limit=1, conditions="tool_wrong", position_kinds="generated",
                       max_new_tokens=5, layers="all"), backend=tiny_backend)
    ep = plan_episodes(_eval_cfg(), load_benchmark("demo"))[0]
    gen = tiny_backend.generate([ep.prompt], GenerationConfig(max_new_tokens=5))[0]
    with open_store(out) as st:
        assert res.complete and st.layers == [0, 1, 2, 3]
        rows = st.select(episode_id=ep.episode_id)
        assert st.index["token_id"][rows].tolist() == list(gen.token_ids)
        assert set(st.index["position_kind"][rows]) == {"generated"}
        assert st.episodes["n_generated_tokens"].tolist() == [gen.n_new_tokens]


def test_cli_extract(tmp_path, tiny_model_dir, capsys):
    from memtoc.cli import main

    out = tmp_path / "cli.h5"
    args = ["extract", "--model", str(tiny_model_dir), "--conditions", "tool_wrong", "--limit", "2", "--layers",
            "last", "--position-kinds", "last_input,tool_span", "--device", "cpu", "--dtype", "float32",
            "--compression", "lzf", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    assert "2/2 planned episodes stored (complete)" in capsys.readouterr().out
    with open_store(out) as st:
        assert st.layers == [3] and st.attrs["config"]["position_kinds"] == "last_input,tool_span"
        assert st.attrs["storage_dtype"] == "float32" and st.attrs["compression"] == "lzf"
    assert main(args[:8] + ["9"] + args[9:]) == 2
    assert "memtoc extract: error: --layers '9': unknown layer '9'" in capsys.readouterr().err


def _doc_section(heading: str) -> str:
    return (REPO / "docs" / "extending.md").read_text(encoding="utf-8").split(heading)[1].split("\n## ")[0]


def test_the_doc_option_touches_the_one_file_it_names():
    """docs/extending.md's ``--chunk-rows`` exercise: every line its diff blocks add is in the file the block
    names, no line they remove is, and the file is the one it claims."""
    section = _doc_section("## Add an option to a job: `extract --chunk-rows`")
    blocks = re.findall(r'```diff title="([^"]+)"\n(.*?)```', section, re.S)
    assert [f for f, _ in blocks] == ["memtoc/jobs/extract.py", "memtoc/jobs/extract.py"]
    assert "**Files touched: 1** (`memtoc/jobs/extract.py`;" in section
    for name, body in blocks:
        lines = (REPO / name).read_text(encoding="utf-8").splitlines()
        added = [ln[1:] for ln in body.splitlines() if ln.startswith("+")]
        assert added
        for ln in body.splitlines():
            assert ln[1:] in lines if ln[0] in " +" else ln[1:] not in lines, (name, ln)


def _chunks(path):
    with h5py.File(path, "r") as f:
        return {name: (ds.chunks, ds.shape[1]) for name, ds in f["acts"].items()}


def test_cli_extract_chunk_rows_sets_the_chunking(tmp_path, tiny_model_dir, capsys):
    from memtoc.cli import main

    base = ["extract", "--model", str(tiny_model_dir), "--conditions", "tool_wrong", "--limit", "2", "--layers",
            "0,3", "--position-kinds", "last_input", "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert main(base + ["--chunk-rows", "5", "--out", str(tmp_path / "c5.h5")]) == 0
    chunks = _chunks(tmp_path / "c5.h5")
    assert set(chunks) == {"site_000", "site_003"}
    assert {c for c, _ in chunks.values()} == {(5, next(iter(chunks.values()))[1])}
    with open_store(tmp_path / "c5.h5") as st:
        assert st.attrs["config"]["chunk_rows"] == 5 and len(st) == 2
    # the default: 256 KiB chunks of float32 rows
    assert main(base + ["--out", str(tmp_path / "default.h5")]) == 0
    d = next(iter(_chunks(tmp_path / "default.h5").values()))[1]
    assert {c for c, _ in _chunks(tmp_path / "default.h5").values()} == {((1 << 18) // (4 * d), d)}
    capsys.readouterr()
    assert main(base + ["--chunk-rows", "0", "--out", str(tmp_path / "bad.h5")]) == 2
    assert "--chunk-rows" in capsys.readouterr().err and not (tmp_path / "bad.h5").exists()


def test_paper_layers_are_the_family_band_as_sites(tmp_path, tiny_backend, tiny_model_dir):
    """``--layers paper``: the MemToC paper's SAE band of the model's family (Llama Scope, blocks 12-15 of 32),
    rescaled to the tiny Llama's 3 blocks (12..15 x 3/32 -> block 1) and shifted to sites (block + 1)."""
    from memtoc.bench.paper_protocol import sae_sites
    from memtoc.jobs.mining import _sites, _store_attrs

    out = tmp_path / "p.h5"
    extract(_cfg(out, tiny_model_dir, layers="paper", limit=1, conditions="tool_wrong", position_kinds="last_input"),
            backend=tiny_backend)
    with open_store(out) as st:
        assert st.layers == [2] == list(sae_sites("llama", 3))
        assert st.attrs["architecture"] == "LlamaForCausalLM" and int(st.attrs["n_layers"]) == 3
    assert _sites("paper", [2], _store_attrs(str(out))) == [2]
    with pytest.raises(MemtocError, match="no SAE dictionary 'nope' on the llama family"):
        extract(_cfg(tmp_path / "q.h5", tiny_model_dir, layers="paper:nope", limit=1), backend=tiny_backend)
    assert not (tmp_path / "q.h5").exists()
