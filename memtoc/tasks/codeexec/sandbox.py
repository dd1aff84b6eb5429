"""Run model-written Python for real, contained: kernel isolation, limits, an audit hook, a scratch dir.

:func:`run_python` writes the code to ``main.py`` in a fresh empty temporary directory and runs
``sys.executable -I -B -X utf8 _sandbox_prelude.py`` there; the prelude preloads the trusted numeric libraries
the code names, applies the kernel layers (:mod:`memtoc.tasks.codeexec._kernel_layers`), installs an audit hook
(``sys.addaudithook``) and then executes the code as ``__main__``. Layers, outermost first (docs/sandbox.md
has the full table, the kernels each needs, and what none of them covers):

- **Process**: a new session and process group (``start_new_session=True``); on timeout or output overflow the
  whole group gets SIGKILL (``os.killpg``). stdin is /dev/null; file descriptors are closed except the report
  pipe.
- **Wall clock**: ``timeout_s``; the run is killed and reported ``timed_out`` / ``killed_reason="timeout"``.
- **Kernel limits** (``resource.setrlimit`` in ``preexec_fn``, so they also bound interpreter start-up):
  RLIMIT_CPU = ``cpu_s`` (SIGXCPU; hard limit one second later, SIGKILL), RLIMIT_AS = ``memory_mb`` MiB
  (address space, so it must cover numpy's mappings: 512 MiB does; allocations fail with MemoryError),
  RLIMIT_FSIZE = 16 MiB per written file, RLIMIT_NOFILE = 256, RLIMIT_CORE = 0, RLIMIT_NPROC = 0 (root, as in
  CI containers, is exempt from the last; the seccomp layer and the hook refuse process creation).
- **Kernel isolation** (Linux; each layer reported per run in ``ExecutionResult.isolation`` /
  ``isolation_missing``): ``netns`` -- a fresh user + network namespace, no address reachable;
  ``landlock`` -- reads only beneath the allow-list of :func:`memtoc.tasks.codeexec.isolation.default_policy`
  (stdlib without site-packages, numpy/scipy/sympy/mpmath, shared libraries), writes only beneath the scratch
  dir, no execution, no TCP, no signals out; ``seccomp`` (x86_64) -- no sockets, processes, ptrace,
  namespaces, limit raises, metadata writes. With a layer missing the run goes on with a
  :class:`SandboxIsolationWarning` (once), or is refused (``killed_reason="isolation_unavailable"``) with
  ``require_isolation`` / :func:`check_isolation` ``(require=True)`` (``--require-isolation``).
- **Interpreter flags**: ``-I`` (ignore PYTHON* variables, no user site-packages, no script directory on
  sys.path), ``-B`` (write no .pyc). Stdlib ``math``, ``decimal``, ``fractions``, ``statistics`` work; numpy,
  scipy, sympy and mpmath work when installed and named in the code (imported before the hook; their features
  that load ctypes or subprocess lazily, such as ``numpy.ctypeslib``, are refused). Other site-packages are
  unreadable.
- **Environment**: stripped to PATH, HOME and TMPDIR (both the scratch dir), LANG/LC_ALL=C.UTF-8, and one
  thread for OpenBLAS/OpenMP/MKL; cwd is the scratch dir, which is deleted afterwards.
- **Audit hook** (:mod:`memtoc.tasks.codeexec._sandbox_prelude`), a second layer: refuses process creation
  (``os.fork``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``subprocess.Popen``, ...), signals to other
  processes, ``resource.setrlimit``, every ``socket.*`` and ``ctypes.*`` event, imports of networking, ctypes/cffi
  and process modules, opening a file for writing outside the scratch dir (/dev/null allowed), opening or
  listing outside the read allow-list, ``sqlite3.connect`` outside the scratch dir, and
  remove/rename/link/mkdir/chmod/shutil operations on paths outside it (symlinks are resolved first).
- **Output**: stdout and stderr are read concurrently, each capped at ``max_output_bytes``; a stream that goes
  over is truncated, marked with a final ``[output truncated ...]`` line, and the run is killed
  (``killed_reason="output_limit"``).

Every hostile case ends as a failed :class:`ExecutionResult` (``ok`` False, ``killed_reason`` set), never as an
exception in the caller: ``timeout``, ``cpu_limit``, ``memory_limit`` (MemoryError), ``output_limit``,
``file_size_limit``, ``sandbox_violation`` (refused by the hook, with the refused actions in ``violations``, a
refusal failing the run even when the code catches it; or an uncaught ``PermissionError``, which is how the
kernel layers answer), ``signal`` (killed by another signal, e.g. the CPU hard limit) or
``isolation_unavailable``. Limits are checked by :class:`SandboxLimits` before anything runs.

Where the kernel layers are missing (non-Linux, old kernels, user namespaces or Landlock disabled, seccomp on
other CPUs) the audit hook is what remains, and it is a guard-rail, not a boundary: it runs inside the process
it polices (introspection, C extensions such as numpy making unaudited system calls, ``os.open`` with
``dir_fd``, ``os.mkfifo`` get past it). Even with every layer, paths' metadata (``stat``) stays visible, there
is no mount, PID or cgroup isolation, and the scratch file system can be filled (docs/sandbox.md).
``preexec_fn`` is not safe in a process that runs other threads at the same time (Python's documented caveat);
call :func:`run_python` from one thread.
"""

