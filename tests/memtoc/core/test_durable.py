"""The durable append-only JSONL log and the writer lock that the run store and the activation journal share."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memtoc.core.durable as durable
from memtoc.core.errors import MemtocError, RunStoreError

REPO = Path(__file__).resolve().parents[3]


class _Err(MemtocError):
    pass


def test_append_creates_commits_and_overwrites_a_torn_tail(tmp_path):
    log = tmp_path / "log.jsonl"
    assert durable.append_bytes(log, b'{"a": 1}\n') == 9
    log.write_bytes(log.read_bytes() + b'{"a": 2, "b"')                     # a kill mid-line
    res = durable.read_valid_prefix(log, lambda r: r["a"])
    assert [v for _, v in res.records] == [1] and res.torn and res.complete_bytes == 9
    assert durable.append_bytes(log, b'{"a": 3}\n', at=res.complete_bytes) == 18   # the torn tail is cut
    assert log.read_bytes() == b'{"a": 1}\n{"a": 3}\n'


def test_a_failed_append_is_undone(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    durable.append_bytes(log, b'{"a": 1}\n')
    real = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        durable.append_bytes(log, b'{"a": 2}\n')
    assert log.read_bytes() == b'{"a": 1}\n'                      # cut back to the committed line
    with pytest.raises(OSError):
        durable.append_bytes(tmp_path / "new.jsonl", b'{"a": 1}\n')
    assert not (tmp_path / "new.jsonl").exists()                 # a file the failed write created is removed
    monkeypatch.setattr(os, "fsync", real)


def test_strict_and_prefix_reading(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"k": 1}\n[2]\n{"k": 3}\n')
    with pytest.raises(_Err, match=r"x\.jsonl, line 2: expected a JSON object, got list"):
        durable.read_jsonl(p, error=_Err)
    res = durable.read_valid_prefix(p, lambda r: r["k"])           # a bad line ends the prefix, silently
    assert [v for _, v in res.records] == [1] and res.complete_bytes == 9 and res.torn
    p.write_bytes(b'{"k": 1}\n{"k": 2}')                          # a whole last record without its newline
    res = durable.read_jsonl(p)
    assert [r["k"] for _, r in res.records] == [1, 2] and res.unterminated and not res.torn
    assert [v for _, v in durable.read_valid_prefix(p, lambda r: r["k"]).records] == [1]
    with pytest.raises(_Err, match="file not found"):
        durable.read_jsonl(tmp_path / "nope.jsonl", error=_Err)
    assert durable.read_valid_prefix(tmp_path / "nope.jsonl", dict).records == []


def test_keyed_log_repairs_only_when_writing_and_raises_its_error_class(tmp_path):
    class Log(durable.JsonlLog):
        error = _Err

    p = tmp_path / "r.jsonl"
    w = Log(p, "id")
    assert w.append([{"id": "a"}, {"id": "b"}, {"id": "a"}]) == 2
    with p.open("ab") as fh:
        fh.write(b'{"id": "c", "x": tr')                           # torn
    before = p.read_bytes()
    r = Log.read(p, "id")
    assert r.torn and len(r) == 2 and p.read_bytes() == before    # a reader never writes
    with pytest.raises(_Err, match="opened for reading only"):
        r.append([{"id": "d"}])
    w2 = Log(p, "id")                                              # a writer cuts the torn line off
    assert p.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n' and "c" not in w2
    assert w2.append([{"id": "b"}, {"id": "c"}]) == 1


def _busy(info):
    return f"busy ({durable.holder_text(info)})"


def test_lock_records_its_holder_is_reentrant_only_when_asked_and_is_probed(tmp_path):
    d = tmp_path
    assert durable.lock_held(d, "L") is None                      # no lock file yet
    a = durable.WriterLock.acquire(d, "L", busy=_busy, error=_Err, reentrant=True)
    assert durable.read_lock_info(d, "L")["pid"] == os.getpid()
    b = durable.WriterLock.acquire(d, "L", busy=_busy, error=_Err, reentrant=True)   # shares the lease
    a.release()
    assert durable.lock_held(d, "L") and durable.held_here(d, "L")
    b.release()
    assert not durable.held_here(d, "L") and durable.lock_held(d, "L") is False

    c = durable.WriterLock.acquire(d, "J", busy=_busy, error=_Err)
    with pytest.raises(_Err, match=rf"busy \(pid {os.getpid()} on host"):             # not re-entrant
        durable.WriterLock.acquire(d, "J", busy=_busy, error=_Err)
    c.release()
    durable.WriterLock.acquire(d, "J", busy=_busy, error=_Err).release()


def test_another_process_holding_the_lock_is_refused_and_seen_alive(tmp_path):
    code = ("import sys, time; from pathlib import Path; import memtoc.core.durable as d; "
            "lk = d.WriterLock.acquire(Path(sys.argv[1]), 'L', busy=str); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline().strip() == "held"
        assert durable.lock_held(tmp_path, "L") is True
        with pytest.raises(RunStoreError, match=rf"busy \(pid {proc.pid} "):
            durable.WriterLock.acquire(tmp_path, "L", busy=_busy, error=RunStoreError, retry_s=0.1)
    finally:
        proc.kill()
        proc.wait()
    assert durable.lock_held(tmp_path, "L") is False               # the kernel dropped it with the process
