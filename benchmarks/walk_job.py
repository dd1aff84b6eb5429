"""Walk a job's body: which library files its data passes through, and how often control climbs back up.

Runs ``memtoc extract`` (the command line, ``memtoc.cli.main``) on a tiny random Llama (3 blocks, the demo
benchmark, ``--limit 2 --batch-size 1``: two batches) under ``sys.setprofile`` and reduces every Python call and
return to a walk over the *library files*: the ``.py`` files of ``memtoc/``, ``activations/``, ``probes/`` and
``steering/`` in this checkout. Frames of any other file (the standard library, torch, h5py, tqdm) are
transparent: a library frame called through them counts as called by the library frame below them. A module's
first import (its ``<module>`` frame and everything under it) is not a step of the job and is skipped.

The walk starts when the job body (``memtoc.jobs.extract.extract``) is entered and ends when it returns. A
frame's *depth* is the number of file changes between it and the job body (the job body's file is depth 0, a
file it calls is depth 1).

- **files** (the files the data passes through): the distinct library files at depth 0 or 1: the job body's
  file and every file whose code it calls (a function, a method or property of an object it holds). A file
  reached only deeper is the inside of a library function the reader already counted.
- **climbs**: the returns from one *steering* file to another (the job layer ``memtoc/jobs/``, the families
  ``memtoc/tasks/`` and their registry ``memtoc/core/tasks.py``) after which the file returned to calls into
  any library file again before it returns itself, at any depth. That is control handed back up from a family's
  hook to the generic code that steers the job (or to a family file that steers a helper), which then goes
  down again; a job body that calls library functions in turn and gets their answers back has none, and a
  library function composing its own helpers (the store and its journal) is not steering.

Calls per batch appear once per batch, so a climb inside the batch loop counts twice here.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/walk_job.py            # the figures and the files
    PYTHONPATH=$PWD .venv/bin/python benchmarks/walk_job.py --tree     # also the calls to depth 2 and each climb
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LIBRARY = tuple(str(REPO / d) + "/" for d in ("memtoc", "activations", "probes", "steering"))
JOB_FILE = str(REPO / "memtoc" / "jobs" / "extract.py")
JOB_FUNC = "extract"


STEERING = tuple(str(REPO / d) + "/" for d in ("memtoc/jobs", "memtoc/tasks")) + (str(REPO / "memtoc/core/tasks.py"),)


def _steers(path: str) -> bool:
    """A file that steers a job: the job layer, the task families and their registry."""
    return path.startswith(STEERING)


def _rel(path: str) -> str:
    return path[len(str(REPO)) + 1:]


class Walk:
    """The profile hook: a stack of library files (one entry per library frame) from the job body down."""

    def __init__(self) -> None:
        self.stack: list[str] = []          # library file of each open library frame under the job body
        self.frames: list[int] = []          # id() of those frames, to pair returns with calls
        self.active = False
        self.importing = None                # the module frame being imported, while one is
        self.files: dict[str, int] = {}      # file -> the shallowest file depth it was entered at
        self.edges: list[tuple[int, str, str]] = []   # (depth of the callee, caller file, callee file)
        self.climbs: list[tuple[str, str, str]] = []  # (middle file, returned from, called next)
        self._returned: dict[str, str] = {}  # middle file -> the depth-2 file it last got a return from

    def depth_of(self, i: int) -> int:
        """File depth of stack entry ``i``: how many file changes lie between it and the job body."""
        d = 0
        for a, b in zip(self.stack[:i], self.stack[1:i + 1]):
            d += a != b
        return d

    def __call__(self, frame, event, arg) -> None:
        if event not in ("call", "return"):
            return
        if self.importing is not None:       # a module's first import runs its body: not a step of the job
            if event == "return" and frame is self.importing:
                self.importing = None
            return
        if self.active and event == "call" and frame.f_code.co_name == "<module>":
            self.importing = frame
            return
        path = frame.f_code.co_filename
        if not path.startswith(LIBRARY):
            return
        if not self.active:
            if event == "call" and path == JOB_FILE and frame.f_code.co_name == JOB_FUNC:
                self.active = True
                self.stack, self.frames = [path], [id(frame)]
                self.files[_rel(path)] = 0
            return
        if event == "call":
            caller = self.stack[-1]
            self.stack.append(path)
            self.frames.append(id(frame))
            if path != caller:
                depth = self.depth_of(len(self.stack) - 1)
                if depth <= 2:
                    self.edges.append((depth, _rel(caller), _rel(path)))
                if depth <= 1:
                    self.files[_rel(path)] = depth
                if _steers(caller) and caller in self._returned:
                    self.climbs.append((_rel(caller), _rel(self._returned.pop(caller)), _rel(path)))
            return
        if not self.frames or self.frames[-1] != id(frame):
            return                          # a frame entered before the walk began
        depth = self.depth_of(len(self.stack) - 1)
        callee = self.stack.pop()
        self.frames.pop()
        if not self.stack:
            self.active = False
            return
        caller = self.stack[-1]
        if callee != caller and _steers(callee) and _steers(caller):
            self._returned[caller] = callee
        self._returned.pop(callee, None) if callee != caller else None


def walk_extract(workdir: Path) -> Walk:
    """Run ``memtoc extract`` on a tiny model built in ``workdir`` under the walk's profile hook."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import build_tiny_model

    from memtoc.cli import main

    model = build_tiny_model(workdir / "tiny")
    args = ["extract", "--model", str(model), "--conditions", "tool_wrong", "--limit", "2", "--batch-size", "1",
            "--layers", "0,2", "--position-kinds", "last_input,tool_span", "--device", "cpu", "--dtype", "float32",
            "--out", str(workdir / "acts.h5"), "--no-progress"]
    walk = Walk()
    sys.setprofile(walk)
    try:
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            rc = main(args)
    finally:
        sys.setprofile(None)
    if rc != 0:
        raise SystemExit(f"memtoc extract exited {rc}")
    return walk


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="store_true", help="print the depth-1 and depth-2 calls and every climb")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        walk = walk_extract(Path(tmp))
    if args.tree:
        seen = set()
        for depth, caller, callee in walk.edges:
            if (caller, callee) not in seen:
                seen.add((caller, callee))
                print(f"{'  ' * depth}{caller} -> {callee}")
        for middle, came, went in walk.climbs:
            print(f"climb: {came} -> {middle} -> {went}")
    print(f"memtoc extract: {len(walk.files)} files, {len(walk.climbs)} climbs")
    for f, d in sorted(walk.files.items(), key=lambda kv: (kv[1], kv[0])):
        print(f"  depth {d}: {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