from __future__ import annotations

import math
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TextIO

from memtoc.tasks.codeexec.isolation import LAYERS, IsolationPolicy, default_policy
from memtoc.core.errors import MemtocError

__all__ = ["ExecutionResult", "run_python", "KILLED_REASONS", "MAX_FILE_BYTES", "VIOLATION_EXIT_CODE",
           "ISOLATION_EXIT_CODE", "SandboxLimits", "SandboxLimitError", "SandboxIsolationError",
           "SandboxIsolationWarning", "IsolationStatus", "isolation_status", "check_isolation", "prepare_sandbox"]

PRELUDE = Path(__file__).with_name("_sandbox_prelude.py")
KERNEL_LAYERS_MODULE = Path(__file__).with_name("_kernel_layers.py")
MAX_FILE_BYTES = 16 << 20
VIOLATION_EXIT_CODE = 3
ISOLATION_EXIT_CODE = 4
KILLED_REASONS: tuple[str, ...] = ("timeout", "cpu_limit", "memory_limit", "output_limit", "file_size_limit",
                                   "sandbox_violation", "signal", "isolation_unavailable")
_READ_CHUNK = 65536
_REPORT_CAP = 64_000
_MIN_MEMORY_MB = 64
_MAX_TIMEOUT_S = 24 * 3600


class SandboxLimitError(MemtocError, ValueError):
    """A sandbox limit that cannot work (the message names the command-line option and the value)."""


class SandboxIsolationError(MemtocError):
    """Kernel isolation was required (``--require-isolation``) but a layer is not available here."""


class SandboxIsolationWarning(UserWarning):
    """The sandbox runs without some kernel isolation layer (audit hook and rlimits only for that part)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-execution limits, checked when made: a bad value fails at start, not at the first tool call.

    The message names the command-line option (``--memory-mb 10: ...``) because that is where users set them.
    """

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_output_bytes: int = 64_000

    def __post_init__(self) -> None:
        def bad(option: str, value: object, why: str) -> SandboxLimitError:
            return SandboxLimitError(f"{option} {value}: {why}")

        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise bad("--timeout-s", t, "the sandbox wall-clock limit must be a positive number of seconds")
        if t > _MAX_TIMEOUT_S:
            raise bad("--timeout-s", t, f"the sandbox wall-clock limit is at most {_MAX_TIMEOUT_S} s")
        for option, value, low, why in (
                ("--cpu-s", self.cpu_s, 1, "the sandbox CPU-time limit must be a whole number of seconds >= 1"),
                ("--memory-mb", self.memory_mb, _MIN_MEMORY_MB,
                 f"the sandbox address-space limit must be a whole number of MiB >= {_MIN_MEMORY_MB} "
                 "(the interpreter alone needs about that much)"),
                ("max_output_bytes", self.max_output_bytes, 1, "the output cap must be a whole number >= 1")):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(option, value, why)


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
    #: Kernel layers in force for this run (a subset of :data:`memtoc.tasks.codeexec.isolation.LAYERS`).
    isolation: tuple[str, ...] = ()
    #: Layers that were asked for but are missing, as "layer: reason".
    isolation_missing: tuple[str, ...] = field(default=())


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


