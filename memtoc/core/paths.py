"""One input/output contract for every job: each path field of a job config declares its role, and one rule
checks them all before anything loads or is written.

A field's role (``opt(..., role="input-store")``) says what the path is to the job:

======================  ======================================================================================
``input``               a file the job reads (must exist and be a file)
``input-path``          a file or a directory the job reads (must exist)
``input-store``         an activation store (must exist, be a file and start with the HDF5 signature)
``input-run``           a run directory (must exist and hold ``run.json``)
``input-dir``           a directory the job reads (must exist and be a directory)
``output``              a file the job writes (an existing one must be a file, not an HDF5 store unless the
                        job writes stores, and not a file of a run directory)
``output-store``        an activation store the job writes or extends (an existing one must be an HDF5 store)
``output-dir``          a directory the job writes files into (an existing one must be a directory, and not a
                        run directory)
``output-run``          a run directory the job writes or resumes (an existing one must be a directory, and a
                        run directory or empty)
======================  ======================================================================================

The rule (:func:`check_paths`): no output equal to, inside, or holding an input (links resolved), no two outputs
on one path, no input given twice, every input present and of its kind, every existing output of its kind. The
command line, the Python API and every recipe step make the same call. ``contract_inputs()`` adds inputs no
role field can hold; ``exist=False`` skips the existence checks (a recipe's plan).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from memtoc.core.errors import MemtocError, OutputPathError
from memtoc.core.fileio import real_path

__all__ = ["ROLES", "INPUT_ROLES", "OUTPUT_ROLES", "PathField", "path_fields", "declared_roles", "check_paths",
           "check_plan"]

INPUT_ROLES = ("input", "input-path", "input-store", "input-run", "input-dir")
OUTPUT_ROLES = ("output", "output-store", "output-dir", "output-run")
ROLES = INPUT_ROLES + OUTPUT_ROLES
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


class PathRoleError(MemtocError):
    """An input that is missing or of the wrong kind, or an input given twice."""


class PathField:
    """One path of a config: the option's public name (for messages), its role and its path."""

    __slots__ = ("name", "role", "path", "flag")

    def __init__(self, name: str, role: str, path: str, flag: str) -> None:
        self.name, self.role, self.path, self.flag = name, role, path, flag

    def __repr__(self) -> str:
        return f"PathField({self.flag}={self.path!r}, {self.role})"


