"""The sandbox holes, each closed, each with its control.

Every attack here is run (1) against the protection it is about and must be stopped, and (2) where a layer
can be switched off, with exactly that layer off, where it must *succeed* -- so each test proves that the
attack is real and that this protection, not something else, stops it. The report-channel cases have no
switch (the old channel is gone); their control is inside the attack: the forged lines really reach a pipe
the parent reads (the code counts its successful writes), yet the verdict does not move.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memtoc.tasks.codeexec.isolation import LAYERS
from memtoc.tasks.codeexec.sandbox import _remove_tree, isolation_status, run_python

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux"),
              pytest.mark.filterwarnings("ignore::memtoc.tasks.codeexec.sandbox.SandboxIsolationWarning")]

IPC_CREAT, IPC_EXCL, IPC_RMID, IPC_PRIVATE = 0o1000, 0o2000, 0, 0


def _needs(*layers: str) -> None:
    missing = [m for m in isolation_status().missing if m.split(":", 1)[0] in layers]
    if missing:
        pytest.skip("kernel layer not available here: " + "; ".join(missing))


def _without(*layers: str) -> tuple[str, ...]:
    return tuple(x for x in LAYERS if x not in layers)


#: Switches the audit hook off from inside, as the audit did: its ``refuse`` closure cell, through gc.
GC_TRICK = '''import gc, types
for _f in gc.get_objects():
    if isinstance(_f, types.FunctionType) and _f.__name__ == "hook" and _f.__closure__:
        for _c in _f.__closure__:
            if getattr(_c.cell_contents, "__name__", "") == "refuse":
                _c.cell_contents = lambda *a, **k: None
'''

# --- System V IPC: the IPC namespace ----------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.shmdt.argtypes = [ctypes.c_void_p]
    return libc


@pytest.fixture
def host_segment():
    """A root-owned 0600 SysV segment of the host (as the audit's victim), with its key; removed afterwards."""
    libc = _libc()
    for _ in range(20):
        key = random.randrange(1 << 20, 1 << 30)
        shmid = libc.shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0o600)
        if shmid >= 0:
            break
    else:
        pytest.skip(f"no SysV shared memory here (errno {ctypes.get_errno()})")
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, b"host secret", 11)
    yield key, lambda: ctypes.string_at(addr, 11)
    libc.shmdt(ctypes.c_void_p(addr))
    libc.shmctl(shmid, IPC_RMID, None)


_READ_SEGMENT = '''import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
shmid = libc.shmget({key}, 0, 0)
if shmid < 0:
    print("unreachable", ctypes.get_errno())
else:
    addr = libc.shmat(shmid, None, 0)
    print("read", ctypes.string_at(addr, 11))
    ctypes.memmove(addr, b"overwritten", 11)
'''


@pytest.mark.parametrize("config", ["full_gc_trick", "kernel_only", "ipcns"])
def test_a_host_segment_is_unreachable(config, host_segment):
    _needs("ipcns")
    key, contents = host_segment
    kw = {"full_gc_trick": {}, "kernel_only": {"audit_hook": False},
          "ipcns": {"audit_hook": False, "layers": ("ipcns",)}}[config]
    code = (GC_TRICK if config == "full_gc_trick" else "") + _READ_SEGMENT.format(key=key)
    r = run_python(code, timeout_s=20.0, **kw)
    assert r.stdout.startswith("unreachable 2"), r          # ENOENT: no such segment in this namespace
    assert contents() == b"host secret"


def test_control_a_host_segment_is_read_and_overwritten_without_the_ipc_namespace(host_segment):
    key, contents = host_segment
    r = run_python(_READ_SEGMENT.format(key=key), audit_hook=False, layers=_without("ipcns"), timeout_s=20.0)
    assert r.ok and r.stdout == "read b'host secret'\n", r
    assert contents() == b"overwritten"


_FIND_QUEUE = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nq = libc.msgget({key}, 0)\n"
               "print('unreachable' if q < 0 else 'found', ctypes.get_errno() if q < 0 else q)")


@pytest.mark.parametrize("ipcns", [True, False], ids=["ipcns", "control_without"])
def test_a_host_message_queue_is_unreachable(ipcns):
    if ipcns:
        _needs("ipcns")
    libc = _libc()
    key = random.randrange(1 << 20, 1 << 30)
    msqid = libc.msgget(key, IPC_CREAT | IPC_EXCL | 0o600)
    if msqid < 0:
        pytest.skip(f"no SysV message queues here (errno {ctypes.get_errno()})")
    try:
        r = run_python(_FIND_QUEUE.format(key=key), audit_hook=False,
                       layers=LAYERS if ipcns else _without("ipcns"))
    finally:
        libc.msgctl(msqid, IPC_RMID, None)
    assert r.stdout == ("unreachable 2\n" if ipcns else f"found {msqid}\n"), r