@dataclass
class _Report:
    violations: list[str] = field(default_factory=list)
    exception: str | None = None
    in_force: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _parse_report(raw: bytes) -> _Report:
    rep = _Report()
    for line in raw.decode("utf-8", errors="replace").splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "violation":
            rep.violations.append(rest.replace("\t", ": ", 1))
        elif kind == "exception":
            rep.exception = rest.strip() or None
        elif kind == "isolation":
            layer, _, rest = rest.partition("\t")
            flag, _, detail = rest.partition("\t")
            (rep.in_force if flag == "1" else rep.missing).append(layer if flag == "1" else f"{layer}: {detail}")
    return rep


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _classify(returncode: int | None, *, timed_out: bool, output_over: bool, violations: list[str],
              exception: str | None, stderr: str, timeout_s: float, cpu_s: int,
              missing: list[str] = (), required: bool = False) -> tuple[str | None, str]:
    """(killed_reason, detail) from how the process ended; the first matching rule wins."""
    if required and returncode == ISOLATION_EXIT_CODE and missing:
        return "isolation_unavailable", "; ".join(missing)
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
    if exception == "PermissionError":       # what the kernel layers (Landlock, seccomp) answer with
        return "sandbox_violation", _last_line(stderr) or "PermissionError"
    return None, ""


@lru_cache(maxsize=1)
def _base_policy() -> IsolationPolicy:
    return default_policy()


_require_default = [False]
_warned: set[str] = set()


def _warn_missing(missing: tuple[str, ...]) -> None:
    key = "; ".join(missing)
    if missing and key not in _warned:
        _warned.add(key)
        warnings.warn(f"the code-executor sandbox runs without kernel isolation layer(s): {key}",
                      SandboxIsolationWarning, stacklevel=3)


