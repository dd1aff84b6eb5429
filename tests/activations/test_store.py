"""The store: lossless dtypes, chunk layout, reader selections, journal commits, torn writes, full disks,
unwritable paths."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from activations import ActivationStoreError
from activations.store import (INDEX_COLUMNS, ActivationWriter, RowBlock, open_store, site_name,
                               storage_report)
from memtoc.core.errors import MemtocError

D = 8
SITES = (0, 2, 5)
IDENTITY = {"model": "m1", "prompt_version": 2, "sites": list(SITES)}
PROV = {"model_id": "m1", "weights_sha256": "ab" * 32, "benchmark_files": {"q.jsonl": "cd" * 32},
        "prompt_version": 2, "package_version": "0.1.0"}


def _block(episodes, rows_per_episode, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    n = sum(rows_per_episode)
    eids = [e for e, k in zip(episodes, rows_per_episode) for _ in range(k)]
    index = {"episode_id": eids, "question_id": [e.split("-")[0] for e in eids], "condition": ["tool_wrong"] * n,
             "arm": ["tool_wrong"] * n, "formulation": ["reference"] * n, "position_kind": ["all"] * n,
             "token_index": list(range(n)), "token_id": [7] * n, "token_str": [f"t{i}\x00" for i in range(n)]}
    acts = {s: (torch.randn(n, D, generator=g) * 10 ** s).to(dtype) for s in SITES}
    meta = [{"episode_id": e, "n_rows": k, "n_prompt_tokens": 10 + k} for e, k in zip(episodes, rows_per_episode)]
    return RowBlock(episodes=meta, index=index, acts=acts)


def _writer(path, storage="float32", identity=IDENTITY, **kw):
    return ActivationWriter.open(path, identity=identity, provenance=PROV, sites=SITES, d_model=D,
                                 storage_dtype=storage, **kw)


@pytest.mark.parametrize("storage,model_dtype", [("float32", torch.float32), ("float16", torch.float16),
                                                 ("bfloat16", torch.bfloat16)])
def test_roundtrip_is_lossless_for_the_model_dtype(tmp_path, storage, model_dtype):
    path = tmp_path / "a.h5"
    b1, b2 = _block(["e1", "e2"], [3, 2], 1, model_dtype), _block(["e3"], [4], 2, model_dtype)
    with _writer(path, storage) as w:
        w.append(b1)
        w.append(b2)
        assert w.finish(planned=["e1", "e2", "e3"])
    with open_store(path) as st:
        assert st.layers == list(SITES) and st.d_model == D and len(st) == 9 and st.complete
        for s in SITES:
            ref = torch.cat([b1.acts[s], b2.acts[s]]).to(torch.float32).numpy()   # torch's own decode
            got = st.read(s)
            assert got.dtype == np.float32 and np.array_equal(got, ref)
        raw = st.read_raw(5)
        if storage == "bfloat16":
            bits = torch.cat([b1.acts[5], b2.acts[5]]).view(torch.int16).numpy().view(np.uint16)
            assert raw.dtype == np.uint16 and np.array_equal(raw, bits)
            assert st.attrs["encoding"] == "bfloat16-as-uint16"
        else:
            assert raw.dtype == np.dtype(storage)


def test_chunks_are_row_blocks_of_whole_layers_and_compression_applies(tmp_path):
    path = tmp_path / "c.h5"
    with _writer(path, compression="gzip", compression_opts=6) as w:
        w.append(_block(["e1"], [5], 1))
        w.finish(planned=["e1"])
    with h5py.File(path, "r") as f:
        ds = f["acts"][site_name(2)]
        assert ds.chunks[1] == D and ds.chunks[0] >= 1024 and ds.maxshape == (None, D)
        assert ds.compression == "gzip" and ds.compression_opts == 6 and ds.shuffle
        assert ds.attrs["source"].startswith("output of block 1")
        assert f["acts"][site_name(0)].attrs["source"].startswith("embedding output")
        assert set(f["index"]) == set(INDEX_COLUMNS)


def test_chunk_rows_sets_the_row_blocks_and_an_extension_keeps_them(tmp_path):
    path = tmp_path / "r.h5"
    blocks = [_block([f"e{i}"], [4], i) for i in range(3)]
    with _writer(path, chunk_rows=3) as w:
        w.append(blocks[0])
        w.append(blocks[1])
        w.finish(planned=[f"e{i}" for i in range(3)])
    with h5py.File(path, "r") as f:
        assert {f["acts"][site_name(s)].chunks for s in SITES} == {(3, D)}
    with _writer(path) as w:                             # no chunk_rows: the store's own
        w.append(blocks[2])
        assert w.finish(planned=[f"e{i}" for i in range(3)])
    with h5py.File(path, "r") as f:
        assert f["acts"][site_name(5)].chunks == (3, D)
        assert np.array_equal(f["acts"][site_name(5)][:], torch.cat([b.acts[5] for b in blocks]).numpy())
    for bad in (0, -2, 2.5, True, "4"):
        with pytest.raises(ActivationStoreError, match=f"chunk_rows must be a whole number of at least 1, got {bad!r}"):
            _writer(tmp_path / "bad.h5", chunk_rows=bad)


def test_compressed_store_is_written_without_dead_space_and_extends(tmp_path):
    path = tmp_path / "z.h5"
    blocks = [_block([f"e{i}"], [3], i) for i in range(6)]
    with _writer(path, compression="gzip", compression_opts=6) as w:
        for b in blocks[:5]:
            w.append(b)
        w.finish(planned=[f"e{i}" for i in range(6)])
    rep = storage_report(path)
    assert rep["file_bytes"] <= 1.25 * rep["dataset_bytes"] + (1 << 20)     # no dead space
    with _writer(path, compression="gzip") as w:         # still a resumable store
        assert len(w.done) == 5
        w.append(blocks[5])
        assert w.finish(planned=[f"e{i}" for i in range(6)])
    with open_store(path) as st:
        assert st.complete and st.attrs["compression"] == "gzip" and st.attrs["prompt_version"] == 2
        assert np.array_equal(st.read(2), torch.cat([b.acts[2] for b in blocks]).numpy())
        assert st.index["episode_id"].tolist() == [f"e{i}" for i in range(6) for _ in range(3)]
    with h5py.File(path, "r") as f:                      # the extension keeps the store's filters
        assert f["acts"][site_name(2)].compression_opts == 6


def test_reader_index_attrs_and_row_selection(tmp_path):
    path = tmp_path / "r.h5"
    b = _block(["q1-a", "q2-b"], [4, 3], 3)
    with _writer(path) as w:
        w.append(b)
        w.finish(planned=["q1-a", "q2-b", "never-run"])
    with open_store(path) as st:
        assert not st.complete                              # one planned episode is missing
        idx = st.index
        assert list(idx)[:3] == ["row", "episode_id", "question_id"]
        assert idx["row"].tolist() == list(range(7))
        assert idx["episode_id"].tolist() == b.index["episode_id"]
        assert idx["token_str"][0] == "t0\u2400"             # NUL is not storable in HDF5 strings
        assert idx["followed_tool"].tolist() == [-1] * 7 and idx["cell"].tolist() == [""] * 7
        assert st.attrs["benchmark_files"] == PROV["benchmark_files"] and st.attrs["prompt_version"] == 2
        assert st.attrs["weights_sha256"] == PROV["weights_sha256"]
        full = b.acts[2].numpy()
        assert np.array_equal(st.read(2, [5, 0, 5, 2]), full[[5, 0, 5, 2]])
        assert np.array_equal(st.read(2, slice(1, 6, 2)), full[1:6:2])
        mask = np.zeros(7, bool)
        mask[[1, 6]] = True
        assert np.array_equal(st.read(2, mask), full[mask])
        assert np.array_equal(st.read(2, st.select(episode_id="q2-b")), full[4:7])
        assert st.episodes["row_start"].tolist() == [0, 4] and st.episodes["row_stop"].tolist() == [4, 7]
        with pytest.raises(ActivationStoreError, match="layer 1 is not stored"):
            st.read(1)
        with pytest.raises(ActivationStoreError, match="out of range"):
            st.read(2, [7])


def _reference(path, blocks, planned):
    with _writer(path) as w:
        for b in blocks:
            w.append(b)
        assert w.finish(planned=planned)


def _same(a, b):
    with open_store(a) as st, open_store(b) as ref:
        assert len(st) == len(ref) > 0 and st.n_episodes == ref.n_episodes
        for s in SITES:
            assert np.array_equal(st.read_raw(s), ref.read_raw(s))
        for col in ref.index:
            assert np.array_equal(st.index[col], ref.index[col]), col
        for col in ref.episodes:
            assert np.array_equal(st.episodes[col], ref.episodes[col]), col


def _tree_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_torn_journal_batch_is_invisible_and_cut_on_resume(tmp_path):
    """A crash after a batch's chunk reached the disk but before (or while) its journal line was written."""
    path, ref_path = tmp_path / "t.h5", tmp_path / "ref.h5"
    b1, b2 = _block(["e1", "e2"], [2, 3], 1), _block(["e3", "e4"], [1, 2], 2)
    _reference(ref_path, [b1, b2], ["e1", "e2", "e3", "e4"])
    with _writer(path) as w:
        w.append(b1)
        jdir = w.journal_dir
    assert not path.exists() and jdir == tmp_path / "t.h5.journal"
    (jdir / "c000002.chunk").write_bytes(b"MTCHUNK1 half a batch")       # renamed, never journaled
    (jdir / ".c000003.chunk.tmp").write_bytes(b"\0" * 100)               # a temp file of a killed write
    with (jdir / "journal.jsonl").open("ab") as fh:                       # a torn journal line
        fh.write(b'{"chunk":"c000002.chunk","bytes":21,"sha')
    before = _tree_bytes(tmp_path)
    with open_store(path) as st:                      # the reader sees batch 1 only, and writes nothing
        assert len(st) == 5 and st.n_episodes == 2 and not st.complete
        assert st.read(0).shape == (5, D) and len(st.index["episode_id"]) == 5
        assert np.array_equal(st.read(5, [4, 0]), b1.acts[5].numpy()[[4, 0]])
    assert _tree_bytes(tmp_path) == before
    with _writer(path) as w:
        assert w.done == {"e1", "e2"} and w.n_rows == 5
        assert sorted(p.name for p in jdir.iterdir()) == ["c000001.chunk", "header.json", "journal.jsonl", "lock"]
        w.append(b2)
        assert w.finish(planned=["e1", "e2", "e3", "e4"])
    assert not jdir.exists()
    with open_store(path) as st:
        assert st.complete
    _same(path, ref_path)