def _host_segments() -> dict[int, tuple[int, int]]:
    """shmid -> (size, creator pid) of the host's SysV segments."""
    out = {}
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        f = line.split()
        out[int(f[1])] = (int(f[3]), int(f[4]))
    return out


_MAKE_SEGMENT = '''import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(os.getpid(), libc.shmget(0, 64 << 20, 0o1000 | 0o600), libc.msgget(0, 0o1000 | 0o600))
'''


def _leftovers(pid: int, before: dict) -> list[int]:
    return [i for i, (size, cpid) in _host_segments().items() if i not in before and cpid == pid]


def test_a_segment_made_inside_dies_with_the_namespace():
    _needs("ipcns")
    before = _host_segments()
    r = run_python(_MAKE_SEGMENT, audit_hook=False)
    pid, shmid, msqid = (int(x) for x in r.stdout.split())
    assert r.ok and shmid >= 0 and msqid >= 0, r             # it was made, inside
    assert _leftovers(pid, before) == []


def test_control_a_segment_made_without_the_ipc_namespace_stays_on_the_host():
    before = _host_segments()
    r = run_python(_MAKE_SEGMENT, audit_hook=False, layers=_without("ipcns"))
    pid, shmid, msqid = (int(x) for x in r.stdout.split())
    left = _leftovers(pid, before)
    libc = _libc()
    for i in left:
        libc.shmctl(i, IPC_RMID, None)
    libc.msgctl(msqid, IPC_RMID, None)
    assert left == [shmid]


def test_the_hostname_belongs_to_the_sandbox_uts_namespace():
    _needs("ipcns")
    host = os.uname().nodename
    r = run_python("import ctypes, os\nassert ctypes.CDLL(None).sethostname(b'sandboxed', 9) == 0\n"
                   "print(os.uname().nodename)", audit_hook=False, layers=("ipcns",))
    assert r.ok and r.stdout == "sandboxed\n", r            # set inside, in its own namespace
    assert os.uname().nodename == host


# --- other processes: seccomp, whatever the uid --------------------------------------------------------------

IOPRIO_GET, IOPRIO_SET, IOPRIO_IDLE = 252, 251, 3 << 13


def _ioprio(pid: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(IOPRIO_GET, 1, pid)


def _observe(pid: int) -> tuple:
    return (os.sched_getaffinity(pid), os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid),
            resource.prlimit(pid, resource.RLIMIT_NOFILE), _ioprio(pid))


#: Attacks on a process given by pid (the code gets it as {pid}); each changes something _observe sees.
PROCESS_ATTACKS = {
    "sched_setaffinity": "import os\nos.sched_setaffinity({pid}, {{0}})",
    "setpriority": "import os\nos.setpriority(os.PRIO_PROCESS, {pid}, 19)",
    "setpriority_pgrp": "import os\nos.setpriority(os.PRIO_PGRP, {pid}, 19)",
    "sched_setscheduler": "import os\nos.sched_setscheduler({pid}, os.SCHED_IDLE, os.sched_param(0))",
    "prlimit": "import resource\nresource.prlimit({pid}, resource.RLIMIT_NOFILE, (64, 64))",
    "ioprio_set": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                   f"assert libc.syscall({IOPRIO_SET}, 1, {{pid}}, {IOPRIO_IDLE}) == 0, ctypes.get_errno()"),
}
_HOOK_BLIND = {"sched_setaffinity", "setpriority", "setpriority_pgrp", "sched_setscheduler"}  # no audit event


@pytest.fixture
def bystander():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: an affinity change cannot be seen")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield p.pid
    p.kill()
    p.wait()


@pytest.mark.parametrize("config", ["full", "kernel_only", "seccomp"])
@pytest.mark.parametrize("name", sorted(PROCESS_ATTACKS))
def test_another_process_cannot_be_reniced_pinned_or_limited(name, config, bystander):
    if config == "full" and name not in _HOOK_BLIND:
        pytest.skip("the hook refuses this one first (tests/memtoc/tasks/codeexec/test_sandbox.py)")
    _needs("seccomp")
    kw = {"full": {}, "kernel_only": {"audit_hook": False},
          "seccomp": {"audit_hook": False, "layers": ("seccomp",)}}[config]
    before = _observe(bystander)
    r = run_python(PROCESS_ATTACKS[name].format(pid=bystander) + "\nprint('changed')", timeout_s=20.0, **kw)
    assert not r.ok and r.killed_reason == "sandbox_violation" and r.exit_code == -signal.SIGSYS, r
    assert "changed" not in r.stdout
    assert _observe(bystander) == before


