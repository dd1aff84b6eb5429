"""Where a result came from: the toolkit's git revision, recorded in every run directory and activation store."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import memtoc


def git_revision() -> dict[str, Any]:
    root = Path(memtoc.__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        if rev.returncode == 0:
            return {"commit": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None}
