"""How many memtoc modules a command crosses before its job body runs (issue 45's "modules from `memtoc <job>` to
the job body").

A ``sys.setprofile`` walk of ``memtoc.cli.main([...])``: every Python function called from the command line's entry
until the job's run function (``memtoc.jobs.extract:run_extract`` by default) is entered is recorded by its module;
the job's run function is replaced by a stub that stops the walk, so no model loads. Printed: the chain of memtoc
modules on the stack when the job body is entered, and every memtoc module whose functions ran on the way (less
the job's own module and the modules only imported: their ``<module>`` code is not counted).

    PYTHONPATH=$PWD python benchmarks/walk_cli.py                      # memtoc extract --out /tmp/x.h5 --limit 1
    PYTHONPATH=$PWD python benchmarks/walk_cli.py --job memtoc.jobs.evaluate:run_evaluate evaluate --out /tmp/r
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path


class _Reached(Exception):
    """Raised by the stub job body: the walk is over."""


def walk(argv: list[str], job: str) -> tuple[list[str], list[str]]:
    """(stack chain, modules that ran) from ``memtoc ARGV`` until ``job`` (``module:function``) is entered."""
    module_name, _, fn_name = job.partition(":")
    module = importlib.import_module(module_name)
    chain: list[str] = []

    def stub(*args: object, **kw: object) -> None:
        frame = sys._getframe(1)  # noqa: SLF001 - the caller's frames are the walk's result
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("memtoc") and (not chain or chain[-1] != name):
                chain.append(name)
            frame = frame.f_back
        raise _Reached

    setattr(module, fn_name, stub)
    ran: set[str] = set()

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event == "call" and frame.f_code.co_name != "<module>":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("memtoc"):
                ran.add(name)

    from memtoc.cli import main

    sys.setprofile(profile)
    try:
        main(argv)
    except _Reached:
        pass
    except SystemExit as e:
        sys.setprofile(None)
        raise SystemExit(f"the command stopped before the job body (exit {e.code})") from None
    finally:
        sys.setprofile(None)
    if not chain:
        raise SystemExit(f"{job} was not reached")
    ran.discard(module_name)
    ran.discard(__name__)
    return list(reversed(chain)), sorted(ran)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", default="memtoc.jobs.extract:run_extract", help="module:function of the job body")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="the memtoc command line (default: an extract)")
    a = p.parse_args()
    argv = a.argv or ["extract", "--out", str(Path(tempfile.mkdtemp()) / "walk.h5"), "--limit", "1"]
    chain, ran = walk(argv, a.job)
    print(f"memtoc {' '.join(argv)}")
    print(f"stack at the job body ({len(set(chain))} distinct modules): {' -> '.join(chain)}")
    print(f"memtoc modules whose functions ran before the job body: {len(ran)}")
    for name in ran:
        print(f"  {name}")


if __name__ == "__main__":
    main()