def test_legacy_store_torn_in_place_is_cut_on_resume(tmp_path):
    """A store of the former in-place writer with rows beyond its commit marker stays readable and extends."""
    path, ref_path = tmp_path / "t.h5", tmp_path / "ref.h5"
    b1, b2 = _block(["e1", "e2"], [2, 3], 1), _block(["e3", "e4"], [1, 2], 2)
    _reference(ref_path, [b1, b2], ["e1", "e2", "e3", "e4"])
    _reference(path, [b1], ["e1", "e2"])
    with h5py.File(path, "r+") as f:
        for s in SITES:
            ds = f["acts"][site_name(s)]
            ds.resize(ds.shape[0] + 4, axis=0)
            ds[-4:] = 99.0
        for name in ("row_start", "row_stop"):
            f["episodes"][name].resize(3, axis=0)
        ends = f["index"]["token_str"]["ends"]        # a text column whose offsets outran its bytes
        ends.resize(ends.shape[0] + 2, axis=0)
        ends[-2:] = [10 ** 6, 10 ** 6 + 1]
        f.attrs["complete"] = False
    with open_store(path) as st:
        assert len(st) == 5 and st.n_episodes == 2 and not st.complete
    with _writer(path) as w:
        assert w.done == {"e1", "e2"} and w.n_rows == 5
        w.append(b2)
        assert w.finish(planned=["e1", "e2", "e3", "e4"])
    _same(path, ref_path)


