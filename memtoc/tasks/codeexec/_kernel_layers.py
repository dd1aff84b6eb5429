"""The kernel layers of the sandbox, applied inside the sandboxed child: Landlock, a network namespace, seccomp.

This file is what the child's prelude loads (by path: the toolkit is not importable under ``python -I``), so it
imports only ``os``, ``errno``, ``struct``, ``sys`` and ``ctypes`` -- start-up time of every execution
matters -- and takes the policy in the line format of :func:`parse_policy` (written by
:meth:`memtoc.tasks.codeexec.isolation.IsolationPolicy.encode`). Each layer, once applied, is irreversible and
inherited by anything the code could start:

- ``netns``: ``unshare(CLONE_NEWUSER | CLONE_NEWNET)`` (falls back to ``CLONE_NEWNET`` alone). The process sees
  only a loopback interface that is down, so no address is reachable, 127.0.0.1 included; the user namespace
  also takes every capability of the host's root away (the process keeps its host uid for file ownership and
  for the kernel's same-owner checks, which is why seccomp guards the calls on other processes).
- ``ipcns``: ``unshare(CLONE_NEWIPC | CLONE_NEWUTS)`` (inside a fresh user namespace when the process has none
  yet): the host's System V shared memory, message queues and semaphores and its POSIX message queues are
  unreachable, and whatever the code creates dies with the namespace when the process ends.
- ``landlock`` (Linux >= 5.13, ABI 1..7): file-system reads only beneath the policy's read paths, writes
  (create, remove, truncate, rename, link) only beneath the scratch directory; ``/dev/null`` writable. Nothing
  may be executed (no path has the execute right). From ABI 4 TCP bind/connect are denied, from ABI 6 signals
  to processes outside the sandbox and abstract unix sockets too.
- ``seccomp`` (x86_64 only; elsewhere reported missing): a BPF filter answering ``EPERM`` to socket creation,
  process creation (fork, vfork, execve, clone without ``CLONE_THREAD``; ``clone3`` gets ``ENOSYS`` so thread
  creation falls back to ``clone``), ptrace and cross-process memory access, namespace and mount calls,
  bpf/perf/io_uring/userfaultfd/keyring/module calls, handle-based opens, raising resource limits, and the
  metadata writes Landlock does not cover (chmod, chown, utime, xattr) -- inside the scratch directory too.
  Calls that act on another process -- signals, ``sched_setaffinity``/``sched_setscheduler``/``sched_setparam``/
  ``sched_setattr``, ``setpriority``, ``ioprio_set``, ``prlimit64``, ``migrate_pages``/``move_pages`` -- are
  allowed only on the process itself (pid 0 or its own pid). The escape calls (sockets, process creation,
  ptrace, namespaces, mounts, kernel interfaces, calls on other processes) do not return an error: the kernel
  ends the process with SIGSYS (``SECCOMP_RET_KILL_PROCESS``), so an attempt is on record in the exit status
  even when the audit hook was switched off and the code would have caught the error. Metadata writes and
  limit changes, which ordinary library code may try inside the scratch directory, get ``EPERM``.
- the **witness** (:func:`make_witness`, x86_64, armed by the audit hook at its first refusal): one more filter
  under which the process can end only with the violation status (3); ``exit_group``/``exit`` with any other
  status end it with SIGSYS. A refusal the code caught, followed by ``os._exit(0)``, is therefore still a
  violation in the status the parent reads from the kernel.

:func:`apply` never raises: a layer the kernel refuses is reported as missing with the reason, and the caller
decides (the sandbox warns, or refuses to run with ``require_isolation``). See docs/sandbox.md.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

__all__ = ["LAYERS", "WirePolicy", "parse_policy", "apply", "landlock_abi", "make_witness", "WITNESS_STATUS"]

LAYERS: tuple[str, ...] = ("netns", "ipcns", "landlock", "seccomp")

# --- Landlock (include/uapi/linux/landlock.h) -------------------------------------------------------------
_NR_LANDLOCK_CREATE_RULESET, _NR_LANDLOCK_ADD_RULE, _NR_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # all arches
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
_FS_ABI1 = (1 << 13) - 1
#: Rights that may be granted on a rule whose path is a file rather than a directory.
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_READ_FILE | FS_READ_DIR
#: What the scratch directory allows: everything but executing and making devices or sockets.
_SCRATCH = (FS_WRITE_FILE | FS_READ_FILE | FS_READ_DIR | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR
            | FS_MAKE_REG | FS_MAKE_FIFO | FS_MAKE_SYM | FS_REFER | FS_TRUNCATE)

# --- seccomp (x86_64) ---------------------------------------------------------------------------------------
_PR_SET_NO_NEW_PRIVS = 38
_NR_SECCOMP_X86_64 = 317
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_CLONE_THREAD = 0x00010000
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_CLONE_NEWIPC, _CLONE_NEWUTS = 0x08000000, 0x04000000
#: The only exit status a process with an armed witness may end with (the prelude's violation status).
WITNESS_STATUS = 3
#: x86_64 escape calls: the process is killed (SIGSYS), so the attempt shows in its exit status.
_X86_64_KILL_CALLS: dict[str, int] = {
    "socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165,
    "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246,
    "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176, "add_key": 248,
    "request_key": 249, "keyctl": 250, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "quotactl": 179,
    "swapon": 167, "swapoff": 168, "reboot": 169, "settimeofday": 164, "clock_settime": 227,
    "sethostname": 170, "setdomainname": 171, "pidfd_open": 434, "pidfd_getfd": 438,
    "pidfd_send_signal": 424, "rt_sigqueueinfo": 129, "kcmp": 312, "process_madvise": 440,
}
#: x86_64 calls answered with EPERM: metadata writes Landlock does not cover, limit changes, the clock.
_X86_64_EPERM_CALLS: dict[str, int] = {
    "setrlimit": 160, "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93,
    "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
    "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466, "adjtimex": 159,
}
#: Every call the filter refuses outright (name -> number), see the module docstring.
_X86_64_DENY: dict[str, int] = {**_X86_64_KILL_CALLS, **_X86_64_EPERM_CALLS}
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_PRLIMIT64 = 56, 435, 302
_X86_64_EXIT, _X86_64_EXIT_GROUP = 60, 231
#: Calls whose first argument is a pid, allowed only on the process itself (kill also -pid: its own group).
_X86_64_KILL, _X86_64_TKILL, _X86_64_TGKILL, _X86_64_RT_TGSIGQUEUEINFO = 62, 200, 234, 297
_X86_64_OWN_PID_CALLS: dict[str, int] = {
    "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314,
    "migrate_pages": 256, "move_pages": 279, "tkill": 200, "tgkill": 234, "rt_tgsigqueueinfo": 297,
}
#: (which, who) calls: allowed only for which == the per-process selector and who in (0, own pid).
_X86_64_SETPRIORITY, _PRIO_PROCESS = 141, 0
_X86_64_IOPRIO_SET, _IOPRIO_WHO_PROCESS = 251, 1


class WirePolicy:
    """The policy as the child receives it (attributes as :class:`memtoc.tasks.codeexec.isolation.IsolationPolicy`)."""

    KEYS = {"scratch": "scratch", "read_dir": "read_dirs", "list_dir": "list_dirs", "read_file": "read_files",
            "rw_file": "rw_files", "layer": "layers"}

    def __init__(self) -> None:
        self.scratch = ""
        self.read_dirs: list[str] = []
        self.list_dirs: list[str] = []
        self.read_files: list[str] = []
        self.rw_files: list[str] = []
        self.layers: list[str] = []


def parse_policy(text: str) -> WirePolicy:
    """Read the line format: one ``key<TAB>value`` per line, keys of :attr:`WirePolicy.KEYS`."""
    policy = WirePolicy()
    for line in text.split("\n"):
        key, sep, value = line.partition("\t")
        if not sep:
            continue
        attr = WirePolicy.KEYS.get(key)
        if attr == "scratch":
            policy.scratch = value
        elif attr is not None:
            getattr(policy, attr).append(value)
    return policy


# --- applying -----------------------------------------------------------------------------------------------

def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _err(what: str) -> str:
    code = ctypes.get_errno()
    return f"{what}: {errno.errorcode.get(code, code)} ({os.strerror(code)})"


def landlock_abi(libc: ctypes.CDLL | None = None) -> int:
    """Landlock ABI version of the running kernel, or 0 when Landlock is absent or disabled."""
    if not sys.platform.startswith("linux"):       # the syscall numbers below are Linux's
        return 0
    libc = libc or _libc()
    v = libc.syscall(_NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return int(v) if v > 0 else 0


def _no_new_privs(libc: ctypes.CDLL) -> str | None:
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return _err("prctl(PR_SET_NO_NEW_PRIVS)")
    return None


def apply_netns(libc: ctypes.CDLL) -> tuple[bool, str]:
    """A fresh network namespace (inside a fresh user namespace when the kernel allows it)."""
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) == 0:
        return True, "user+net namespace"
    first = _err("unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    if libc.unshare(_CLONE_NEWNET) == 0:
        return True, "net namespace"
    return False, f"{first}; {_err('unshare(CLONE_NEWNET)')}"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    rights = _FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def apply_landlock(libc: ctypes.CDLL, policy: WirePolicy) -> tuple[bool, str]:
    """Restrict this thread (and what it starts) to the policy's file-system view."""
    abi = landlock_abi(libc)
    if abi < 1:
        return False, _err("landlock_create_ruleset") + " (kernel without Landlock, or disabled in the LSM list)"
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=handled,
                        handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    ruleset = libc.syscall(_NR_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return False, _err("landlock_create_ruleset")
    try:
        rules = [(policy.scratch, _SCRATCH)]
        rules += [(p, _READ) for p in policy.read_dirs]
        rules += [(p, FS_READ_DIR) for p in policy.list_dirs]
        rules += [(p, FS_READ_FILE) for p in policy.read_files]
        rules += [(p, FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE) for p in policy.rw_files]
        added = 0
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue                                     # a path this machine does not have
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(allowed_access=rights & handled, parent_fd=fd)
                if libc.syscall(_NR_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    return False, _err(f"landlock_add_rule({path})")
                added += 1
            finally:
                os.close(fd)
        problem = _no_new_privs(libc)
        if problem:
            return False, problem
        if libc.syscall(_NR_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return False, _err("landlock_restrict_self")
    finally:
        os.close(ruleset)
    extra = [] if abi >= 4 else ["no TCP rules before ABI 4"]
    if abi < 6:
        extra.append("no signal scoping before ABI 6")
    if threads > 1:
        extra.append(f"{threads - 1} thread(s) started before it stay unrestricted")
    return True, f"ABI {abi}, {added} rules" + (f" ({'; '.join(extra)})" if extra else "")


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument ``i`` in ``struct seccomp_data`` (little-endian)."""
    return 16 + 8 * i


def _block(nr: int, body: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """``if nr == <nr>: body`` (the body ends in a return); otherwise fall through past it."""
    return [(_JEQ_K, 0, len(body), nr)] + body


def _only(arg: int, values: list[int], otherwise: int) -> list[tuple[int, int, int, int]]:
    """Load argument ``arg``; return ``otherwise`` unless it is one of ``values``, else continue after."""
    out = [(_LD_W_ABS, 0, 0, _arg(arg))]
    for i, v in enumerate(values):
        out.append((_JEQ_K, len(values) - i, 0, v & 0xFFFFFFFF))   # -> the instruction after the return
    out.append((_RET_K, 0, 0, otherwise))
    return out


def _seccomp_program(pid: int) -> bytes:
    """BPF for x86_64: kill on the escape calls of :data:`_X86_64_KILL_CALLS`, non-thread clones and calls on
    other processes than ``pid``; EPERM for :data:`_X86_64_EPERM_CALLS` and limit changes; allow the rest."""
    kill, eperm, enosys, allow = _RET_KILL_PROCESS, _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS, _RET_ALLOW
    own = [pid, 0]
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, 4),                                  # seccomp_data.arch
        (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET_K, 0, 0, enosys),                                # i386 (int 0x80) calls: refused
        (_LD_W_ABS, 0, 0, 0),                                  # seccomp_data.nr
        (_JGE_K, 0, 1, 0x40000000),
        (_RET_K, 0, 0, enosys),                                # x32 calls: refused
    ]
    for nr in sorted(set(_X86_64_KILL_CALLS.values())):
        prog += _block(nr, [(_RET_K, 0, 0, kill)])
    for nr in sorted(set(_X86_64_EPERM_CALLS.values())):
        prog += _block(nr, [(_RET_K, 0, 0, eperm)])
    prog += _block(_X86_64_CLONE3, [(_RET_K, 0, 0, enosys)])   # glibc then falls back to clone
    prog += _block(_X86_64_CLONE, [(_LD_W_ABS, 0, 0, _arg(0)),  # flags, low 32 bits
                                   (_JSET_K, 0, 1, _CLONE_THREAD), (_RET_K, 0, 0, allow),
                                   (_RET_K, 0, 0, kill)])       # a clone that makes a process
    prog += _block(_X86_64_PRLIMIT64, _only(0, own, kill) + [   # another process's limits: killed
        (_LD_W_ABS, 0, 0, _arg(2)), (_JEQ_K, 0, 2, 0),          # new limit pointer, low and high half
        (_LD_W_ABS, 0, 0, _arg(2) + 4), (_JEQ_K, 1, 0, 0),
        (_RET_K, 0, 0, eperm),                                  # prlimit64 that sets a limit
        (_RET_K, 0, 0, allow)])
    prog += _block(_X86_64_KILL, _only(0, own + [-pid], kill) + [(_RET_K, 0, 0, allow)])  # 0: own group
    for nr in sorted(set(_X86_64_OWN_PID_CALLS.values())):
        prog += _block(nr, _only(0, own, kill) + [(_RET_K, 0, 0, allow)])
    for nr, selector in ((_X86_64_SETPRIORITY, _PRIO_PROCESS), (_X86_64_IOPRIO_SET, _IOPRIO_WHO_PROCESS)):
        prog += _block(nr, _only(0, [selector], kill) + _only(1, own, kill) + [(_RET_K, 0, 0, allow)])
    prog.append((_RET_K, 0, 0, allow))
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in prog) and len(prog) < 4096
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def _witness_program() -> bytes:
    """BPF for x86_64: ``exit``/``exit_group`` with any status but :data:`WITNESS_STATUS` kill the process."""
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64), (_RET_K, 0, 0, _RET_KILL_PROCESS),
            (_LD_W_ABS, 0, 0, 0)]
    for nr in (_X86_64_EXIT, _X86_64_EXIT_GROUP):
        prog += _block(nr, _only(0, [WITNESS_STATUS], _RET_KILL_PROCESS) + [(_RET_K, 0, 0, _RET_ALLOW)])
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def _install_filter(libc: ctypes.CDLL, code: bytes) -> str | None:
    """Install one BPF program on every thread (TSYNC); None, or the error."""
    buf = ctypes.create_string_buffer(code, len(code))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Fprog(len(code) // 8, ctypes.addressof(buf))
    problem = _no_new_privs(libc)
    if problem:
        return problem
    if libc.syscall(_NR_SECCOMP_X86_64, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                    ctypes.byref(prog)) != 0:
        return _err("seccomp(SECCOMP_SET_MODE_FILTER)")
    return None


def _x86_64() -> bool:
    return os.uname().machine == "x86_64" and sys.maxsize > 2 ** 32


def make_witness():
    """A function that arms the witness filter (:func:`_witness_program`) and returns True, or None where no
    filter can be written (not x86_64, no C library). Made before the code runs, called by the audit hook."""
    if not sys.platform.startswith("linux") or not _x86_64():
        return None
    try:
        libc = _libc()
    except OSError:
        return None
    code = _witness_program()
    _ = (libc.prctl, libc.syscall)                  # resolved now: no symbol look-up once the code runs

    def arm() -> bool:
        return _install_filter(libc, code) is None
    return arm


def apply_seccomp(libc: ctypes.CDLL) -> tuple[bool, str]:
    """Install the filter of :func:`_seccomp_program` on every thread of the process."""
    if not _x86_64():
        return False, f"no syscall table for {os.uname().machine} (the filter is written for x86_64)"
    problem = _install_filter(libc, _seccomp_program(os.getpid()))
    if problem:
        return False, problem
    return True, (f"x86_64 filter, {len(_X86_64_DENY)} calls denied, "
                  f"{len(_X86_64_OWN_PID_CALLS) + 4} limited to the process itself")


def apply_ipcns(libc: ctypes.CDLL) -> tuple[bool, str]:
    """Fresh IPC and UTS namespaces (with a user namespace of their own when the process lacks the right)."""
    if libc.unshare(_CLONE_NEWIPC | _CLONE_NEWUTS) == 0:
        return True, "ipc+uts namespace"
    first = _err("unshare(CLONE_NEWIPC|CLONE_NEWUTS)")
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWIPC | _CLONE_NEWUTS) == 0:
        return True, "user+ipc+uts namespace"
    return False, f"{first}; {_err('unshare(CLONE_NEWUSER|CLONE_NEWIPC|CLONE_NEWUTS)')}"


def apply(policy: WirePolicy) -> dict[str, tuple[bool, str]]:
    """Apply the policy's layers in order (netns, ipcns, landlock, seccomp); layer -> (in force, detail or reason).

    Order matters: the user namespace must be made while the process is single-threaded and before seccomp
    forbids ``unshare`` (ipcns uses the rights netns's user namespace gives); Landlock before seccomp, which
    would refuse nothing Landlock needs but comes last so a failure of the filter leaves the others in force.
    """
    out: dict[str, tuple[bool, str]] = {}
    if not sys.platform.startswith("linux"):
        return {layer: (False, f"not Linux ({sys.platform})") for layer in LAYERS if layer in policy.layers}
    try:
        libc = _libc()
    except OSError as exc:
        return {layer: (False, f"no C library through ctypes ({exc})") for layer in policy.layers}
    steps = {"netns": lambda: apply_netns(libc), "ipcns": lambda: apply_ipcns(libc),
             "landlock": lambda: apply_landlock(libc, policy), "seccomp": lambda: apply_seccomp(libc)}
    for layer in LAYERS:
        if layer in policy.layers:
            try:
                out[layer] = steps[layer]()
            except Exception as exc:  # noqa: BLE001 - a layer that fails is reported, never fatal here
                out[layer] = (False, f"{type(exc).__name__}: {exc}")
    return out
