"""The README's commands, typed in the checkout's root, leave no untracked files there: every path they write
(``--out``, ``--sheet`` and the files written beside them; ``run-experiment``'s default folder) is ignored by
git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """Every ``memtoc`` command line of the README's bash blocks (continuation lines joined, comments cut)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if re.match(r"(\S*/)?memtoc ", line):
                lines.append(line)
    lines += re.findall(r"`((?:\S*/)?memtoc [^`]*)`", text)      # inline ones (the table of more commands)
    return lines


def written_paths(line: str) -> list[str]:
    """The paths one command writes: its ``--out`` / ``--sheet`` value, with the files a job writes beside them
    (the lens fit's ``OUT.partial``, the sheet's ``.key.json``)."""
    words = line.split()
    out = []
    for flag in ("--out", "--sheet"):
        value = words[words.index(flag) + 1] if flag in words else ""
        if value and not re.search(r"[A-Z]{2}", value):    # MERGED, M.h5: placeholders, not paths
            out.append(value)
    if " lens fit " in f" {line} " and out:
        out.append(out[0] + ".partial")
    if "--sheet" in words:
        out.append(str(Path(out[0]).with_suffix(".key.json")))
    return out


def test_the_readme_commands_are_found() -> None:
    lines = readme_commands()
    assert any("memtoc direction" in x for x in lines) and any("memtoc lens fit" in x for x in lines)
    assert "dir.json" in written_paths(next(x for x in lines if "memtoc direction" in x))


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_every_path_the_readme_writes_is_ignored_by_git() -> None:
    paths = sorted({p for line in readme_commands() for p in written_paths(line)} | {"experiments_out/"})
    assert len(paths) > 10
    # a folder's output is checked through a file inside it (a folder pattern ignores its files)
    probes = [p.rstrip("/") + "/x" if p.endswith("/") or "." not in Path(p).name else p for p in paths]
    res = subprocess.run(["git", "check-ignore", "--no-index", *probes], cwd=REPO, capture_output=True, text=True)
    ignored = set(res.stdout.split())
    assert [p for p in probes if p not in ignored] == []
