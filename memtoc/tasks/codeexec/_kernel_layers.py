"""The kernel layers of the sandbox, applied inside the sandboxed child: Landlock, a network namespace, seccomp.

This file is what the child's prelude loads (by path: the toolkit is not importable under ``python -I``), so it
imports only ``os``, ``errno``, ``struct``, ``sys`` and ``ctypes`` -- start-up time of every execution
matters -- and takes the policy in the line format of :func:`parse_policy` (written by
:meth:`memtoc.tasks.codeexec.isolation.IsolationPolicy.encode`). Each layer, once applied, is irreversible and
inherited by anything the code could start:

- ``netns``: ``unshare(CLONE_NEWUSER | CLONE_NEWNET)`` (falls back to ``CLONE_NEWNET`` alone). The process sees
  only a loopback interface that is down, so no address is reachable, 127.0.0.1 included; the user namespace
  also takes every capability of the host's root away (the process keeps its uid for file ownership).
- ``landlock`` (Linux >= 5.13, ABI 1..7): file-system reads only beneath the policy's read paths, writes
  (create, remove, truncate, rename, link) only beneath the scratch directory; ``/dev/null`` writable. Nothing
  may be executed (no path has the execute right). From ABI 4 TCP bind/connect are denied, from ABI 6 signals
  to processes outside the sandbox and abstract unix sockets too.
- ``seccomp`` (x86_64 only; elsewhere reported missing): a BPF filter answering ``EPERM`` to socket creation,
  process creation (fork, vfork, execve, clone without ``CLONE_THREAD``; ``clone3`` gets ``ENOSYS`` so thread
  creation falls back to ``clone``), ptrace and cross-process memory access, namespace and mount calls,
  bpf/perf/io_uring/userfaultfd/keyring/module calls, handle-based opens, raising resource limits, signals to
  other processes, and the metadata writes Landlock does not cover (chmod, chown, utime, xattr) -- inside the
  scratch directory too.

:func:`apply` never raises: a layer the kernel refuses is reported as missing with the reason, and the caller
decides (the sandbox warns, or refuses to run with ``require_isolation``). See docs/sandbox.md.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys

__all__ = ["LAYERS", "WirePolicy", "parse_policy", "apply", "landlock_abi"]

LAYERS: tuple[str, ...] = ("netns", "landlock", "seccomp")

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
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_CLONE_THREAD = 0x00010000
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
#: x86_64 syscalls answered with EPERM (name -> number), see the module docstring.
_X86_64_DENY: dict[str, int] = {
    "socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
    "process_vm_readv": 310, "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165,
    "umount2": 166, "pivot_root": 155, "chroot": 161, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246,
    "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176, "add_key": 248,
    "request_key": 249, "keyctl": 250, "name_to_handle_at": 303, "open_by_handle_at": 304, "setrlimit": 160,
    "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94,
    "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188,
    "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
    "setxattrat": 463, "removexattrat": 466, "fsopen": 430, "fsmount": 432, "move_mount": 429,
    "open_tree": 428, "mount_setattr": 442, "quotactl": 179, "swapon": 167, "swapoff": 168, "reboot": 169,
    "settimeofday": 164, "clock_settime": 227, "adjtimex": 159, "sethostname": 170, "setdomainname": 171,
    "pidfd_open": 434, "pidfd_getfd": 438, "pidfd_send_signal": 424, "rt_sigqueueinfo": 129,
}
_X86_64_CLONE, _X86_64_CLONE3, _X86_64_PRLIMIT64 = 56, 435, 302
#: Signal calls allowed only towards the process itself (first argument = its pid; kill also 0 and -pid).
_X86_64_KILL, _X86_64_TKILL, _X86_64_TGKILL, _X86_64_RT_TGSIGQUEUEINFO = 62, 200, 234, 297


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


def _seccomp_program(pid: int) -> bytes:
    """BPF for x86_64: deny the calls of :data:`_X86_64_DENY`, non-thread clones, limit raises and signals to
    other processes than ``pid``; allow the rest."""
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog: list[tuple[int, int, int, int]] = []

    def ins(code: int, k: int, jt: int = 0, jf: int = 0) -> None:
        prog.append((code, jt, jf, k))

    ins(_LD_W_ABS, 4)                                          # seccomp_data.arch
    ins(_JEQ_K, _AUDIT_ARCH_X86_64, 1, 0)
    ins(_RET_K, enosys)                                        # i386 (int 0x80) calls: refused
    ins(_LD_W_ABS, 0)                                          # seccomp_data.nr
    ins(_JGE_K, 0x40000000, 0, 1)
    ins(_RET_K, enosys)                                        # x32 calls: refused
    for nr in sorted(set(_X86_64_DENY.values())):
        ins(_JEQ_K, nr, 0, 1)
        ins(_RET_K, eperm)
    ins(_JEQ_K, _X86_64_CLONE3, 0, 1)
    ins(_RET_K, enosys)                                        # glibc then falls back to clone
    ins(_JEQ_K, _X86_64_CLONE, 0, 4)
    ins(_LD_W_ABS, 16)                                         # args[0] (flags), low 32 bits
    ins(_JSET_K, _CLONE_THREAD, 0, 1)
    ins(_RET_K, _RET_ALLOW)
    ins(_RET_K, eperm)                                         # a clone that makes a process
    ins(_JEQ_K, _X86_64_PRLIMIT64, 0, 6)
    ins(_LD_W_ABS, 32)                                         # args[2] (new limit pointer), low half
    ins(_JEQ_K, 0, 0, 2)
    ins(_LD_W_ABS, 36)                                         # high half
    ins(_JEQ_K, 0, 1, 0)
    ins(_RET_K, eperm)                                         # prlimit64 that sets a limit
    ins(_RET_K, _RET_ALLOW)
    # signals: kill(0 | pid | -pid, ...), tkill(pid), tgkill(pid, ...), rt_tgsigqueueinfo(pid, ...)
    own = [pid & 0xFFFFFFFF]
    for nr, targets in ((_X86_64_KILL, own + [0, -pid & 0xFFFFFFFF]), (_X86_64_TKILL, own),
                        (_X86_64_TGKILL, own), (_X86_64_RT_TGSIGQUEUEINFO, own)):
        n = len(targets)
        ins(_JEQ_K, nr, 0, n + 3)
        ins(_LD_W_ABS, 16)                                     # args[0], low 32 bits
        for i, target in enumerate(targets):
            ins(_JEQ_K, target, n - i, 0)                      # -> the ALLOW two below the last test
        ins(_RET_K, eperm)
        ins(_RET_K, _RET_ALLOW)
    ins(_RET_K, _RET_ALLOW)
    return b"".join(struct.pack("=HBBI", *i) for i in prog)


def apply_seccomp(libc: ctypes.CDLL) -> tuple[bool, str]:
    """Install the filter of :func:`_seccomp_program` on every thread of the process."""
    machine = os.uname().machine
    if machine != "x86_64" or sys.maxsize <= 2 ** 32:
        return False, f"no syscall table for {machine} (the filter is written for x86_64)"
    code = _seccomp_program(os.getpid())
    buf = ctypes.create_string_buffer(code, len(code))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Fprog(len(code) // 8, ctypes.addressof(buf))
    problem = _no_new_privs(libc)
    if problem:
        return False, problem
    if libc.syscall(_NR_SECCOMP_X86_64, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC,
                    ctypes.byref(prog)) != 0:
        return False, _err("seccomp(SECCOMP_SET_MODE_FILTER)")
    return True, f"x86_64 filter, {len(_X86_64_DENY)} calls denied"


def apply(policy: WirePolicy) -> dict[str, tuple[bool, str]]:
    """Apply the policy's layers in order (netns, landlock, seccomp); layer -> (in force, detail or reason).

    Order matters: the user namespace must be made while the process is single-threaded and before seccomp
    forbids ``unshare``; Landlock before seccomp, which would refuse nothing Landlock needs but comes last so
    a failure of the filter leaves the others in force.
    """
    out: dict[str, tuple[bool, str]] = {}
    if not sys.platform.startswith("linux"):
        return {layer: (False, f"not Linux ({sys.platform})") for layer in LAYERS if layer in policy.layers}
    try:
        libc = _libc()
    except OSError as exc:
        return {layer: (False, f"no C library through ctypes ({exc})") for layer in policy.layers}
    steps = {"netns": lambda: apply_netns(libc), "landlock": lambda: apply_landlock(libc, policy),
             "seccomp": lambda: apply_seccomp(libc)}
    for layer in LAYERS:
        if layer in policy.layers:
            try:
                out[layer] = steps[layer]()
            except Exception as exc:  # noqa: BLE001 - a layer that fails is reported, never fatal here
                out[layer] = (False, f"{type(exc).__name__}: {exc}")
    return out