def test_crash_after_the_rename_before_the_journal_is_removed(tmp_path):
    """The store file was replaced, the journal not yet removed: it is not applied twice."""
    path = tmp_path / "r.h5"
    b1, b2 = _block(["e1"], [2], 1), _block(["e2"], [3], 2)
    _reference(path, [b1], ["e1"])
    keep = tmp_path / "keep"
    with _writer(path) as w:
        w.append(b2)
        import shutil

        shutil.copytree(w.journal_dir, keep)
        w.finish(planned=["e1", "e2"])
    shutil.copytree(keep, tmp_path / "r.h5.journal")      # as if killed before the journal was removed
    with open_store(path) as st:
        assert st.complete and len(st) == 5 and st.index["episode_id"].tolist() == ["e1"] * 2 + ["e2"] * 3
    with _writer(path) as w:
        assert w.n_rows == 5 and w.done == {"e1", "e2"}
        assert w.finish(planned=["e1", "e2"])
    with open_store(path) as st:
        assert st.complete and len(st) == 5


def test_a_journal_for_another_version_of_the_store_is_refused(tmp_path):
    path = tmp_path / "v.h5"
    with _writer(path) as w:
        w.append(_block(["e1"], [2], 1))                  # a job killed before it finished ...
    _reference(tmp_path / "other.h5", [_block(["x"], [1], 3)], ["x"])
    (tmp_path / "other.h5").rename(path)                  # ... then a store file put in its place by hand
    with open_store(path) as st:                          # the reader shows the store file alone
        assert st.complete and st.index["episode_id"].tolist() == ["x"]
    with pytest.raises(ActivationStoreError, match=r"v.h5.journal holds batches of a job that extended another"):
        _writer(path)


