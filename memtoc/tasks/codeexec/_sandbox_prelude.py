"""Bootstrap of a sandboxed run (:mod:`memtoc.tasks.codeexec.sandbox`): kernel isolation, the audit hook, the code.

This file is executed as a script by a fresh interpreter (``python -I -B -X utf8 <this file> ...``); it is
not imported by the toolkit and imports nothing from it but :mod:`memtoc.tasks.codeexec._kernel_layers`, loaded by
path (standard library only), and only when kernel layers are asked for. Arguments: the sandbox directory (the
only place writes are allowed), the path of the code to run, the number of an inherited file descriptor on
which sandbox events are reported to the parent, the path of ``_kernel_layers.py``, the policy in its line
format (:meth:`memtoc.tasks.codeexec.isolation.IsolationPolicy.encode`), ``require`` or ``best-effort``, and
``hook`` or ``no-hook`` (tests of the kernel layers alone). Report lines:

- ``isolation<TAB><layer><TAB>1|0<TAB><detail>``: a kernel layer in force (1) or missing (0, with the reason);
- ``violation<TAB><event><TAB><detail>``: an action the hook refused (at most 50 lines are written);
- ``exception<TAB><type name>``: the code ended with an uncaught exception of that type.

Kernel layers (:func:`_kernel_layers.apply`) are applied after the trusted preloads and before the audit hook;
with ``require``, a missing layer ends the run with status 4 before the code is read. The hook enforces the
same read allow-list as Landlock (file opens and directory listings), as a second layer where Landlock is
missing.

Order matters: trusted libraries the code names (numpy, scipy, sympy, mpmath) are imported *before* the hook,
because their own imports touch modules the hook refuses (numpy imports ctypes); blocked modules are then
dropped from ``sys.modules`` so the user's ``import`` goes through the hook again. The user code is compiled
as ``main.py`` (written into the sandbox, so tracebacks show its lines) and executed in a fresh ``__main__``
module (this file's globals are not reachable as ``__main__``); an uncaught exception prints the usual
traceback without this file's frames and exits with status 1. A run in which the hook refused anything exits
with status 3 even if the code caught the refusal. All hook state lives in closures of :func:`_bootstrap`.
"""

import os
import sys


class SandboxViolation(PermissionError):
    """An action the sandbox refuses."""


class SandboxImportError(ImportError):
    """An import the sandbox refuses."""


