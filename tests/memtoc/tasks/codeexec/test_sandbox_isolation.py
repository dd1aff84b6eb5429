"""Escapes from the executor sandbox, each refused, with the file system checked afterwards.

Every escape is tried (1) with the full sandbox, (2) with the kernel layers alone (audit hook off: what a
program that defeats the hook still meets), and where one layer is meant to stop it, (3) with that layer
alone. Layers the kernel does not offer here skip with the reason the sandbox reported; on the project's
machines (Linux 6.x, Landlock ABI >= 4, unprivileged user namespaces, x86_64) none skip.
"""

from __future__ import annotations

import re
import signal
import socket
import sys
import threading
import warnings
from pathlib import Path

import pytest

import memtoc.tasks.codeexec.sandbox as sandbox_mod
from memtoc.cli import main
from memtoc.tasks.codeexec.isolation import LAYERS
from memtoc.tasks.codeexec.sandbox import (
    IsolationStatus,
    SandboxIsolationError,
    SandboxLimitError,
    SandboxLimits,
    check_isolation,
    isolation_status,
    run_python,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox targets Linux")

PACKAGE = Path(sandbox_mod.__file__).resolve().parent
GOLD_FILES = [PACKAGE / "data" / "scripted_calls.json", PACKAGE / "data" / "templates.json",
              PACKAGE / "problems.py"]
SHARED = Path(__file__).resolve().parents[4].parent / "shared" / "memtoc" / "README.md"


def _status() -> IsolationStatus:
    return isolation_status()


def _needs(*layers: str):
    """Skip (with the sandbox's own reason) unless every named layer is in force on this machine."""
    missing = [m for m in _status().missing if m.split(":", 1)[0] in layers]
    if missing:
        pytest.skip("kernel layer not available here: " + "; ".join(missing))


def _refused(r) -> None:
    assert not r.ok, r
    assert r.exit_code != 0, r


# Each escape: code (formatted with out=<outside dir>, victim=<outside file>), and what must hold afterwards.
# "victim" holds "keep me" before the run and must still hold it after; "new" must not exist afterwards.
ESCAPES = {
    "open_w": ("open({victim!r}, 'w').write('changed')", None),
    "open_a": ("open({victim!r}, 'a').write('changed')", None),
    "open_new": ("open({new!r}, 'w').write('escaped')", "new"),
    "sqlite3": ("import sqlite3\nc = sqlite3.connect({new!r})\nc.execute('create table t(x)')\nc.commit()", "new"),
    "sqlite3_uri": ("import sqlite3\nc = sqlite3.connect('file:' + {new!r} + '?mode=rwc', uri=True)\n"
                    "c.execute('create table t(x)')\nc.commit()", "new"),
    "mkfifo": ("import os\nos.mkfifo({new!r})", "new"),
    "dir_fd": ("import os\nfd = os.open({out!r}, os.O_RDONLY)\n"
               "os.close(os.open({newname!r}, os.O_WRONLY | os.O_CREAT, dir_fd=fd))", "new"),
    "dir_fd_opath": ("import os\nfd = os.open({out!r}, os.O_PATH)\n"
                     "os.close(os.open({newname!r}, os.O_WRONLY | os.O_CREAT, dir_fd=fd))", "new"),
    "dir_fd_victim": ("import os\nfd = os.open({out!r}, os.O_PATH)\n"
                      "w = os.open('victim.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd)\nos.write(w, b'changed')",
                      None),
    "link_out": ("import os\nopen('f', 'w').write('escaped')\nos.link('f', {new!r})", "new"),
    "link_in": ("import os\nos.link({victim!r}, 'mine')\nopen('mine', 'w').write('changed')", None),
    "symlink_out": ("import os\nos.symlink('/etc/passwd', {new!r})", "new"),
    "symlink_through": ("import os\nos.symlink({out!r}, 'link')\nopen('link/' + {newname!r}, 'w').write('x')",
                        "new"),
    "shutil_copy": ("import shutil\nshutil.copy('main.py', {new!r})", "new"),
    "shutil_copyfile": ("import shutil\nshutil.copyfile('main.py', {victim!r})", None),
    "shutil_copytree": ("import os, shutil\nos.mkdir('d')\nshutil.copytree('d', {new!r})", "new"),
    "shutil_move": ("import shutil\nshutil.move('main.py', {new!r})", "new"),
    "shutil_move_victim": ("import shutil\nshutil.move({victim!r}, 'stolen.txt')", None),
    "rename": ("import os\nos.rename({victim!r}, 'stolen.txt')", None),
    "remove": ("import os\nos.remove({victim!r})", None),
    "truncate": ("import os\nos.truncate({victim!r}, 0)", None),
    "mkdir": ("import os\nos.mkdir({new!r})", "new"),
}


@pytest.fixture
def outside(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    return tmp_path


def _run_escape(name: str, out: Path, **kw):
    code, _ = ESCAPES[name]
    fields = {"out": str(out), "victim": str(out / "victim.txt"), "new": str(out / "escaped"),
              "newname": "escaped"}
    return run_python(code.format(**fields), timeout_s=20.0, **kw)


def _assert_untouched(name: str, out: Path) -> None:
    assert (out / "victim.txt").read_text() == "keep me", name
    assert sorted(p.name for p in out.iterdir()) == ["victim.txt"], name


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_is_refused_by_the_full_sandbox(name, outside):
    r = _run_escape(name, outside)
    _refused(r)
    assert r.killed_reason == "sandbox_violation", r
    _assert_untouched(name, outside)


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_is_refused_by_the_kernel_without_the_audit_hook(name, outside):
    _needs("landlock")
    r = _run_escape(name, outside, audit_hook=False)
    _refused(r)
    _assert_untouched(name, outside)


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_is_refused_by_landlock_alone(name, outside):
    _needs("landlock")
    r = _run_escape(name, outside, audit_hook=False, layers=("landlock",))
    _refused(r)
    _assert_untouched(name, outside)


def test_a_caught_kernel_refusal_changes_nothing(outside):
    _needs("landlock")
    code = (f"import os\ntry:\n    os.mkfifo({str(outside / 'escaped')!r})\nexcept OSError as exc:\n"
            "    print('refused', exc.errno)\n")
    r = run_python(code, audit_hook=False)
    assert r.stdout.startswith("refused 13")     # EACCES from Landlock
    _assert_untouched("caught", outside)


def test_escapes_the_audit_hook_alone_still_catches(outside):
    """Without kernel layers the hook is what is left: it refuses all but mkfifo and dir_fd opens."""
    hook_blind = {"mkfifo", "dir_fd", "dir_fd_opath", "dir_fd_victim"}
    for name in sorted(set(ESCAPES) - hook_blind):
        r = _run_escape(name, outside, layers=())
        assert r.killed_reason == "sandbox_violation" and r.violations, (name, r)
        _assert_untouched(name, outside)


# --- reads ---------------------------------------------------------------------------------------------------

def _read_code(path: Path | str) -> str:
    return f"print(open({str(path)!r}, 'rb').read()[:200])"


@pytest.mark.parametrize("hook", [True, False], ids=["full", "kernel_only"])
def test_reading_etc_passwd_is_refused(hook):
    if not hook:
        _needs("landlock")
    assert "root:" in Path("/etc/passwd").read_text()       # there is something to leak
    r = run_python(_read_code("/etc/passwd"), audit_hook=hook)
    _refused(r)
    assert "root:" not in r.stdout and r.killed_reason == "sandbox_violation"


@pytest.mark.parametrize("hook", [True, False], ids=["full", "kernel_only"])
@pytest.mark.parametrize("target", [p.name for p in GOLD_FILES] + ["shared", "run_dir"])
def test_reading_the_benchmark_is_refused(target, hook, tmp_path):
    if not hook:
        _needs("landlock")
    if target == "shared":
        if not SHARED.exists():
            pytest.skip(f"{SHARED} is not here")
        path = SHARED
    elif target == "run_dir":
        path = tmp_path / "trials.jsonl"
        path.write_text('{"gold": "SECRET-GOLD-556.307"}\n')
    else:
        path = next(p for p in GOLD_FILES if p.name == target)
    secret = path.read_bytes()[:40]
    assert secret
    r = run_python(_read_code(path), audit_hook=hook)
    _refused(r)
    assert repr(secret)[2:-1][:30] not in r.stdout


def test_listing_the_repository_is_refused():
    _needs("landlock")
    r = run_python(f"import os\nprint(os.listdir({str(PACKAGE)!r}))", audit_hook=False)
    _refused(r)
    assert "sandbox.py" not in r.stdout


def test_importing_the_toolkit_is_refused():
    r = run_python("import memtoc.tasks.codeexec.problems as p\nprint(p.generate_problems()[0])")
    _refused(r)


# --- network and processes ---------------------------------------------------------------------------------------

@pytest.fixture
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            accepted.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], accepted
    stop.set()
    t.join()
    for c in accepted:
        c.close()
    srv.close()


_CONNECT = ("import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "s.sendall(b'escaped')\nprint('connected')")


@pytest.mark.parametrize("config", ["full", "kernel_only", "netns", "seccomp", "landlock"])
def test_connecting_to_localhost_is_refused(config, listener):
    port, accepted = listener
    # the listener works: a connection from here is accepted
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        pass
    for _ in range(50):
        if accepted:
            break
        threading.Event().wait(0.05)
    assert len(accepted) == 1
    kw = {"full": {}, "kernel_only": {"audit_hook": False}}.get(config, {"audit_hook": False, "layers": (config,)})
    if config != "full":
        _needs(*(LAYERS if config == "kernel_only" else (config,)))
    if config == "landlock" and "no TCP rules" in " ".join(isolation_status().missing):
        pytest.skip("Landlock ABI < 4 has no TCP rules")
    r = run_python(_CONNECT.format(port=port), timeout_s=20.0, **kw)
    _refused(r)
    assert "connected" not in r.stdout
    threading.Event().wait(0.3)
    assert len(accepted) == 1, "the sandboxed code reached the host's loopback"


def test_socket_creation_is_refused_by_seccomp():
    _needs("seccomp")
    r = run_python("import socket\nsocket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)", audit_hook=False,
                   layers=("seccomp",))
    _refused(r)                           # an escape call: the kernel ends the process, the attempt is on record
    assert r.killed_reason == "sandbox_violation" and r.exit_code == -signal.SIGSYS, r


SPAWNS = {
    "os_system": "import os\nrc = os.system('touch {new}')\nassert rc == 0, rc",  # system() returns, not raises
    "subprocess": "import subprocess\nsubprocess.run(['touch', '{new}'])",
    "posix_spawn": "import os, shutil\nos.posix_spawn(shutil.which('touch') or '/usr/bin/touch', ['touch', '{new}'], {{}})",
    "fork": "import os\npid = os.fork()\nif pid == 0:\n    open('{new}', 'w').close()\n    os._exit(0)\nos.waitpid(pid, 0)",
    "execv": "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch {new}'])",
}


@pytest.mark.parametrize("config", ["full", "kernel_only", "seccomp"])
@pytest.mark.parametrize("name", sorted(SPAWNS))
def test_process_creation_is_refused(name, config, tmp_path):
    target = tmp_path / "spawned"
    kw = {"full": {}, "kernel_only": {"audit_hook": False},
          "seccomp": {"audit_hook": False, "layers": ("seccomp",)}}[config]
    if config != "full":
        _needs("seccomp")
    r = run_python(SPAWNS[name].format(new=target), timeout_s=20.0, **kw)
    _refused(r)
    assert not target.exists()


def test_signals_to_other_processes_are_refused_by_the_kernel():
    import subprocess as sp

    _needs("seccomp")
    bystander = sp.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        r = run_python(f"import os\nos.kill({bystander.pid}, 9)", audit_hook=False, layers=("seccomp",))
        _refused(r)
        threading.Event().wait(0.1)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_raising_a_hard_limit_is_refused_by_the_kernel():
    _needs("seccomp")
    r = run_python("import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))\nprint('raised')",
                   audit_hook=False)
    _refused(r)
    assert "raised" not in r.stdout


# --- what still works, and what is reported ------------------------------------------------------------------------

def test_this_machine_reports_its_layers():
    st = isolation_status()
    assert set(st.in_force) | {m.split(":", 1)[0] for m in st.missing} == set(LAYERS)
    r = run_python("print(1)")
    assert r.ok and set(r.isolation) == set(st.in_force)


def test_correct_programs_still_work_under_every_layer():
    _needs(*LAYERS)
    code = ("import math, decimal, fractions, threading, tempfile, os, sqlite3\n"
            "print(round(math.log(8, 2), 3), decimal.Decimal('909.525') - decimal.Decimal('353.218'))\n"
            "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
            "with tempfile.NamedTemporaryFile('w', delete=False) as fh:\n    fh.write('x')\n"
            "os.rename(fh.name, 'renamed'); os.makedirs('a/b'); os.remove('renamed')\n"
            "c = sqlite3.connect('db.sqlite'); c.execute('create table t(x)'); c.commit()\n"
            "os.mkfifo('pipe'); os.symlink('a', 'link'); print(sorted(os.listdir('.')))\n"
            "print(open('/dev/null', 'w').write('ok'), len(os.urandom(4)))\n")
    r = run_python(code)
    assert r.ok, r
    assert r.stdout.splitlines() == ["3.0 556.307", "thread", "['a', 'db.sqlite', 'link', 'main.py', 'pipe']",
                                     "2 4"]
    assert set(r.isolation) == set(LAYERS)


def test_numeric_libraries_work_under_every_layer():
    np = pytest.importorskip("numpy")
    _needs(*LAYERS)
    r = run_python("import numpy as np\nprint(np.linalg.solve(np.eye(2) * 2, np.ones(2)).tolist())", timeout_s=30)
    assert r.ok, r.stderr
    assert r.stdout == f"{np.linalg.solve(np.eye(2) * 2, np.ones(2)).tolist()}\n"
    pytest.importorskip("sympy")
    r = run_python("import sympy\nprint(sympy.Rational(1, 3) + 1)", timeout_s=30, cpu_s=20)
    assert r.ok and r.stdout == "4/3\n", r.stderr


def test_require_isolation_refuses_to_run_when_a_layer_is_missing(tmp_path, monkeypatch):
    # An isolation module whose seccomp layer fails: the prelude must not run the code.
    fake = tmp_path / "_kernel_layers.py"
    fake.write_text(Path(sandbox_mod.KERNEL_LAYERS_MODULE).read_text() + (
        "\n\ndef apply_seccomp(libc):\n    return False, 'simulated: no seccomp here'\n"))
    monkeypatch.setattr(sandbox_mod, "KERNEL_LAYERS_MODULE", fake)
    code = "print('the code ran')"
    r = run_python(code, require_isolation=True)
    assert not r.ok and r.killed_reason == "isolation_unavailable" and r.exit_code == 4
    assert "seccomp: simulated" in r.detail and r.stdout == ""
    with pytest.warns(sandbox_mod.SandboxIsolationWarning, match="seccomp: simulated"):
        r = run_python(code, require_isolation=False)
    assert r.ok and r.stdout == "the code ran\n" and "seccomp" not in r.isolation
    with warnings.catch_warnings():                        # warned once already, just above
        warnings.simplefilter("ignore", sandbox_mod.SandboxIsolationWarning)
        r = run_python("import sys\nsys.exit(4)", require_isolation=False)
    assert r.exit_code == 4 and r.killed_reason is None     # the code's own status 4 is not a refusal


def test_the_read_allow_list_leaves_out_the_repository_and_site_packages():
    from memtoc.tasks.codeexec.isolation import default_policy

    policy = default_policy("/scratch")
    repo = PACKAGE.parents[2]
    for path in policy.read_dirs + policy.read_files:
        assert not Path(path).is_relative_to(repo) or ".venv" in Path(path).relative_to(repo).parts, path
        assert Path(path).name not in ("site-packages", "dist-packages"), path
    assert not any(Path(p).name.startswith(("memtoc", "__editable__")) for p in policy.read_dirs)
    assert all(Path(p).name in ("site-packages", "dist-packages") or Path(p).name.startswith("python3")
               for p in policy.list_dirs), policy.list_dirs


def test_check_isolation_warns_loudly_or_refuses(monkeypatch, capsys):
    missing = IsolationStatus(in_force=("netns",), missing=("landlock: ENOSYS (simulated)",
                                                            "seccomp: simulated"))
    monkeypatch.setattr(sandbox_mod, "isolation_status", lambda: missing)
    monkeypatch.setattr(sandbox_mod, "_require_default", [False])
    check_isolation()
    err = capsys.readouterr().err
    assert err.startswith("WARNING: the code-executor sandbox runs WITHOUT full kernel isolation")
    assert "landlock: ENOSYS (simulated)" in err and "seccomp: simulated" in err and err.count("\n") == 1
    with pytest.raises(SandboxIsolationError, match="--require-isolation: .*landlock"):
        check_isolation(require=True)
    complete = IsolationStatus(in_force=LAYERS, missing=())
    monkeypatch.setattr(sandbox_mod, "isolation_status", lambda: complete)
    assert check_isolation(require=True).complete and capsys.readouterr().err == ""


# --- limits -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    ({"memory_mb": 10}, "--memory-mb 10: "), ({"timeout_s": 0}, "--timeout-s 0: "),
    ({"timeout_s": -1.5}, "--timeout-s -1.5: "), ({"timeout_s": float("inf")}, "--timeout-s inf: "),
    ({"cpu_s": 0}, "--cpu-s 0: "), ({"cpu_s": 2.5}, "--cpu-s 2.5: "), ({"max_output_bytes": 0}, "max_output_bytes 0: "),
    # bounded: above the bound a limit is no limit, so the typo is refused, naming the bound
    ({"memory_mb": 99999999999}, "--memory-mb 99999999999: .* to 65536"), ({"memory_mb": 65537}, "--memory-mb 65537: "),
    ({"cpu_s": 10**9}, "--cpu-s 1000000000: .* to 86400"), ({"timeout_s": 1e9}, "--timeout-s 1000000000.0: .* 86400"),
    ({"max_output_bytes": 10**12}, "max_output_bytes 1000000000000: .* to 67108864"),
])
def test_bad_limits_fail_when_made_with_the_option_named(kw, message):
    with pytest.raises(SandboxLimitError) as exc:
        SandboxLimits(**kw)
    assert re.match(message, str(exc.value)) and "\n" not in str(exc.value), str(exc.value)
    with pytest.raises(ValueError):                      # run_python checks the same way, before any process
        run_python("print(1)", **kw)
    assert SandboxLimits() == SandboxLimits(timeout_s=5.0, cpu_s=5, memory_mb=512, max_output_bytes=64_000)
    SandboxLimits(memory_mb=65536, cpu_s=86400, timeout_s=86400, max_output_bytes=64 << 20)   # the bounds are in