def test_a_second_writer_is_refused_while_the_first_is_open(tmp_path):
    path = tmp_path / "l.h5"
    w = _writer(path)
    w.append(_block(["e1"], [2], 1))
    with pytest.raises(ActivationStoreError, match="being written by another process"):
        _writer(path)
    w.close()
    with _writer(path) as w2:
        assert w2.done == {"e1"}


def test_reopening_clears_complete_until_finished(tmp_path):
    path = tmp_path / "k.h5"
    with _writer(path) as w:
        w.append(_block(["e1"], [2], 1))
        assert w.finish(planned=["e1"])
    w = _writer(path)            # a new job starts and is killed before it finishes
    w.close()
    with open_store(path) as st:
        assert not st.complete and len(st) == 2


def test_a_store_made_with_other_settings_is_refused_and_left_intact(tmp_path):
    path = tmp_path / "s.h5"
    with _writer(path) as w:
        w.append(_block(["e1"], [2], 1))
        w.finish(planned=["e1"])
    before = path.read_bytes()
    with pytest.raises(ActivationStoreError, match=r"different settings \(model: model 'm1' here vs 'm2' now"):
        _writer(path, identity={**IDENTITY, "model": "m2"})
    with pytest.raises(ActivationStoreError, match="prompt_version"):
        _writer(path, identity={**IDENTITY, "prompt_version": 3})
    assert path.read_bytes() == before
    with open_store(path) as st:
        assert st.complete and len(st) == 2


def test_duplicate_episode_is_refused(tmp_path):
    with _writer(tmp_path / "d.h5") as w:
        w.append(_block(["e1"], [2], 1))
        with pytest.raises(ActivationStoreError, match="already stored"):
            w.append(_block(["e1"], [1], 2))
        assert w.n_rows == 2


def test_not_a_store(tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    with pytest.raises(ActivationStoreError, match="not an HDF5 file"):
        open_store(junk)
    with pytest.raises(ActivationStoreError, match="no such activation store"):
        open_store(tmp_path / "missing.h5")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["x"] = 1
    with pytest.raises(MemtocError, match="not a memtoc activation store"):
        open_store(other)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("Unable to synchronously flush file (errno = 28)")])
def test_disk_full_during_a_batch_keeps_the_last_commit(tmp_path, monkeypatch, error):
    import memtoc.core.durable as durable

    path, ref_path = tmp_path / "f.h5", tmp_path / "ref.h5"
    b1, b2 = _block(["e1"], [3], 1), _block(["e2"], [2], 2)
    _reference(ref_path, [b1, b2], ["e1", "e2"])
    w = _writer(path)
    w.append(b1)
    real = durable.write_all
    calls = {"n": 0}

    def full(fd, buffers):              # the chunk gets half its bytes, then the disk is full
        calls["n"] += 1
        real(fd, [bytes(memoryview(buffers[0]))[:10]])
        raise error

    monkeypatch.setattr(durable, "write_all", full)
    with pytest.raises(ActivationStoreError, match="no space left on device.*keeps its 1 committed episodes"):
        w.append(b2)
    monkeypatch.undo()
    assert calls["n"] == 1
    assert sorted(p.name for p in w.journal_dir.iterdir()) == ["c000001.chunk", "header.json", "journal.jsonl",
                                                               "lock"]
    w.close()
    with open_store(path) as st:
        assert len(st) == 3 and not st.complete
        assert np.array_equal(st.read(5), b1.acts[5].numpy())
    with _writer(path) as w:                              # space freed: the job resumes
        assert w.done == {"e1"}
        w.append(b2)
        assert w.finish(planned=["e1", "e2"])
    _same(path, ref_path)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   RuntimeError("Unable to synchronously flush file (errno = 28)")])