def _load_kernel_layers(path):
    """Import ``_kernel_layers.py`` from its path (the toolkit is not importable under ``-I``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_memtoc_kernel_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bootstrap(sandbox, code_path, report_fd, layers_path, policy_text, require, audit_hook=True):
    import builtins
    import traceback
    import types

    violation_exit = 3
    max_reports = 50
    trusted_preloads = ("numpy", "scipy", "sympy", "mpmath")

    # Top-level modules whose import is refused: networking, foreign-function access, process creation.
    blocked_modules = frozenset({
        "socket", "_socket", "ssl", "_ssl", "http", "urllib", "urllib2", "urllib3", "requests", "httpx",
        "aiohttp", "ftplib", "smtplib", "poplib", "imaplib", "nntplib", "telnetlib", "xmlrpc", "socketserver",
        "webbrowser", "asyncio", "selectors", "select",
        "ctypes", "_ctypes", "cffi",
        "subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "concurrent", "pty",
    })
    # Events refused outright.
    blocked_events = frozenset({
        "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "os.startfile",
        "subprocess.Popen", "pty.spawn", "resource.setrlimit", "resource.prlimit", "os.chroot",
    })
    blocked_prefixes = ("socket.", "ctypes.")
    # Events that write or delete paths: event -> (indices of path arguments, index where dir_fd args start).
    path_events = {
        "os.remove": ((0,), 1), "os.rmdir": ((0,), 1), "os.mkdir": ((0,), 2), "os.rename": ((0, 1), 2),
        "os.link": ((0, 1), 2), "os.symlink": ((1,), 2), "os.chmod": ((0,), 2), "os.chown": ((0,), 3),
        "os.utime": ((0,), 3), "os.truncate": ((0,), None), "os.chflags": ((0,), None),
        "os.lchflags": ((0,), None), "os.setxattr": ((0,), None), "os.removexattr": ((0,), None),
        "shutil.rmtree": ((0,), None), "shutil.copyfile": ((1,), None), "shutil.copymode": ((1,), None),
        "shutil.copystat": ((1,), None), "shutil.copytree": ((1,), None), "shutil.move": ((0, 1), None),
        "shutil.chown": ((0,), None), "shutil.make_archive": ((0,), None), "shutil.unpack_archive": ((1,), None),
    }
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    allowed_write_files = frozenset({"/dev/null"})
    isolation_exit = 4
    realpath, fsdecode, os_write, getpid, sep = os.path.realpath, os.fsdecode, os.write, os.getpid, os.sep
    root = realpath(sandbox)
    violations = [0]
    policy = {}                          # key -> values, from "key<TAB>value" lines
    for line in policy_text.split("\n"):
        key, _, value = line.partition("\t")
        policy.setdefault(key, []).append(value)
    # The hook's read allow-list: Landlock's, as prefixes (hierarchies) and exact paths.
    read_trees = tuple(dict.fromkeys([root] + policy.get("read_dir", [])))
    read_exact = frozenset(policy.get("read_file", []) + policy.get("rw_file", []))
    list_trees = tuple(dict.fromkeys(read_trees + tuple(policy.get("list_dir", []))))

    def report(line):
        try:
            os_write(report_fd, (line.replace("\n", " ")[:500] + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def refuse(event, detail, exc_type=SandboxViolation):
        violations[0] += 1
        if violations[0] <= max_reports:
            report(f"violation\t{event}\t{detail}")
        raise exc_type(f"the sandbox refused {event}: {detail}")

    def resolve(path):
        try:
            return realpath(fsdecode(path))
        except (TypeError, ValueError):
            return None

    def beneath(real, trees):
        return real is not None and any(real == t or real.startswith(t + sep) for t in trees)

    def inside(path):
        """True when ``path`` (str/bytes/PathLike; ints are open fds) resolves inside the sandbox."""
        if path is None or isinstance(path, int):
            return True
        real = resolve(path)
        return beneath(real, (root,)) or real in allowed_write_files

    def readable(path, trees):
        if path is None or isinstance(path, int):
            return True
        real = resolve(path)
        return beneath(real, trees) or real in read_exact

    def sqlite_target(database):
        # "file:" URIs name a path too (with uri=True); ":memory:" and "" are not files
        text = fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
        if text.startswith("file:"):
            text = text[5:].split("?", 1)[0].split("#", 1)[0]
            if text.startswith("//"):
                text = "/" + text[2:].split("/", 1)[-1]
        return None if text in ("", ":memory:") else text

    def is_write(mode, flags):
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return True
        return isinstance(flags, int) and bool(flags & write_flags)

    def hook(event, args):
        if event == "import":
            name = args[0] if args else ""
            if isinstance(name, str) and name.split(".", 1)[0] in blocked_modules:
                refuse("import", f"{name} (networking, ctypes and process modules are disabled)",
                       SandboxImportError)
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if is_write(mode, flags):
                if not inside(path):
                    refuse("open", f"writing {path!r} outside the sandbox directory")
            elif not readable(path, read_trees):
                refuse("open", f"reading {path!r} (outside the sandbox's read allow-list)")
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args else None
            if not readable("." if path is None else path, list_trees):
                refuse(event, f"listing {path!r} (outside the sandbox's read allow-list)")
        elif event == "sqlite3.connect":
            target = sqlite_target(args[0]) if args else None
            if target is not None and not inside(target):
                refuse(event, f"database {args[0]!r} is outside the sandbox directory")
        elif event in blocked_events or event.startswith(blocked_prefixes):
            refuse(event, "process creation, networking, ctypes and resource limits are disabled")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            target = args[0] if args else None
            if not (event == "os.kill" and target in (0, getpid())):
                refuse(event, f"signal to {target!r}")
        elif event in path_events:
            indices, dir_fd_start = path_events[event]
            for i in indices:
                if i < len(args) and not inside(args[i]):
                    refuse(event, f"{args[i]!r} is outside the sandbox directory")
            # dir_fd arguments default to AT_FDCWD (negative); a real directory descriptor cannot be checked
            if dir_fd_start is not None and any(isinstance(a, int) and a >= 0 for a in args[dir_fd_start:]):
                refuse(event, "dir_fd-relative paths cannot be checked")

    def preload(source):
        for name in trusted_preloads:
            if name in source:
                try:
                    __import__(name)
                except Exception:  # not installed, or failed under the limits: the user's import will say so
                    pass
        for mod in list(sys.modules):
            if mod.split(".", 1)[0] in blocked_modules:
                del sys.modules[mod]

    def strip_prelude(te, seen):
        # Drop this file's frames (bootstrap and hook), so the traceback reads as "python main.py" would.
        if te is None or id(te) in seen:
            return
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
        strip_prelude(te.__cause__, seen)
        strip_prelude(te.__context__, seen)

    def print_exception(exc):
        # lookup_lines=False: source lines are read when formatting, after this file's frames are dropped
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False)
        strip_prelude(te, set())
        sys.stderr.write("".join(te.format()))

    with open(code_path, encoding="utf-8") as fh:
        source = fh.read()
    preload(source)                     # before the kernel layers: the libraries read files Landlock then hides
    layers = {}
    if policy.get("layer"):             # only then load the module (and ctypes)
        kernel_layers = _load_kernel_layers(layers_path)
        layers = kernel_layers.apply(kernel_layers.parse_policy(policy_text))
        del kernel_layers
    for layer, (in_force, detail) in layers.items():
        report(f"isolation\t{layer}\t{int(in_force)}\t{detail}")
    if require and not all(in_force for in_force, _ in layers.values()):
        return isolation_exit
    for mod in list(sys.modules):       # ctypes again, loaded by the kernel layers
        if mod.split(".", 1)[0] in blocked_modules:
            del sys.modules[mod]
    main = types.ModuleType("__main__")
    main.__dict__.update({"__file__": "main.py", "__builtins__": builtins})
    sys.modules["__main__"] = main
    if audit_hook:                      # off only in tests of the kernel layers alone
        sys.addaudithook(hook)
    status = 0
    try:
        exec(compile(source, "main.py", "exec"), main.__dict__)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - everything the code raises is reported, like "python main.py"
        if isinstance(exc, MemoryError):
            main.__dict__.clear()  # free what the code allocated, so the traceback can be printed
        report(f"exception\t{type(exc).__name__}")
        print_exception(exc)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    return violation_exit if violations[0] else status


if __name__ == "__main__":
    _args = sys.argv[1:8]
    sys.argv = ["main.py"]
    sys.dont_write_bytecode = True
    os._exit(_bootstrap(_args[0], _args[1], int(_args[2]), _args[3], _args[4], _args[5] == "require",
                        _args[6] != "no-hook"))
