"""``merge-activations --overwrite`` is atomic and cleans up after merges that were killed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from activations import ActivationStoreError
from activations.journal import pid_alive
from activations.store import ActivationWriter, RowBlock, open_store
from memtoc.jobs.merge import merge_activation_stores

D = 4
SITES = (0, 1)


def _store(path, episodes, seed):
    g = torch.Generator().manual_seed(seed)
    n = 2 * len(episodes)
    eids = [e for e in episodes for _ in range(2)]
    index = {"episode_id": eids, "question_id": eids, "condition": ["no_tool"] * n, "arm": ["no_tool"] * n,
             "formulation": ["reference"] * n, "position_kind": ["last_input"] * n, "token_index": [1] * n,
             "token_id": [5] * n, "token_str": ["x"] * n}
    block = RowBlock(episodes=[{"episode_id": e, "n_rows": 2} for e in episodes], index=index,
                     acts={s: torch.randn(n, D, generator=g) for s in SITES})
    with ActivationWriter.open(path, identity={"t": 1}, provenance={"model_id": "m"}, sites=SITES, d_model=D,
                               storage_dtype="float32") as w:
        w.append(block)
        assert w.finish(planned=episodes)
    return block


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(proc.stdout)
    assert not pid_alive(pid)
    return pid


def test_overwrite_keeps_the_old_output_until_the_new_one_is_complete(tmp_path, monkeypatch):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    ba, bb = _store(a, ["e1", "e2"], 1), _store(b, ["e3"], 2)
    out = tmp_path / "m.h5"
    merge_activation_stores([a], out, log=lambda s: None)
    before = out.read_bytes()
    # the merge fails while the new store file is written: --out is still the old, whole store
    import activations.store as store_mod

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod, "_put", full)
    with pytest.raises(ActivationStoreError, match="no space left on device"):
        merge_activation_stores([a, b], out, overwrite=True, log=lambda s: None)
    monkeypatch.undo()
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "b.h5", "m.h5"]     # its journal is gone
    res = merge_activation_stores([a, b], out, overwrite=True, log=lambda s: None)
    assert res.complete and res.n_episodes == 3
    with open_store(out) as st:
        assert st.complete and st.index["episode_id"].tolist() == ["e1", "e1", "e2", "e2", "e3", "e3"]
        for s in SITES:
            assert np.array_equal(st.read(s), torch.cat([ba.acts[s], bb.acts[s]]).numpy())


def test_killed_merge_leaves_the_old_output_and_its_temp_is_cleaned_up(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    _store(a, ["e1"], 1)
    _store(b, ["e2"], 2)
    out = tmp_path / "m.h5"
    merge_activation_stores([a], out, log=lambda s: None)
    before = out.read_bytes()
    script = (
        "import os, signal, sys\n"
        "import activations.store as s\n"
        "real = s._write_store_file\n"
        "def die(tmp, **kw):\n"
        "    real(tmp, **kw)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"         # the new file is whole but not yet renamed
        "s._write_store_file = die\n"
        "from memtoc.jobs.merge import merge_activation_stores\n"
        f"merge_activation_stores([{str(a)!r}, {str(b)!r}], {str(out)!r}, overwrite=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert out.read_bytes() == before
    stale = [p for p in tmp_path.iterdir() if ".merge-tmp-" in p.name]
    assert len(stale) == 1 and stale[0].is_dir()
    # a temp of a process that is alive (another merge running now) is left alone
    live = tmp_path / f".m.h5.merge-tmp-{os.getppid()}"
    live.mkdir()
    dead_file = tmp_path / f".m.h5.merge-tmp-{_dead_pid()}"       # the former writer's temp file
    dead_file.write_bytes(b"old")
    logs = []
    res = merge_activation_stores([a, b], out, overwrite=True, log=logs.append)
    assert res.complete and res.n_episodes == 2
    assert sorted(p.name for p in tmp_path.iterdir() if ".merge-tmp-" in p.name) == [live.name]
    assert sum("left by a merge that was killed" in line for line in logs) == 2
    with open_store(out) as st:
        assert st.complete and st.index["episode_id"].tolist() == ["e1", "e1", "e2", "e2"]


def test_cli_merge_error_is_one_line_exit_2(tmp_path, capsys):
    from memtoc.cli import main

    a = tmp_path / "a.h5"
    _store(a, ["e1"], 1)
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 50)
    assert main(["merge-activations", str(a), str(junk), "--out", str(tmp_path / "m.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "junk.h5" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "m.h5").exists()


def _filters(path) -> dict[str, tuple]:
    """Every dataset of an HDF5 file -> (compression, compression_opts, shuffle), read with h5py itself."""
    import h5py

    out: dict[str, tuple] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, (obj.compression, obj.compression_opts, obj.shuffle))
                     if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("compression,level", [("gzip", 7), ("gzip", 1), ("lzf", None)])
def test_a_merged_store_keeps_each_datasets_compression_and_level(tmp_path, compression, level):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path, eps, seed in ((a, ["e1"], 1), (b, ["e2"], 2)):
        g = torch.Generator().manual_seed(seed)
        index = {"episode_id": eps * 2, "question_id": eps * 2, "condition": ["no_tool"] * 2,
                 "arm": ["no_tool"] * 2, "formulation": ["reference"] * 2, "position_kind": ["last_input"] * 2,
                 "token_index": [1] * 2, "token_id": [5] * 2, "token_str": ["x"] * 2}
        block = RowBlock(episodes=[{"episode_id": eps[0], "n_rows": 2}], index=index,
                         acts={s: torch.randn(2, D, generator=g) for s in SITES})
        with ActivationWriter.open(path, identity={"t": 1}, provenance={"model_id": "m"}, sites=SITES, d_model=D,
                                   storage_dtype="float32", compression=compression, compression_opts=level) as w:
            w.append(block)
            assert w.finish(planned=eps)
    source = _filters(a)
    assert source["acts/site_000"][:2] == (compression, level)        # the sources carry the level asked for
    out = tmp_path / "m.h5"
    merge_activation_stores([a, b], out, log=lambda s: None)
    assert _filters(out) == source
    with open_store(out) as st:
        assert st.compression_opts == level and len(st) == 4


def test_merging_stores_of_different_compression_levels_is_refused(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path, level in ((a, 4), (b, 9)):
        block = RowBlock(episodes=[{"episode_id": path.stem, "n_rows": 1}],
                         index={"episode_id": [path.stem], "position_kind": ["last_input"]},
                         acts={s: torch.ones(1, D) for s in SITES})
        with ActivationWriter.open(path, identity={"t": 1}, provenance={}, sites=SITES, d_model=D,
                                   storage_dtype="float32", compression="gzip", compression_opts=level) as w:
            w.append(block)
            w.finish(planned=[path.stem])
    with pytest.raises(ActivationStoreError, match="compression_opts 9 differs"):
        merge_activation_stores([a, b], tmp_path / "m.h5", log=lambda s: None)


def _chunked_store(path, eid: str, chunk_rows: int | None) -> None:
    block = RowBlock(episodes=[{"episode_id": eid, "n_rows": 4}],
                     index={"episode_id": [eid] * 4, "position_kind": ["last_input"] * 4},
                     acts={s: torch.ones(4, D) for s in SITES})
    with ActivationWriter.open(path, identity={"t": 1}, provenance={}, sites=SITES, d_model=D,
                               storage_dtype="float32", chunk_rows=chunk_rows) as w:
        w.append(block)
        assert w.finish(planned=[eid])


def _act_chunks(path) -> set[tuple]:
    """The chunk shapes of the store's activation datasets, read with h5py itself."""
    import h5py

    with h5py.File(path, "r") as f:
        return {ds.chunks for ds in f["acts"].values()}


@pytest.mark.parametrize("rows_a,rows_b", [(3, 3), (3, 5)])
def test_a_merged_store_keeps_the_sources_chunk_rows_when_they_agree(tmp_path, rows_a, rows_b):
    a, b, default = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "default.h5"
    _chunked_store(a, "e1", rows_a)
    _chunked_store(b, "e2", rows_b)
    _chunked_store(default, "e3", None)                 # the writer's own chunking, the reference when they differ
    assert _act_chunks(a) == {(rows_a, D)} and _act_chunks(b) == {(rows_b, D)}
    out = tmp_path / "m.h5"
    merge_activation_stores([a, b], out, log=lambda s: None)
    want = _act_chunks(a) if rows_a == rows_b else _act_chunks(default)
    assert want != {(3, D)} or rows_a == rows_b         # the default is not the sources' 3 rows by chance
    assert _act_chunks(out) == want
    with open_store(out) as st:
        assert len(st) == 8
