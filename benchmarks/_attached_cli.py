"""``memtoc ARGS`` run once a tracer has attached: the imports first, untraced, then the command, traced.

Used by ``fault_inject_store.py``: under ptrace every system call of the traced thread stops, and importing torch
and transformers makes most of a short job's calls (a traced job took 31 s instead of 8). The runner starts this
process, waits for its ``ready`` line, attaches ``strace -p``, and the command starts once ``TracerPid`` is set,
so the listed calls and the injected ones count from the same point: the command's first call.
"""

from __future__ import annotations

import sys
import time


def _traced() -> bool:
    with open("/proc/self/status", encoding="ascii") as f:
        return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in f)


def main() -> int:
    import torch  # noqa: F401  - what the command would import, loaded before the tracer attaches
    import transformers  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    from memtoc.cli import main as cli
    import memtoc.backends.hf  # noqa: F401
    import memtoc.jobs.extract  # noqa: F401
    import memtoc.jobs.merge  # noqa: F401

    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not _traced():
        if time.monotonic() > deadline:
            print("no tracer attached within 60 s", file=sys.stderr)
            return 3
        time.sleep(0.01)
    time.sleep(0.2)          # the tracer's first stop lands in this sleep, before the command's first call
    return int(cli(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