def test_disk_full_while_the_store_file_is_written(tmp_path, monkeypatch, error):
    """h5py raises RuntimeError or OSError: both leave the old file and the journal, and the resume finishes."""
    import activations.store as store_mod

    path, ref_path = tmp_path / "g.h5", tmp_path / "ref.h5"
    b1, b2 = _block(["e1"], [3], 1), _block(["e2"], [2], 2)
    _reference(ref_path, [b1, b2], ["e1", "e2"])
    _reference(path, [b1], ["e1"])
    before = path.read_bytes()
    real = store_mod._put
    n = {"c": 0}

    def fill_up(ds, start, data):
        n["c"] += 1
        if n["c"] > 2:
            raise error
        return real(ds, start, data)

    with _writer(path) as w:
        w.append(b2)
        monkeypatch.setattr(store_mod, "_put", fill_up)
        with pytest.raises(ActivationStoreError, match=r"cannot write activation store .*g.h5: no space left on "
                                                       r"device.*2 committed episodes are kept in"):
            w.finish(planned=["e1", "e2"])
        monkeypatch.undo()
    assert path.read_bytes() == before                    # the old store file is untouched
    assert not list(tmp_path.glob("g.h5.journal/*.tmp"))
    with open_store(path) as st:                          # old file + journal: both batches, not complete
        assert len(st) == 5 and not st.complete
    with _writer(path) as w:
        assert w.done == {"e1", "e2"}
        assert w.finish(planned=["e1", "e2"])
    _same(path, ref_path)
    with open_store(path) as st:
        assert st.complete


def test_truncated_store_file_gets_an_honest_message(tmp_path):
    path = tmp_path / "cut.h5"
    _reference(path, [_block(["e1"], [40], 1)], ["e1"])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ActivationStoreError, match="truncated or corrupt") as exc:
        open_store(path)
    assert "another process" not in str(exc.value)


def _make_unwritable(monkeypatch, target: Path):
    """chmod; where that does not bind (root), also refuse write-mode opens under ``target`` as the OS would."""
    target.chmod(0o555 if target.is_dir() else 0o444)
    probe = (target / ".probe") if target.is_dir() else target
    try:
        with open(probe, "a"):
            pass
        enforced = False
        if target.is_dir():
            probe.unlink()
    except PermissionError:
        enforced = True
    if not enforced:
        import activations.store as store_mod

        real_mkdir, real_writable = store_mod._mkdir, store_mod._writable

        def inside(p):
            p = Path(p).resolve()
            return p == target.resolve() or target.resolve() in p.parents

        def mkdir(p):
            if inside(p):
                raise PermissionError(errno.EACCES, "Permission denied", str(p))
            return real_mkdir(p)

        monkeypatch.setattr(store_mod, "_mkdir", mkdir)
        monkeypatch.setattr(store_mod, "_writable", lambda p: not inside(p) and real_writable(p))


def test_read_only_output_path_gives_a_clear_error(tmp_path, monkeypatch):
    ro_dir = tmp_path / "ro"
    ro_dir.mkdir()
    existing = tmp_path / "existing.h5"
    with _writer(existing) as w:
        w.append(_block(["e1"], [2], 1))
        w.finish(planned=["e1"])
    try:
        _make_unwritable(monkeypatch, ro_dir)
        with pytest.raises(ActivationStoreError, match="cannot create activation store .*not writable"):
            _writer(ro_dir / "new.h5")
        assert not any(ro_dir.iterdir())                   # no half-made store, no temp file
        _make_unwritable(monkeypatch, existing)
        with pytest.raises(ActivationStoreError, match="cannot open activation store .*write.*not writable"):
            _writer(existing)
    finally:
        ro_dir.chmod(0o755)
        existing.chmod(0o644)
    monkeypatch.undo()
    with open_store(existing) as st:
        assert st.complete and len(st) == 2
    assert os.access(existing, os.R_OK)