def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
               max_output_bytes: int = 64_000, layers: tuple[str, ...] | None = None,
               require_isolation: bool | None = None, audit_hook: bool = True) -> ExecutionResult:
    """Run ``code`` in the sandbox described in the module docstring and report what happened.

    ``layers``: the kernel layers to apply (default: all of :data:`~memtoc.tasks.codeexec.isolation.LAYERS`);
    ``require_isolation``: refuse to run the code (``killed_reason="isolation_unavailable"``) when one of them
    is missing (default: as set by :func:`check_isolation`, else False, with a warning once);
    ``audit_hook=False`` leaves the kernel layers alone (for tests of those layers).
    Never raises for anything the code does; raises :class:`SandboxLimitError` (a ValueError) for bad limits.
    """
    SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
    layers = LAYERS if layers is None else tuple(layers)
    unknown = [x for x in layers if x not in LAYERS]
    if unknown:
        raise ValueError(f"unknown isolation layer(s) {unknown}; known: {', '.join(LAYERS)}")
    require = _require_default[0] if require_isolation is None else require_isolation
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="memtoc-sandbox-", ignore_cleanup_errors=True) as workdir:
        workdir = os.path.realpath(workdir)
        code_path = os.path.join(workdir, "main.py")
        with open(code_path, "w", encoding="utf-8") as fh:
            fh.write(code)
        report_r, report_w = os.pipe()
        try:
            policy = _base_policy().with_scratch(workdir, layers)
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", str(PRELUDE), workdir, code_path, str(report_w),
                 str(KERNEL_LAYERS_MODULE), policy.encode(), "require" if require else "best-effort",
                 "hook" if audit_hook else "no-hook"],
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
    rep = _parse_report(bytes(reader.data["report"]))
    violations, exception = rep.violations, rep.exception
    stdout = _decode(bytes(reader.data["stdout"]), reader.overflow["stdout"], max_output_bytes)
    stderr = _decode(bytes(reader.data["stderr"]), reader.overflow["stderr"], max_output_bytes)
    returncode = proc.returncode
    reason, detail = _classify(returncode, timed_out=timed_out, output_over=output_over, violations=violations,
                               exception=exception, stderr=stderr, timeout_s=timeout_s, cpu_s=cpu_s,
                               missing=rep.missing, required=require)
    if not require:
        _warn_missing(tuple(rep.missing))
    ok = returncode == 0 and reason is None
    return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=returncode, timed_out=timed_out,
                           killed_reason=reason, ok=ok, detail=detail, violations=tuple(violations),
                           exception=exception, stdout_truncated=reader.overflow["stdout"],
                           stderr_truncated=reader.overflow["stderr"],
                           duration_s=round(time.monotonic() - started, 3), isolation=tuple(rep.in_force),
                           isolation_missing=tuple(rep.missing))


@dataclass(frozen=True)
class IsolationStatus:
    """Which kernel layers a sandboxed run gets on this machine (measured by running one)."""

    in_force: tuple[str, ...]
    #: "layer: reason" for each missing layer.
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.missing

    def summary(self) -> str:
        have = ", ".join(self.in_force) or "none"
        return f"kernel isolation in force: {have}" + (f"; MISSING: {'; '.join(self.missing)}"
                                                       if self.missing else "")


@lru_cache(maxsize=1)
def isolation_status() -> IsolationStatus:
    """Run one empty program in the sandbox and read which layers applied (cached for the process)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)
        r = run_python("pass", require_isolation=False)
    in_force = set(r.isolation)
    missing = tuple(r.isolation_missing) or tuple(f"{layer}: not reported by the sandbox (exit {r.exit_code})"
                                                  for layer in LAYERS if layer not in in_force)
    return IsolationStatus(in_force=tuple(x for x in LAYERS if x in in_force), missing=missing)


def check_isolation(*, require: bool = False, stream: TextIO | None = None) -> IsolationStatus:
    """Say at start what the sandbox can enforce here: a loud warning naming each missing layer, or, with
    ``require`` (``--require-isolation``), a :class:`SandboxIsolationError`; ``require`` also makes every later
    :func:`run_python` of this process refuse to run code without all layers."""
    status = isolation_status()
    if require:
        _require_default[0] = True
        if not status.complete:
            raise SandboxIsolationError(f"--require-isolation: the sandbox lacks {'; '.join(status.missing)}")
    elif not status.complete:
        _warned.add("; ".join(status.missing))
        print(f"WARNING: the code-executor sandbox runs WITHOUT full kernel isolation ({status.summary()}); "
              "model-written code is then contained by the audit hook and rlimits only, which a determined "
              "program can get around (see docs/sandbox.md). Use --require-isolation to refuse to run.",
              file=stream or sys.stderr, flush=True)
    return status


def prepare_sandbox(*, timeout_s: float, cpu_s: int, memory_mb: int, require_isolation: bool = False,
                    stream: TextIO | None = None) -> IsolationStatus:
    """What a command calls at start, before any model loads or directory is made: check the limits
    (:class:`SandboxLimitError` naming the option) and the kernel isolation (:func:`check_isolation`)."""
    SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
    return check_isolation(require=require_isolation, stream=stream)