@pytest.mark.parametrize("name", sorted(PROCESS_ATTACKS))
def test_control_without_seccomp_the_attack_changes_the_other_process(name, bystander):
    before = _observe(bystander)
    r = run_python(PROCESS_ATTACKS[name].format(pid=bystander) + "\nprint('changed')", audit_hook=False,
                   layers=_without("seccomp"), timeout_s=20.0)
    assert r.ok and r.stdout == "changed\n", r
    assert _observe(bystander) != before


@pytest.mark.parametrize("name", ["sched_setaffinity", "setpriority", "sched_setscheduler"])
def test_the_parent_harness_cannot_be_touched(name):
    _needs("seccomp")
    before = _observe(os.getpid())
    r = run_python(PROCESS_ATTACKS[name].format(pid=os.getpid()) + "\nprint('changed')", timeout_s=20.0)
    assert r.killed_reason == "sandbox_violation" and "changed" not in r.stdout, r
    assert _observe(os.getpid()) == before


def test_the_process_may_still_tune_itself():
    _needs("seccomp")
    code = ("import os, resource\nos.sched_setaffinity(0, os.sched_getaffinity(0))\n"
            "os.sched_setaffinity(os.getpid(), os.sched_getaffinity(0))\n"
            # relative to the niceness it started with (the caller's, inherited): raising it is always allowed
            "base = os.getpriority(os.PRIO_PROCESS, 0)\nos.setpriority(os.PRIO_PROCESS, 0, min(base + 1, 19))\n"
            "os.setpriority(os.PRIO_PROCESS, os.getpid(), min(base + 2, 19))\n"
            "print(os.getpriority(os.PRIO_PROCESS, 0) - base == min(base + 2, 19) - base, "
            "resource.getrlimit(resource.RLIMIT_NOFILE))")
    r = run_python(code)
    assert r.ok and r.stdout == "True (256, 256)\n", r


# --- the report channel: nothing the code writes decides the verdict ---------------------------------------

#: Writes the forged lines to every descriptor the code may hold; prints how many writes landed.
_FORGE = '''import os
landed = 0
for fd in range(3, 256):
    try:
        os.write(fd, {lines!r}.encode())
        landed += 1
    except OSError:
        pass
print("landed", landed)
'''


@pytest.mark.parametrize("lines, name", [
    ("violation\topen\twriting '/etc/passwd'\n", "violation"),
    ("exception\tMemoryError\n", "memory_error"),
    ("exception\tPermissionError\nviolation\tos.fork\tx\n", "permission_error"),
])
def test_forged_report_lines_do_not_fail_a_clean_run(lines, name):
    r = run_python(_FORGE.format(lines=lines))
    assert int(r.stdout.split()[1]) >= 1, r                  # the forgery reached a pipe the parent reads
    assert r.ok and r.killed_reason is None and r.violations == () and r.exception is None, r


def test_a_forged_isolation_line_is_not_believed():
    _needs("netns")
    r = run_python(_FORGE.format(lines="".join(f"isolation\t{layer}\t1\tforged\n" for layer in LAYERS)),
                   layers=("netns",))
    assert int(r.stdout.split()[1]) >= 1 and r.ok, r
    assert r.isolation == ("netns",) and "forged" not in repr(r)


_BLOCKED_THEN_EXIT_0 = '''import os
{before}
try:
    open({target!r}, "w").write("escaped")
except Exception:
    pass
{exit}
'''
_CLOSE_ALL = "for fd in range(3, 256):\n    try:\n        os.close(fd)\n    except OSError:\n        pass"


@pytest.mark.parametrize("before, exit_", [
    ("", "os._exit(0)"), (_CLOSE_ALL, "os._exit(0)"), (_CLOSE_ALL, "raise SystemExit(0)"),
    ("import threading", "threading.Thread(target=os._exit, args=(0,)).start()"),
    ("", GC_TRICK + "import ctypes\nctypes.CDLL(None).syscall(60, 0)"),      # raw exit(2) after the hook is off
], ids=["exit0", "close_fds_exit0", "close_fds_sys_exit0", "exit0_from_a_thread", "gc_trick_raw_exit"])
def test_a_caught_refusal_stays_a_violation_whatever_the_code_does_next(before, exit_, tmp_path):
    _needs("seccomp")
    target = tmp_path / "escaped"
    r = run_python(_BLOCKED_THEN_EXIT_0.format(before=before, target=str(target), exit=exit_))
    assert not r.ok and r.killed_reason == "sandbox_violation", r
    assert r.exit_code in (3, -signal.SIGSYS)
    assert not target.exists()