def _values(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [os.fspath(v) for v in value if v not in (None, "")]
    return [os.fspath(value)]


def path_fields(cfg: Any) -> list[PathField]:
    """Every path of ``cfg`` whose option declares a role (nested pieces included). A config whose path comes from a
    shared piece (``out`` of ``JobSettings``) names its role in ``PATH_ROLES`` (field -> role), a class attribute."""
    from memtoc.core.options import leaves

    declared = dict(getattr(type(cfg), "PATH_ROLES", {}) or {})
    out = []
    for leaf in leaves(type(cfg), cfg):
        role = declared.get(leaf.field, getattr(leaf.spec, "role", None))
        if role is None:
            continue
        if role not in ROLES:
            raise ValueError(f"{type(cfg).__name__}.{leaf.field}: unknown path role {role!r}")
        flag = leaf.spec.shown
        for p in _values(leaf.default):
            out.append(PathField(leaf.spec.public, role, p, flag))
    return out


def declared_roles(cls: type) -> dict[str, str]:
    """field -> role of every path a config class declares (its options' roles, then its ``PATH_ROLES``)."""
    from memtoc.core.options import leaves

    out = {leaf.field: leaf.spec.role for leaf in leaves(cls) if getattr(leaf.spec, "role", None)}
    out.update(getattr(cls, "PATH_ROLES", {}) or {})
    return out


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == HDF5_SIGNATURE
    except OSError:
        return False


def _check_input(f: PathField) -> None:
    p = Path(f.path).expanduser()
    if not p.exists():
        kind = ("directory" if f.role in ("input-run", "input-dir") else "file or directory"
                if f.role == "input-path" else "file")
        raise PathRoleError(f"{f.flag} {f.path}: no such {kind}")
    if f.role in ("input", "input-store") and not p.is_file():
        raise PathRoleError(f"{f.flag} {f.path} is a directory; it takes a file")
    if f.role == "input-store" and not _is_hdf5(p):
        raise PathRoleError(f"{f.flag} {f.path} is not an activation store (no HDF5 signature); give a store "
                            "written by memtoc extract")
    if f.role in ("input-run", "input-dir") and not p.is_dir():
        raise PathRoleError(f"{f.flag} {f.path} is a file; it takes a directory")
    if f.role == "input-run" and not (p / "run.json").is_file():
        raise PathRoleError(f"{f.flag} {f.path} is not a run directory (no run.json); give a directory written by "
                            "memtoc evaluate")


def _check_existing_output(f: PathField, writes_stores: bool) -> None:
    p = Path(f.path).expanduser()
    if not p.exists():
        return
    if f.role in ("output", "output-store") and p.is_dir():
        raise OutputPathError(f"{f.flag} {f.path} is a directory; it takes a file path")
    if f.role in ("output-dir", "output-run") and not p.is_dir():
        raise OutputPathError(f"{f.flag} {f.path} is a file; it takes a directory")
    if f.role == "output" and not writes_stores and _is_hdf5(p):
        raise OutputPathError(f"{f.flag} {f.path} is an activation store; writing there would destroy it, choose "
                              "another path")
    if f.role == "output-store" and p.stat().st_size and not _is_hdf5(p):
        raise OutputPathError(f"{f.flag} {f.path} exists and is not an activation store; choose another path")
    if f.role in ("output", "output-store") and p.is_file() and (p.parent / "run.json").is_file():
        raise OutputPathError(f"{f.flag} {f.path} is a file of the run directory {p.parent}; writing it would change "
                              "that run, choose a path outside runs")
    if f.role == "output-dir" and (p / "run.json").is_file():
        raise OutputPathError(f"{f.flag} {f.path} is a run directory; write this output outside runs")
    if f.role == "output-run" and any(p.iterdir()) and not (p / "run.json").is_file():
        raise OutputPathError(f"{f.flag} {f.path} exists and is not a run directory; choose an empty or new "
                              "directory")


#: filesystems of the kernel's own files: nothing a job writes belongs there
PSEUDO_FILESYSTEMS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                                "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "efivarfs"})


def filesystem_of(path: str) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing folder) lies on, from ``/proc/self/mounts``;
    None where that table cannot be read (not Linux)."""
    p = Path(os.path.realpath(os.path.expanduser(path)))
    try:
        mounts = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        if (str(p) == point or str(p).startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind


def _check_empty(cfg: Any) -> None:
    """A path option holding the empty string names no file: refused (an optional path not given is None; every
    path option whose default is the empty string is required)."""
    from memtoc.core.options import leaves

    roles = declared_roles(type(cfg))
    for leaf in leaves(type(cfg), cfg):
        if leaf.field in roles and leaf.default == "":
            flag = leaf.spec.shown
            raise PathRoleError(f"{flag} '': an empty path names no file or directory; give a path")


def check_paths(cfg: Any, *, exist: bool = True, extra_inputs: Iterable[str] = ()) -> list[PathField]:
    """The rule of the module docstring for ``cfg``; returns its path fields. Raises a one-line error."""
    from memtoc.core.fileio import check_distinct_outputs, check_output_path

    _check_empty(cfg)
    fields = path_fields(cfg)
    inputs = [f for f in fields if f.role in INPUT_ROLES]
    outputs = [f for f in fields if f.role in OUTPUT_ROLES]
    seen: dict[Path, PathField] = {}
    for f in inputs:
        real = real_path(f.path)
        if real in seen:
            raise PathRoleError(f"{f.flag} {f.path} is given twice (also {seen[real].flag} {seen[real].path}); "
                                "give each input once")
        seen[real] = f
        if exist:
            _check_input(f)
    in_paths = [f.path for f in inputs] + list(extra_inputs)
    own = getattr(cfg, "contract_inputs", None)       # inputs no role field can hold (a study's LABEL=DIR arms)
    in_paths += list(own()) if callable(own) else []
    # a file read inside a run directory makes that run an input too (its other files must not be overwritten)
    in_paths += [str(Path(p).parent) for p in list(in_paths)
                 if Path(p).is_file() and (Path(p).parent / "run.json").is_file()]
    writes_stores = any(f.role == "output-store" for f in outputs)
    for f in outputs:
        check_output_path(f.path, in_paths, flag=f.flag, output_is_dir=f.role in ("output-dir", "output-run"))
        _check_existing_output(f, writes_stores)
        kind = filesystem_of(f.path)
        if kind in PSEUDO_FILESYSTEMS:
            raise OutputPathError(f"{f.flag} {f.path} is on the kernel's {kind} filesystem, which holds no files "
                                  "a job can write; choose a path on a disk")
    check_distinct_outputs({f"{f.flag}": f.path for f in outputs} if len({f.flag for f in outputs}) == len(outputs)
                           else {f"{f.flag} ({i})": f.path for i, f in enumerate(outputs)})
    return fields


def check_plan(steps: Iterable[tuple[str, Any]]) -> None:
    """A recipe's steps together: no two steps write one path, and no step writes what an earlier step read
    or wrote as another kind (each step's own rule is :func:`check_paths` with ``exist=False``)."""
    written: dict[Path, str] = {}
    for name, cfg in steps:
        fields = check_paths(cfg, exist=False)
        for f in fields:
            if f.role not in OUTPUT_ROLES:
                continue
            real = real_path(f.path)
            if real in written:
                raise OutputPathError(f"step {name}: {f.flag} {f.path} is also written by step {written[real]}; "
                                      "each step needs its own output")
            written[real] = name
