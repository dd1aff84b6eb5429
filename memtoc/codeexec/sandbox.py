"""Run model-written Python for real, contained: separate process, limits, an audit-hook policy, a scratch dir.

:func:`run_python` writes the code to ``main.py`` in a fresh empty temporary directory and runs
``sys.executable -I -B -X utf8 _sandbox_prelude.py`` there, which installs an audit hook (``sys.addaudithook``)
and then executes the code as ``__main__``. Layers, outermost first:

- **Process**: a new session and process group (``start_new_session=True``); on timeout or output overflow the
  whole group gets SIGKILL (``os.killpg``). stdin is /dev/null; file descriptors are closed except the report
  pipe.
- **Wall clock**: ``timeout_s``; the run is killed and reported ``timed_out`` / ``killed_reason="timeout"``.
- **Kernel limits** (``resource.setrlimit`` in ``preexec_fn``, so they also bound interpreter start-up):
  RLIMIT_CPU = ``cpu_s`` (SIGXCPU; hard limit one second later, SIGKILL), RLIMIT_AS = ``memory_mb`` MiB
  (address space, so it must cover numpy's mappings: 512 MiB does; allocations fail with MemoryError),
  RLIMIT_FSIZE = 16 MiB per written file, RLIMIT_NOFILE = 256,
  RLIMIT_CORE = 0, RLIMIT_NPROC = 0. RLIMIT_NPROC counts every process of the user, so 0 refuses any further
  fork *and thread* for an unprivileged user, but root (CAP_SYS_RESOURCE, as in CI containers) is exempt:
  hence the audit hook below.
- **Interpreter flags**: ``-I`` (ignore PYTHON* variables, no user site-packages, no script directory on
  sys.path), ``-B`` (write no .pyc). ``-S`` is not used: ``site`` is what puts the environment's
  site-packages (numpy) on sys.path. Stdlib ``math``, ``decimal``, ``fractions``, ``statistics`` work; numpy,
  scipy, sympy and mpmath work when installed (the prelude imports the ones the code names before the hook;
  their features that load ctypes lazily, such as ``numpy.ctypeslib``, are refused).
- **Environment**: stripped to PATH, HOME and TMPDIR (both the scratch dir), LANG/LC_ALL=C.UTF-8, and one
  thread for OpenBLAS/OpenMP/MKL; cwd is the scratch dir, which is deleted afterwards.
- **Audit hook** (:mod:`memtoc.codeexec._sandbox_prelude`): refuses process creation (``os.fork``,
  ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``subprocess.Popen``, ...), signals to other processes,
  ``resource.setrlimit``, every ``socket.*`` and ``ctypes.*`` event, imports of networking, ctypes/cffi and
  process modules (socket, ssl, http, urllib, requests, asyncio, ctypes, subprocess, multiprocessing, ...),
  opening a file for writing outside the scratch dir (``open``/``os.open`` events; /dev/null allowed), and
  remove/rename/link/mkdir/chmod/shutil operations on paths outside it (symlinks are resolved first).
- **Output**: stdout and stderr are read concurrently, each capped at ``max_output_bytes``; a stream that goes
  over is truncated, marked with a final ``[output truncated ...]`` line, and the run is killed
  (``killed_reason="output_limit"``).

Every hostile case ends as a failed :class:`ExecutionResult` (``ok`` False, ``killed_reason`` set), never as an
exception in the caller: ``timeout``, ``cpu_limit``, ``memory_limit`` (MemoryError), ``output_limit``,
``file_size_limit``, ``sandbox_violation`` (with the refused actions in ``violations``; a refusal fails the run
even when the code catches the exception) or ``signal`` (killed by another signal, e.g. the CPU hard limit).

What this does NOT protect against (it is a guard-rail for model-written arithmetic code, not a security
boundary). The audit hook runs inside the process it polices, so a determined attacker can defeat it:
pure-Python introspection (``gc``, closures, monkey-patching ``posixpath``) can reach or fool the hook; any
C extension that is importable (numpy, or one that was already loaded) can make system calls no audit event
sees, and numpy keeps a reference to the ctypes module it loaded before the hook (the audited ctypes calls
are refused, unaudited ones such as ``memmove`` are not); ``os.open(..., dir_fd=...)`` is not resolved; code
that catches a refusal, closes the report descriptor and calls ``os._exit(0)`` can hide the refusal from the
report (the action itself was still refused); the code can *read* every file the host user can read
(including the benchmark's gold answers); it runs with the host's user id (root in CI), and the kernel
limits above are the only hard ones (plus SIGKILL of the group). It can also fill the scratch dir's file
system with many files up to the wall-clock limit. A real boundary needs the kernel's help: a container or
namespaces (e.g. ``bwrap``/``nsjail``/gVisor with no network namespace, a read-only root, a private tmpfs, a
separate unprivileged uid, seccomp and cgroup memory/pid limits). ``preexec_fn`` is not safe in a process that
runs other threads at the same time (Python's documented caveat); call :func:`run_python` from one thread.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ExecutionResult", "run_python", "KILLED_REASONS", "MAX_FILE_BYTES", "VIOLATION_EXIT_CODE"]

PRELUDE = Path(__file__).with_name("_sandbox_prelude.py")
MAX_FILE_BYTES = 16 << 20
VIOLATION_EXIT_CODE = 3
KILLED_REASONS: tuple[str, ...] = ("timeout", "cpu_limit", "memory_limit", "output_limit", "file_size_limit",
                                   "sandbox_violation", "signal")
_READ_CHUNK = 65536
_REPORT_CAP = 64_000
_MIN_MEMORY_MB = 64


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one run. ``ok`` means exit status 0, no limit hit and nothing refused."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    killed_reason: str | None
    ok: bool
    #: Human-readable detail for ``killed_reason`` (the refused action, the signal), or "".
    detail: str = ""
    violations: tuple[str, ...] = ()
    #: Type name of the uncaught exception the code ended with, or None.
    exception: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = 0.0


def _limits(cpu_s: int, memory_mb: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    return apply


def _environment(workdir: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _CappedReader:
    """Reads several pipes at once, keeping at most ``cap`` bytes of each."""

    def __init__(self, streams: dict[str, int], caps: dict[str, int]) -> None:
        self.data = {name: bytearray() for name in streams}
        self.overflow = {name: False for name in streams}
        self.caps = caps
        self.sel = selectors.DefaultSelector()
        for name, fd in streams.items():
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, name)

    @property
    def open(self) -> bool:
        return bool(self.sel.get_map())

    def poll(self, timeout: float) -> bool:
        """Read what is ready; returns True when a capped stream went over its cap."""
        over = False
        for key, _ in self.sel.select(timeout=max(0.0, timeout)):
            name = key.data
            try:
                chunk = os.read(key.fd, _READ_CHUNK)
            except BlockingIOError:
                continue
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            room = self.caps[name] - len(self.data[name])
            self.data[name] += chunk[:max(room, 0)]
            if len(chunk) > room:
                self.overflow[name] = True
                over = True
        return over

    def close(self) -> None:
        self.sel.close()


def _decode(data: bytes, truncated: bool, cap: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if truncated:
        text += f"{'' if text.endswith(chr(10)) or not text else chr(10)}[output truncated: more than {cap} bytes]\n"
    return text


def _parse_report(raw: bytes) -> tuple[list[str], str | None]:
    violations, exception = [], None
    for line in raw.decode("utf-8", errors="replace").splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "violation":
            violations.append(rest.replace("\t", ": ", 1))
        elif kind == "exception":
            exception = rest.strip() or None
    return violations, exception


def _classify(returncode: int | None, *, timed_out: bool, output_over: bool, violations: list[str],
              exception: str | None, stderr: str, timeout_s: float, cpu_s: int) -> tuple[str | None, str]:
    """(killed_reason, detail) from how the process ended; the first matching rule wins."""
    if violations:
        return "sandbox_violation", violations[0]
    if timed_out:
        return "timeout", f"wall-clock limit of {timeout_s:g} s"
    if output_over:
        return "output_limit", "output over the size limit"
    if exception == "MemoryError":
        return "memory_limit", "MemoryError"
    if returncode is not None and returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        if sig == signal.SIGXCPU:
            return "cpu_limit", f"CPU time limit of {cpu_s} s"
        if sig == signal.SIGXFSZ:
            return "file_size_limit", f"file size limit of {MAX_FILE_BYTES} bytes"
        return "signal", name
    if exception == "OSError" and "File too large" in stderr:
        return "file_size_limit", f"file size limit of {MAX_FILE_BYTES} bytes"
    return None, ""


def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
               max_output_bytes: int = 64_000) -> ExecutionResult:
    """Run ``code`` in the sandbox described in the module docstring and report what happened.

    Never raises for anything the code does; raises ValueError for nonsensical limits.
    """
    if not timeout_s > 0 or cpu_s < 1 or memory_mb < _MIN_MEMORY_MB or max_output_bytes < 1:
        raise ValueError("timeout_s > 0, cpu_s >= 1, memory_mb >= 64 and max_output_bytes >= 1 are required")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="memtoc-sandbox-", ignore_cleanup_errors=True) as workdir:
        workdir = os.path.realpath(workdir)
        code_path = os.path.join(workdir, "main.py")
        with open(code_path, "w", encoding="utf-8") as fh:
            fh.write(code)
        report_r, report_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", str(PRELUDE), workdir, code_path, str(report_w)],
                cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, pass_fds=(report_w,), start_new_session=True,
                preexec_fn=_limits(int(cpu_s), int(memory_mb)))
        except BaseException:
            os.close(report_r)
            os.close(report_w)
            raise
        os.close(report_w)
        reader = _CappedReader({"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(),
                                "report": report_r},
                               {"stdout": max_output_bytes, "stderr": max_output_bytes, "report": _REPORT_CAP})
        timed_out = output_over = False
        deadline = started + timeout_s
        try:
            while reader.open:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                if reader.poll(min(remaining, 0.5)) and (reader.overflow["stdout"] or reader.overflow["stderr"]):
                    output_over = True
                    break
            if timed_out or output_over:
                _kill_group(proc)
            else:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc)
            proc.wait()
            _kill_group(proc)  # nothing of the group may outlive the run
            drain_until = time.monotonic() + 1.0  # what the dead group left in the pipes, bounded by the caps
            while reader.open and time.monotonic() < drain_until:
                reader.poll(0.05)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
                proc.wait()
            reader.close()
            for pipe in (proc.stdout, proc.stderr):
                pipe.close()
            os.close(report_r)
    violations, exception = _parse_report(bytes(reader.data["report"]))
    stdout = _decode(bytes(reader.data["stdout"]), reader.overflow["stdout"], max_output_bytes)
    stderr = _decode(bytes(reader.data["stderr"]), reader.overflow["stderr"], max_output_bytes)
    returncode = proc.returncode
    reason, detail = _classify(returncode, timed_out=timed_out, output_over=output_over, violations=violations,
                               exception=exception, stderr=stderr, timeout_s=timeout_s, cpu_s=cpu_s)
    ok = returncode == 0 and reason is None
    return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=returncode, timed_out=timed_out,
                           killed_reason=reason, ok=ok, detail=detail, violations=tuple(violations),
                           exception=exception, stdout_truncated=reader.overflow["stdout"],
                           stderr_truncated=reader.overflow["stderr"],
                           duration_s=round(time.monotonic() - started, 3))
