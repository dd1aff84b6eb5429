"""The sandboxed executor: real runs, and hostile code contained and reported as a failed execution."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from memtoc.tasks.codeexec.sandbox import PRELUDE, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")


def _violation(result, needle: str) -> None:
    assert not result.ok
    assert result.killed_reason == "sandbox_violation", result
    assert any(needle in v for v in result.violations), result.violations


def test_normal_code_prints_the_right_stdout():
    code = ("import math, decimal, fractions, statistics\n"
            "print(round(math.log(8, 2), 3))\n"
            "print(decimal.Decimal('909.525') + decimal.Decimal('-353.218'))\n"
            "print(fractions.Fraction(1, 3) + 1, statistics.mean([1, 2, 4]))\n")
    r = run_python(code)
    assert r.ok and r.exit_code == 0 and r.killed_reason is None and not r.timed_out
    assert r.stdout == "3.0\n556.307\n4/3 2.3333333333333335\n"
    assert r.stderr == ""


def test_numpy_works_when_installed():
    pytest.importorskip("numpy")
    r = run_python("import numpy as np\nprint(np.round(np.float64(12.3456) * 2, 3))")
    assert r.ok, r.stderr
    assert r.stdout == "24.691\n"


def test_code_runs_in_an_empty_scratch_dir_that_is_removed():
    r = run_python("import os, tempfile\nprint(os.listdir('.'))\nprint(os.getcwd())\n"
                   "open('notes.txt', 'w').write('kept inside')\nprint(open('notes.txt').read())\n"
                   "print(tempfile.gettempdir() == os.getcwd() == os.environ['HOME'])")
    assert r.ok, r.stderr
    listing, cwd, notes, same = r.stdout.splitlines()
    assert listing == "['main.py']" and notes == "kept inside" and same == "True"
    assert not Path(cwd).exists()


def test_exception_gives_the_real_traceback():
    r = run_python("x = 1\nprint('before')\ny = x / 0\n")
    assert not r.ok and r.exit_code == 1 and r.killed_reason is None and r.exception == "ZeroDivisionError"
    assert r.stdout == "before\n"
    assert r.stderr.startswith("Traceback (most recent call last):\n")
    assert 'File "main.py", line 3, in <module>' in r.stderr and "y = x / 0" in r.stderr
    assert r.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert str(PRELUDE) not in r.stderr
    r = run_python("import sys\nsys.exit(4)")
    assert not r.ok and r.exit_code == 4


def test_infinite_loop_times_out_and_the_group_is_gone():
    start = time.monotonic()
    r = run_python("import os\nprint(os.getpid(), flush=True)\nwhile True:\n    pass\n", timeout_s=1.0)
    assert time.monotonic() - start < 4
    assert r.timed_out and not r.ok and r.killed_reason == "timeout"
    pid = int(r.stdout.split()[0])
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_sleeping_code_times_out():
    r = run_python("import time\ntime.sleep(60)", timeout_s=1.0)
    assert r.timed_out and r.killed_reason == "timeout"


def test_cpu_limit():
    r = run_python("x = 0\nwhile True:\n    x += 1\n", cpu_s=1, timeout_s=15.0)
    assert not r.ok and not r.timed_out and r.killed_reason in ("cpu_limit", "signal")


def test_fork_bomb_is_refused():
    r = run_python("import os\nwhile True:\n    os.fork()\n", timeout_s=5.0)
    _violation(r, "os.fork")
    assert not r.timed_out and r.exit_code == 3
    assert "SandboxViolation" in r.stderr


@pytest.mark.parametrize("code, needle", [
    ("import subprocess\nsubprocess.Popen(['sleep', '100'])", "subprocess"),
    ("import os\nos.system('echo escaped')", "os.system"),
    ("import os\nos.posix_spawn('/bin/true', ['true'], {})", "os.posix_spawn"),
    ("import os\nos.execv('/bin/true', ['true'])", "os.exec"),
    ("import multiprocessing\nmultiprocessing.Process(target=print).start()", "multiprocessing"),
])
def test_process_creation_is_refused(code, needle):
    r = run_python(code)
    _violation(r, needle)
    assert "escaped" not in r.stdout


def test_huge_allocation_is_contained():
    r = run_python("x = bytearray(10**10)\nprint('allocated')")
    assert not r.ok and r.killed_reason == "memory_limit" and r.exception == "MemoryError"
    assert "allocated" not in r.stdout


def test_growing_list_is_contained():
    r = run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10**6))\n", memory_mb=128, timeout_s=10.0)
    assert not r.ok and r.killed_reason in ("memory_limit", "signal"), r


@pytest.mark.parametrize("target", ["absolute", "parent", "symlink"])
def test_writing_outside_the_sandbox_is_refused(target):
    name = f"escape_{uuid.uuid4().hex}.txt"
    host_tmp = Path(tempfile.gettempdir())
    path = {"absolute": str(host_tmp / name), "parent": f"../{name}", "symlink": f"link/{name}"}[target]
    prefix = f"import os\nos.symlink({str(host_tmp)!r}, 'link')\n" if target == "symlink" else ""
    r = run_python(f"{prefix}with open({path!r}, 'w') as fh:\n    fh.write('escaped')\n")
    _violation(r, "open")
    assert not (host_tmp / name).exists()


def test_deleting_and_renaming_outside_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for code in (f"import os\nos.remove({str(victim)!r})", f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
                 f"import os\nos.rename({str(victim)!r}, 'mine.txt')",
                 f"from pathlib import Path\nPath({str(victim)!r}).write_text('changed')"):
        r = run_python(code)
        assert r.killed_reason == "sandbox_violation", (code, r)
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("code, needle", [
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "socket"),
    ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')", "urllib"),
    ("import http.client", "http"),
    ("import ctypes\nctypes.CDLL(None)", "ctypes"),
])
def test_network_and_ctypes_imports_are_refused(code, needle):
    _violation(run_python(code), needle)


def test_ctypes_stays_refused_after_numpy_loaded_it():
    pytest.importorskip("numpy")
    _violation(run_python("import numpy\nimport ctypes"), "ctypes")


def test_a_caught_refusal_still_fails_the_run():
    r = run_python("try:\n    import socket\nexcept ImportError as exc:\n    print('caught:', exc)\n")
    assert r.stdout.startswith("caught: the sandbox refused import")
    _violation(r, "socket")


def test_raising_limits_is_refused():
    _violation(run_python("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))"),
               "resource.setrlimit")


def test_huge_print_is_truncated():
    start = time.monotonic()
    r = run_python("print('x' * 10**8)", max_output_bytes=64_000)
    assert time.monotonic() - start < 5
    assert not r.ok and r.killed_reason == "output_limit" and r.stdout_truncated
    body, marker = r.stdout.rsplit("\n[", 1)
    assert body == "x" * 64_000 and marker.startswith("output truncated")


def test_host_process_and_cwd_are_unaffected():
    cwd, env, pid = os.getcwd(), dict(os.environ), os.getpid()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = run_python(f"import os\nos.chdir('/')\nos.environ['PATH'] = ''\nos.kill({bystander.pid}, 9)")
        _violation(r, "os.kill")
        time.sleep(0.1)
        assert bystander.poll() is None                      # the signal never reached it
    finally:
        bystander.kill()
        bystander.wait()
    assert (os.getcwd(), dict(os.environ), os.getpid()) == (cwd, env, pid)
