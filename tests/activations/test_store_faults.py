"""Fault injection with strace: SIGKILL and ENOSPC at sampled write-family system calls of a real ``memtoc
extract`` and ``memtoc merge-activations`` (tiny model); every resume must equal the uninterrupted run and no
store may be reported complete with other data. Seven points keep CI time (spread over the job's file calls:
batches, commits, the store file, the merge's output); the full sweep (every call, default model) is
``benchmarks/fault_inject_store.py --all``."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STRACE = shutil.which("strace")


def _strace_works() -> bool:
    if STRACE is None:
        return False
    proc = subprocess.run([STRACE, "-qq", "-o", "/dev/null", "-e", "inject=write:error=ENOSPC:when=1", "true"],
                          capture_output=True)
    return proc.returncode == 0


pytestmark = pytest.mark.skipif(not _strace_works(), reason="strace is not installed or cannot trace here "
                                "(apt-get install strace); the fault-injection tests need it")


def _fi():
    spec = importlib.util.spec_from_file_location("fault_inject_store", REPO / "benchmarks" / "fault_inject_store.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                 # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _check(results, n_points, *, all_injected):
    """Every resume identical; no state after a fault unsound (complete-but-different, old merge output gone,
    fewer episodes than had been committed when the fault hit)."""
    bad = [r for r in results if not (r.resumed_identical and r.state_ok)]
    assert not bad, "\n".join(f"{r.job} {r.fault} at {r.call.syscall}#{r.call.nth}: {r.detail} | {r.call.text}"
                              for r in bad)
    assert len(results) == n_points
    assert not any("COMPLETE BUT DIFFERENT" in r.detail for r in results)
    if all_injected:
        assert all(r.rc in (-9, 137) for r in results), [(r.call, r.rc) for r in results]


def _points(fi, job, root, k):
    """``k`` calls spread over those on files of the job (not its writes to stdout/stderr)."""
    mine = [i for i, c in enumerate(job.calls) if fi.on_files_under(c, root)]
    return [mine[j] for j in fi.pick_points(len(mine), k)]


def test_kill_and_enospc_at_sampled_calls_of_extract_and_merge(tmp_path, tiny_model_dir):
    fi = _fi()
    cli = fi._InProcessCLI()
    args = ["--model", str(tiny_model_dir), "--conditions", "tool_wrong,no_tool", "--limit", "2", "--layers",
            "0,2-3", "--position-kinds", "last_input,tool_span", "--batch-size", "2", "--device", "cpu", "--dtype",
            "float32"]
    ex = fi.extract_job(tmp_path, args, cli)
    fi.prepare_reference(ex, STRACE, tmp_path)
    kinds = {c.syscall for c in ex.calls}
    assert {"writev", "fsync", "rename", "pwrite64"} <= kinds, kinds     # batches, commits, the store file
    _check(fi.run_sweep(ex, STRACE, ["kill"], _points(fi, ex, tmp_path, 3), log=lambda s: None), 3, all_injected=True)
    _check(fi.run_sweep(ex, STRACE, ["enospc"], _points(fi, ex, tmp_path, 2), log=lambda s: None), 2,
           all_injected=False)
    mj = fi.merge_job(tmp_path, ex.reference, cli)
    fi.prepare_reference(mj, STRACE, tmp_path)
    _check(fi.run_sweep(mj, STRACE, ["kill"], _points(fi, mj, tmp_path, 1), log=lambda s: None), 1, all_injected=True)
    _check(fi.run_sweep(mj, STRACE, ["enospc"], _points(fi, mj, tmp_path, 1), log=lambda s: None), 1,
           all_injected=False)