@pytest.mark.parametrize("command", ["evaluate", "extract"])
@pytest.mark.parametrize("option, value", [("--memory-mb", "10"), ("--timeout-s", "0"), ("--cpu-s", "0"),
                                           ("--memory-mb", "99999999999"), ("--cpu-s", "100000")])
def test_cli_refuses_bad_limits_before_the_model_loads(command, option, value, tmp_path, capsys, monkeypatch):
    def no_model(*a, **k):                                 # the check must come before any model is loaded
        raise AssertionError("the model was loaded")
    import memtoc.jobs.evaluate as evaluate_job
    import memtoc.jobs.extract as extract_job
    monkeypatch.setattr(evaluate_job, "evaluate", no_model)
    monkeypatch.setattr(extract_job, "extract", no_model)
    out = tmp_path / "out"
    rc = main(["codeexec", command, "--model", "/nonexistent/model", "--out", str(out), option, value])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0
    assert f"{option} {value}" in err or f"{option} {float(value)}" in err
    assert not out.exists()


def test_cli_require_isolation_passes_here_and_refuses_where_a_layer_is_missing(tmp_path, capsys, monkeypatch):
    import memtoc.jobs.evaluate as job
    from memtoc.core.errors import MemtocError

    def reached(*a, **k):
        raise MemtocError("reached the run")
    monkeypatch.setattr(job, "evaluate", reached)
    monkeypatch.setattr(sandbox_mod, "_require_default", [False])
    argv = ["codeexec", "evaluate", "--model", "/nonexistent/model", "--out", str(tmp_path / "out"),
            "--require-isolation"]
    if isolation_status().complete:
        assert main(argv) == 2 and "reached the run" in capsys.readouterr().err
        assert sandbox_mod._require_default == [True]     # later executions refuse too
    missing = IsolationStatus(in_force=("netns",), missing=("landlock: simulated",))
    monkeypatch.setattr(sandbox_mod, "isolation_status", lambda: missing)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "memtoc codeexec evaluate: error: --require-isolation: the sandbox lacks landlock: simulated"
    assert not (tmp_path / "out").exists()