def test_control_without_the_seccomp_witness_a_caught_refusal_and_exit_0_pass(tmp_path):
    """The hole the witness closes (and what remains where seccomp is missing, docs/sandbox.md)."""
    target = tmp_path / "escaped"
    r = run_python(_BLOCKED_THEN_EXIT_0.format(before="", target=str(target), exit="os._exit(0)"),
                   layers=_without("seccomp"))
    assert r.ok and r.killed_reason is None, r
    assert not target.exists()


def test_the_refused_action_is_named_when_the_notes_survive(tmp_path):
    _needs("seccomp")
    r = run_python(_BLOCKED_THEN_EXIT_0.format(before="", target=str(tmp_path / "x"), exit="os._exit(0)"))
    assert r.exit_code == -signal.SIGSYS and r.detail.startswith("open: writing"), r


# --- the audit hook switched off from inside --------------------------------------------------------------

def test_control_the_gc_trick_really_switches_the_hook_off():
    r = run_python(GC_TRICK + "import ctypes, socket\ns = socket.socket()\nprint('socket', s.fileno() > 0)",
                   layers=())
    assert r.ok and r.stdout == "socket True\n", r


@pytest.mark.parametrize("attack", ["socket", "fork", "ctypes_socket", "kill_parent"])
def test_with_the_hook_off_the_kernel_stops_escapes_and_records_them(attack, tmp_path):
    _needs(*LAYERS)
    target = tmp_path / "spawned"
    code = GC_TRICK + {
        "socket": "import socket\nsocket.socket()",
        "fork": f"import os\nif os.fork() == 0:\n    open({str(target)!r}, 'w')\n    os._exit(0)",
        "ctypes_socket": "import ctypes\nctypes.CDLL(None).socket(2, 1, 0)",
        "kill_parent": f"import os\nos.kill({os.getpid()}, 0)",          # a probe: harmless if it got through
    }[attack] + "\nprint('escaped')"
    r = run_python(code)
    assert not r.ok and r.killed_reason == "sandbox_violation" and r.exit_code == -signal.SIGSYS, r
    assert "escaped" not in r.stdout and not target.exists()


def test_with_the_hook_off_an_uncaught_kernel_refusal_is_a_violation(tmp_path):
    _needs("landlock")
    r = run_python(GC_TRICK + f"open({str(tmp_path / 'x')!r}, 'w')")
    assert r.killed_reason == "sandbox_violation" and r.exit_code == 3 and "Permission denied" in r.detail, r
    assert list(tmp_path.iterdir()) == []


# --- clean-up that cannot raise ---------------------------------------------------------------------------

_DEEP = '''import os
print(os.getcwd(), flush=True)
depth = 0
try:
    for _ in range(3000):
        os.mkdir("d")
        os.chdir("d")
        depth += 1
finally:
    print(depth)
'''


def _deep_tree(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def test_control_shutil_rmtree_raises_on_3000_nested_directories(tmp_path):
    root = tmp_path / "deep"
    root.mkdir()
    try:
        _deep_tree(root, 3000)
        with pytest.raises(RecursionError):
            shutil.rmtree(root)
    finally:
        _remove_tree(str(root))                    # else pytest's own tmp clean-up trips over it later
    assert not root.exists()


@pytest.mark.parametrize("hook", [True, False], ids=["full", "kernel_only"])
def test_3000_nested_directories_do_not_make_run_python_raise(hook):
    r = run_python(_DEEP, audit_hook=hook, timeout_s=120.0, cpu_s=120)
    scratch, depth = r.stdout.split()
    assert int(depth) >= 1500, r                      # deep enough for rmtree's recursion limit
    assert not Path(scratch).exists()


def test_clean_up_removes_unreadable_directories_and_never_follows_links(tmp_path):
    (tmp_path / "keep.txt").write_text("keep me")
    r = run_python(f"import os\nos.mkdir('locked', 0)\nos.makedirs('a/b')\nos.symlink({str(tmp_path)!r}, 'a/b/out')\n"
                   "os.symlink('/', 'root')\nos.mkfifo('a/fifo')\nprint(os.getcwd())")
    assert r.ok, r
    assert not Path(r.stdout.strip()).exists()
    assert (tmp_path / "keep.txt").read_text() == "keep me"


def test_clean_up_swallows_what_it_cannot_remove(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")
    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(os, "unlink", refuse)
    _remove_tree(str(tmp_path))                        # no exception
    assert (tmp_path / "f").exists()
    monkeypatch.undo()
    _remove_tree(str(tmp_path / "missing"))            # nothing there: no exception either
