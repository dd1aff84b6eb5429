"""Which paths a sandboxed run may read and write, for the kernel layers of :mod:`memtoc.tasks.codeexec._kernel_layers`.

The executor (:mod:`memtoc.tasks.codeexec.sandbox`) computes :func:`default_policy` once per process, sets the
scratch directory of each run, and hands the policy to the child in a line format
(:meth:`IsolationPolicy.encode`); the child's prelude applies it with :mod:`memtoc.tasks.codeexec._kernel_layers`
(Landlock, a network namespace, seccomp) and its audit hook enforces the same read allow-list. See
docs/sandbox.md for what each layer refuses, on which kernels, and what it does not cover.
"""

from __future__ import annotations

import os
import platform
import sysconfig
from dataclasses import dataclass, replace
from importlib.util import find_spec

from memtoc.tasks.codeexec._kernel_layers import LAYERS, apply, landlock_abi, parse_policy

__all__ = ["LAYERS", "TRUSTED_PACKAGES", "IsolationPolicy", "default_policy", "apply", "landlock_abi",
           "parse_policy"]

#: Numeric packages the prelude preloads; their directories (and their vendored ``<name>.libs``) stay readable.
TRUSTED_PACKAGES: tuple[str, ...] = ("numpy", "scipy", "sympy", "mpmath")


@dataclass(frozen=True)
class IsolationPolicy:
    """What a sandboxed run may touch. Paths are absolute; missing ones are skipped when applied."""

    scratch: str
    #: Hierarchies whose files and listings are readable.
    read_dirs: tuple[str, ...] = ()
    #: Directories whose listing (not their files) is readable, e.g. site-packages for the import system.
    list_dirs: tuple[str, ...] = ()
    #: Single files that are readable.
    read_files: tuple[str, ...] = ()
    #: Single files that are readable and writable (``/dev/null``).
    rw_files: tuple[str, ...] = ("/dev/null",)
    #: Layers to apply, a subset of :data:`LAYERS` (tests switch single layers off).
    layers: tuple[str, ...] = LAYERS

    def encode(self) -> str:
        """The line format the child reads (:func:`memtoc.tasks.codeexec._kernel_layers.parse_policy`)."""
        for path in (self.scratch, *self.read_dirs, *self.list_dirs, *self.read_files, *self.rw_files):
            if "\n" in path or "\t" in path:
                raise ValueError(f"path {path!r} cannot be passed to the sandbox (tab or newline in it)")
        lines = [f"scratch\t{self.scratch}"]
        for key, values in (("read_dir", self.read_dirs), ("list_dir", self.list_dirs),
                            ("read_file", self.read_files), ("rw_file", self.rw_files), ("layer", self.layers)):
            lines += [f"{key}\t{v}" for v in values]
        return "\n".join(lines)

    def with_scratch(self, scratch: str, layers: tuple[str, ...] | None = None) -> "IsolationPolicy":
        return replace(self, scratch=scratch, layers=self.layers if layers is None else tuple(layers))


def _package_dirs(name: str) -> list[str]:
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    dirs = [os.path.realpath(p) for p in (spec.submodule_search_locations or ())]
    if not dirs and spec.origin:                                # a single-module distribution
        return [os.path.realpath(spec.origin)]
    for d in list(dirs):
        libs = d + ".libs"                                      # auditwheel's vendored shared libraries
        if os.path.isdir(libs):
            dirs.append(libs)
    return dirs


def default_policy(scratch: str = "", packages: tuple[str, ...] = TRUSTED_PACKAGES) -> IsolationPolicy:
    """The read allow-list for this interpreter: stdlib (less site-packages), trusted packages, shared libraries.

    Deliberately *not* the whole ``sys.path``: a venv's site-packages may hold an installed copy of this
    toolkit, and ``.pth`` files of editable installs point into the repository; neither may be readable.
    """
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    read_dirs: list[str] = []
    list_dirs: list[str] = [stdlib]
    try:
        for entry in sorted(os.listdir(stdlib)):
            if entry not in ("site-packages", "dist-packages"):
                read_dirs.append(os.path.join(stdlib, entry))
    except OSError:
        pass
    for name in packages:
        for d in _package_dirs(name):
            read_dirs.append(d)
            parent = os.path.dirname(d)
            if parent not in list_dirs:
                list_dirs.append(parent)
    multiarch = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    for d in ("/lib64", "/usr/lib64", f"/lib/{multiarch}", f"/usr/lib/{multiarch}"):
        if os.path.isdir(d):
            read_dirs.append(os.path.realpath(d))
    libdir = sysconfig.get_config_var("LIBDIR")       # libpython of a non-system interpreter (pyenv, conda)
    if libdir and os.path.isdir(libdir):
        for entry in sorted(os.listdir(libdir)):
            if entry.startswith("libpython") and ".so" in entry:
                read_dirs.append(os.path.realpath(os.path.join(libdir, entry)))
    read_files = [f for f in ("/etc/ld.so.cache", "/dev/urandom", "/dev/random", "/dev/zero") if os.path.exists(f)]
    return IsolationPolicy(scratch=scratch, read_dirs=tuple(dict.fromkeys(read_dirs)),
                           list_dirs=tuple(dict.fromkeys(list_dirs)), read_files=tuple(read_files))
