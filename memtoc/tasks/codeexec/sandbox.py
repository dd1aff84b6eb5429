"""Run model-written Python for real, contained: kernel isolation, limits, an audit hook, a scratch dir.

:func:`run_python` writes the code to ``main.py`` in a fresh empty temporary directory and runs
``sys.executable -I -B -X utf8 _sandbox_prelude.py`` there; the prelude preloads the trusted numeric libraries
the code names, applies the kernel layers (:mod:`memtoc.tasks.codeexec._kernel_layers`), installs an audit hook
(``sys.addaudithook``) and then executes the code as ``__main__``. Layers, outermost first (docs/sandbox.md
has the full table, the kernels each needs, and what none of them covers):

- **Process**: a new session and process group, SIGKILLed as a whole on timeout or output overflow; stdin is
  /dev/null, file descriptors are closed but the setup and notes pipes; the environment is stripped and the
  cwd, HOME and TMPDIR are a fresh scratch dir, deleted afterwards.
- **Limits**: ``timeout_s`` wall clock; ``resource.setrlimit`` in ``preexec_fn`` (so it bounds interpreter
  start-up too) for CPU, address space (``memory_mb``: numpy's mappings must fit), 16 MiB per written file,
  256 files, no core, no processes (root is exempt from the last: seccomp and the hook refuse forks).
- **Kernel isolation** (Linux; each layer reported per run in ``ExecutionResult.isolation`` /
  ``isolation_missing``): ``netns``, ``ipcns``, ``landlock`` (reads beneath the allow-list of
  :func:`memtoc.tasks.codeexec.isolation.default_policy`, writes beneath the scratch dir) and ``seccomp``
  (x86_64). With a layer missing the run goes on with a :class:`SandboxIsolationWarning` (once), or is refused
  (``killed_reason="isolation_unavailable"``) under ``require_isolation`` (``--require-isolation``).
- **Interpreter**: ``-I -B``; numpy, scipy, sympy and mpmath are preloaded when the code names them, before the
  hook (their features that load ctypes or subprocess lazily are refused); other site-packages are unreadable.
- **Audit hook** (:mod:`memtoc.tasks.codeexec._sandbox_prelude`), a second layer: process creation, signals,
  ``setrlimit``, sockets, ctypes, imports of such modules, writes outside the scratch dir, reads outside the
  allow-list, ``sqlite3.connect`` outside the scratch dir.
- **Output**: stdout and stderr are read concurrently, each capped at ``max_output_bytes``; a stream that goes
  over is truncated, marked with a final ``[output truncated ...]`` line, and the run is killed
  (``killed_reason="output_limit"``).

**Verdict.** The layers in force come from a setup pipe the prelude closes before the code is compiled; what
happened comes from the kernel (exit status and signal via ``wait4``, with the CPU time), the parent's own
timers and caps. The prelude ends with a status per outcome (3 refusal, 5 MemoryError, 6 file size, 4 missing
layer) and, at the hook's first refusal, arms a seccomp *witness* after which the process can only end with
status 3 (anything else: SIGSYS). A notes pipe the code could write to only words the verdict (``detail``,
``violations``, ``exception``): forged lines neither fail a clean run nor clear a failed one
(docs/sandbox.md, "What the verdict rests on").

Every hostile case ends as a failed :class:`ExecutionResult` (``ok`` False, ``killed_reason`` set), never as an
exception in the caller: ``timeout``, ``cpu_limit``, ``memory_limit`` (MemoryError), ``output_limit``,
``file_size_limit``, ``sandbox_violation`` (refused by the hook, with the refused actions in ``violations``, a
refusal failing the run even when the code catches it; an uncaught ``PermissionError``, which is how the
kernel layers answer; or a SIGSYS from seccomp), ``signal`` (killed by another signal) or
``isolation_unavailable``. Limits are checked, with upper bounds, by :class:`SandboxLimits` before anything
runs; the scratch clean-up cannot raise.

Where the kernel layers are missing (non-Linux, old kernels, user namespaces or Landlock disabled, seccomp on
other CPUs) the audit hook is what remains, and it is a guard-rail, not a boundary: it runs inside the process
it polices (introspection, C extensions such as numpy making unaudited system calls, ``os.open`` with
``dir_fd``, ``os.mkfifo`` get past it; so does switching it off through ``gc.get_objects()``). Even with every
layer, paths' metadata (``stat``) stays visible, there is no mount, PID or cgroup isolation, the host uid is
the parent's, and the scratch file system can be filled (docs/sandbox.md).
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
           "ISOLATION_EXIT_CODE", "MEMORY_EXIT_CODE", "FILE_SIZE_EXIT_CODE", "SandboxLimits", "SandboxLimitError",
           "SandboxIsolationError", "SandboxIsolationWarning", "IsolationStatus", "isolation_status",
           "check_isolation", "prepare_sandbox"]

PRELUDE = Path(__file__).with_name("_sandbox_prelude.py")
KERNEL_LAYERS_MODULE = Path(__file__).with_name("_kernel_layers.py")
MAX_FILE_BYTES = 16 << 20
#: Exit statuses the prelude ends a run with (docs/sandbox.md); the code can end with them too, but only by
#: failing, so a status can never make a run look cleaner than it was.
VIOLATION_EXIT_CODE = 3
ISOLATION_EXIT_CODE = 4
MEMORY_EXIT_CODE = 5
FILE_SIZE_EXIT_CODE = 6
KILLED_REASONS: tuple[str, ...] = ("timeout", "cpu_limit", "memory_limit", "output_limit", "file_size_limit",
                                   "sandbox_violation", "signal", "isolation_unavailable")
_READ_CHUNK = 65536
_REPORT_CAP = 64_000
_MIN_MEMORY_MB = 64
#: Upper bounds: above them a limit is no limit on any machine this runs on (and the kernel's rlimit fields
#: would overflow first), so a typo such as ``--memory-mb 99999999999`` is refused rather than obeyed.
_MAX_MEMORY_MB = 64 * 1024
_MAX_TIMEOUT_S = 24 * 3600
_MAX_CPU_S = 24 * 3600
_MAX_OUTPUT_BYTES = 64 << 20


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
        for option, value, low, high, why in (
                ("--cpu-s", self.cpu_s, 1, _MAX_CPU_S, "the sandbox CPU-time limit must be a whole number of "
                 f"seconds from 1 to {_MAX_CPU_S}"),
                ("--memory-mb", self.memory_mb, _MIN_MEMORY_MB, _MAX_MEMORY_MB,
                 f"the sandbox address-space limit must be a whole number of MiB from {_MIN_MEMORY_MB} "
                 f"(the interpreter alone needs about that much) to {_MAX_MEMORY_MB}"),
                ("max_output_bytes", self.max_output_bytes, 1, _MAX_OUTPUT_BYTES,
                 f"the output cap must be a whole number from 1 to {_MAX_OUTPUT_BYTES}")):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
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
class _Setup:
    """What the setup channel said, all of it written before the code existed (the prelude closes it first)."""

    in_force: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _parse_setup(raw: bytes) -> _Setup:
    rep = _Setup()
    for line in raw.decode("utf-8", errors="replace").splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "isolation":
            layer, _, rest = rest.partition("\t")
            flag, _, detail = rest.partition("\t")
            if layer in LAYERS:
                (rep.in_force if flag == "1" else rep.missing).append(layer if flag == "1" else f"{layer}: {detail}")
    return rep


@dataclass
class _Notes:
    """What the notes channel said. The code can write to it, so it only words a verdict the status gives."""

    violations: list[str] = field(default_factory=list)
    exception: str | None = None


def _parse_notes(raw: bytes) -> _Notes:
    notes = _Notes()
    for line in raw.decode("utf-8", errors="replace").splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "violation":
            notes.violations.append(rest.replace("\t", ": ", 1))
        elif kind == "exception":
            notes.exception = rest.strip() or None
    return notes


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


@dataclass(frozen=True)
class _Verdict:
    reason: str | None
    detail: str
    violations: tuple[str, ...] = ()
    exception: str | None = None


def _classify(returncode: int | None, *, timed_out: bool, output_over: bool, cpu_used_s: float | None,
              notes: _Notes, stderr: str, timeout_s: float, cpu_s: int, missing: list[str] = (),
              required: bool = False) -> _Verdict:
    """The verdict from what the parent saw itself -- the exit status or signal from the kernel, the CPU time
    from ``wait4``, its own timers and caps -- and the setup channel; the first matching rule wins. The notes
    channel only supplies the wording (which action was refused, which exception) of a verdict given by the
    status, so forged notes can neither fail a clean run nor clear a failed one."""
    exception = notes.exception if returncode in (1, VIOLATION_EXIT_CODE, FILE_SIZE_EXIT_CODE) else None
    if returncode == MEMORY_EXIT_CODE:
        exception = "MemoryError"
    if required and returncode == ISOLATION_EXIT_CODE and missing:
        return _Verdict("isolation_unavailable", "; ".join(missing))
    if timed_out:
        return _Verdict("timeout", f"wall-clock limit of {timeout_s:g} s")
    if output_over:
        return _Verdict("output_limit", "output over the size limit")
    if returncode == VIOLATION_EXIT_CODE or returncode == -signal.SIGSYS:
        if notes.violations:
            detail = notes.violations[0]
        elif returncode == VIOLATION_EXIT_CODE:          # an uncaught PermissionError: the kernel layers' answer
            detail = _last_line(stderr) or "PermissionError"
        else:
            detail = "the kernel ended the process at a system call the sandbox forbids (SIGSYS)"
        return _Verdict("sandbox_violation", detail, tuple(notes.violations), exception)
    if returncode == MEMORY_EXIT_CODE:
        return _Verdict("memory_limit", "MemoryError", exception=exception)
    if returncode == FILE_SIZE_EXIT_CODE:
        return _Verdict("file_size_limit", f"file size limit of {MAX_FILE_BYTES} bytes", exception=exception)
    if returncode is not None and returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        # A SIGXCPU (or the hard limit's SIGKILL) is the CPU limit only if the process spent CPU time near it
        # (wait4's figure runs up to ~30% below the kernel's limit clock on a loaded VM, hence one half):
        # one the code sent itself at once is a plain signal.
        spent = cpu_used_s is not None and cpu_used_s >= 0.5 * cpu_s
        if sig in (signal.SIGXCPU, signal.SIGKILL) and spent:
            return _Verdict("cpu_limit", f"CPU time limit of {cpu_s} s")
        if sig == signal.SIGXFSZ:
            return _Verdict("file_size_limit", f"file size limit of {MAX_FILE_BYTES} bytes")
        return _Verdict("signal", name)
    return _Verdict(None, "", exception=exception)


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


def _remove_tree(root: str) -> None:
    """Delete the scratch dir and everything in it; never raises, whatever the code left there.

    Iterative and descriptor-relative (``openat``/``unlinkat``), so 3,000 nested directories neither recurse
    (``shutil.rmtree`` raised ``RecursionError``) nor hit ``PATH_MAX``; symlinks are removed, never followed;
    a directory the code made unreadable gets its owner's rights back first. The code's process group is dead
    by then, so nothing moves underneath. What cannot be removed stays (in the system temp dir).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def open_dir(name: str, dir_fd: int | None) -> int:
        try:
            return os.open(name, flags, dir_fd=dir_fd)
        except PermissionError:
            os.chmod(name, 0o700, dir_fd=dir_fd)
            return os.open(name, flags, dir_fd=dir_fd)

    try:
        fd = open_dir(root, None)
    except OSError:
        return
    names: list[str] = []                     # the path from root down to fd, one name per level
    try:
        while True:
            with os.scandir(fd) as it:
                entry = next(it, None)
            if entry is None:                     # empty: go up and remove it
                if not names:
                    break
                parent = os.open("..", flags & ~os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(names.pop(), dir_fd=fd)
            elif entry.is_dir(follow_symlinks=False):
                child = open_dir(entry.name, fd)
                os.close(fd)
                fd = child
                names.append(entry.name)
            else:
                os.unlink(entry.name, dir_fd=fd)
    except Exception:  # noqa: BLE001 - clean-up must not fail a run; the rest stays in the temp dir
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.rmdir(root)
    except OSError:
        pass


def _reap(proc: subprocess.Popen, deadline: float | None) -> float | None:
    """Wait for the child with ``wait4`` (so its CPU time is the kernel's), until ``deadline`` (None: block).

    Returns the child's user + system CPU seconds once reaped (``proc.returncode`` is set), None if the
    deadline passed first."""
    delay = 0.0005
    while True:
        try:
            pid, status, usage = os.wait4(proc.pid, 0 if deadline is None else os.WNOHANG)
        except ChildProcessError:                 # reaped elsewhere: the status is lost
            if proc.returncode is None:
                proc.returncode = -signal.SIGKILL
            return None
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def run_python(code: str, *, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
               max_output_bytes: int = 64_000, layers: tuple[str, ...] | None = None,
               require_isolation: bool | None = None, audit_hook: bool = True) -> ExecutionResult:
    """Run ``code`` in the sandbox described in the module docstring and report what happened.

    ``layers``: the kernel layers to apply (default: all of :data:`~memtoc.tasks.codeexec.isolation.LAYERS`);
    ``require_isolation``: refuse to run the code (``killed_reason="isolation_unavailable"``) when one of them
    is missing (default: as set by :func:`check_isolation`, else False, with a warning once);
    ``audit_hook=False`` leaves the kernel layers alone (for tests of those layers).
    Never raises for anything the code does (the scratch clean-up included); raises
    :class:`SandboxLimitError` (a ValueError) for bad limits.
    """
    SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
    layers = LAYERS if layers is None else tuple(layers)
    unknown = [x for x in layers if x not in LAYERS]
    if unknown:
        raise ValueError(f"unknown isolation layer(s) {unknown}; known: {', '.join(LAYERS)}")
    require = _require_default[0] if require_isolation is None else require_isolation
    started = time.monotonic()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="memtoc-sandbox-"))
    try:
        run = _run_in(workdir, code, started=started, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb,
                      max_output_bytes=max_output_bytes, layers=layers, require=require, audit_hook=audit_hook)
    finally:
        _remove_tree(workdir)
    reader, proc, timed_out, output_over, cpu_used = run
    setup = _parse_setup(bytes(reader.data["setup"]))
    notes = _parse_notes(bytes(reader.data["notes"]))
    stdout = _decode(bytes(reader.data["stdout"]), reader.overflow["stdout"], max_output_bytes)
    stderr = _decode(bytes(reader.data["stderr"]), reader.overflow["stderr"], max_output_bytes)
    returncode = proc.returncode
    verdict = _classify(returncode, timed_out=timed_out, output_over=output_over, cpu_used_s=cpu_used,
                        notes=notes, stderr=stderr, timeout_s=timeout_s, cpu_s=cpu_s, missing=setup.missing,
                        required=require)
    if not require:
        _warn_missing(tuple(setup.missing))
    ok = returncode == 0 and verdict.reason is None
    return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=returncode, timed_out=timed_out,
                           killed_reason=verdict.reason, ok=ok, detail=verdict.detail,
                           violations=verdict.violations, exception=verdict.exception,
                           stdout_truncated=reader.overflow["stdout"], stderr_truncated=reader.overflow["stderr"],
                           duration_s=round(time.monotonic() - started, 3), isolation=tuple(setup.in_force),
                           isolation_missing=tuple(setup.missing))


def _run_in(workdir: str, code: str, *, started: float, timeout_s: float, cpu_s: int, memory_mb: int,
            max_output_bytes: int, layers: tuple[str, ...], require: bool, audit_hook: bool):
    """Start the prelude in ``workdir`` and collect its streams until it ends or a limit stops it."""
    code_path = os.path.join(workdir, "main.py")
    with open(code_path, "w", encoding="utf-8") as fh:
        fh.write(code)
    pipes = [os.pipe(), os.pipe()]                     # (setup, notes), each (read, write)
    (setup_r, setup_w), (notes_r, notes_w) = pipes
    try:
        policy = _base_policy().with_scratch(workdir, layers)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-X", "utf8", str(PRELUDE), workdir, code_path, str(setup_w),
             str(notes_w), str(KERNEL_LAYERS_MODULE), policy.encode(), "require" if require else "best-effort",
             "hook" if audit_hook else "no-hook"],
            cwd=workdir, env=_environment(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(setup_w, notes_w), start_new_session=True,
            preexec_fn=_limits(int(cpu_s), int(memory_mb)))
    except BaseException:
        for fd in (setup_r, setup_w, notes_r, notes_w):
            os.close(fd)
        raise
    os.close(setup_w)                                  # the child's copies are the only write ends
    os.close(notes_w)
    reader = _CappedReader({"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "setup": setup_r,
                            "notes": notes_r},
                           {"stdout": max_output_bytes, "stderr": max_output_bytes, "setup": _REPORT_CAP,
                            "notes": _REPORT_CAP})
    timed_out = output_over = False
    cpu_used = None
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
            cpu_used = _reap(proc, deadline)
            if proc.returncode is None:
                timed_out = True
                _kill_group(proc)
        if proc.returncode is None:
            cpu_used = _reap(proc, None)
        _kill_group(proc)  # nothing of the group may outlive the run
        drain_until = time.monotonic() + 1.0  # what the dead group left in the pipes, bounded by the caps
        while reader.open and time.monotonic() < drain_until:
            reader.poll(0.05)
    finally:
        if proc.returncode is None:
            _kill_group(proc)
            _reap(proc, None)
        reader.close()
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        os.close(setup_r)
        os.close(notes_r)
    return reader, proc, timed_out, output_over, cpu_used


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
