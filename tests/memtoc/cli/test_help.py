"""``memtoc --help`` and ``memtoc JOB --help`` are light: the command line adds a command's options only when that
command is parsed, so the root help imports no job, a job's help imports its own config module only, and no
command's help imports torch, h5py or transformers (job bodies import them; config modules never do)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

#: what no command's help may import: config modules stay free of the model and store libraries
HEAVY = ("torch", "h5py", "transformers")

_SCRIPT = """
import contextlib, io, json, sys
from memtoc.cli import main

def help_of(words):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*words, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, (words, exc.code)
    return out.getvalue()

report = {}
root = help_of([])
report["root_help_lists_extract"] = "extract" in root
report["after_root"] = sorted(m for m in ("torch", "h5py", "memtoc.jobs.extract", "memtoc.jobs.compare")
                              if m in sys.modules)
compare = help_of(["compare"])
report["compare_help_lists_its_options"] = "--score-layer" in compare
report["after_compare"] = sorted(m for m in ("torch", "memtoc.jobs.extract", "memtoc.jobs.compare")
                                 if m in sys.modules)
report["heavy_after"] = {}              # heavy module -> the first command whose help imported it
for words in json.loads(sys.argv[1]):
    text = help_of(words)
    assert "usage:" in text, (words, text[:200])
    for mod in json.loads(sys.argv[2]):
        if mod in sys.modules:
            report["heavy_after"].setdefault(mod, " ".join(words))
print(json.dumps(report))
"""


def _run(commands: list[list[str]]) -> dict:
    r = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(commands), json.dumps(HEAVY)], capture_output=True,
                       text=True, cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_help_imports_no_torch_and_no_other_job() -> None:
    import memtoc.jobs.catalog  # noqa: F401 - fills the registry
    from memtoc.jobs.registry import JOBS

    assert len(JOBS) > 30 and "extract" in JOBS and "finetune crossfit" in JOBS
    report = _run([name.split() for name in JOBS])
    assert report["root_help_lists_extract"] and report["compare_help_lists_its_options"]
    assert report["after_root"] == []                       # no job, no torch, no h5py for the list of commands
    assert report["after_compare"] == ["memtoc.jobs.compare"]   # its own config only
    assert report["heavy_after"] == {}    # every command's help, one after another, in one process


def test_version_prints_the_package_version() -> None:
    import memtoc

    done = subprocess.run([sys.executable, "-m", "memtoc.cli", "--version"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == f"memtoc {memtoc.__version__}"


def test_no_help_shows_a_placeholder_for_a_required_value() -> None:
    """A field without a default (a required positional) shows no "(default: ...)" at all."""
    import contextlib
    import io

    from memtoc.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(["judge", "--help"])
        except SystemExit as exc:
            assert exc.code == 0
    assert "RUN_DIR" in out.getvalue() and "MISSING" not in out.getvalue()


def test_a_commands_help_lists_each_piece_and_no_switch_default() -> None:
    """tyro lays out ``memtoc evaluate --help``: a section per config piece, headed by the piece's docstring; a switch
    shows no "(default: False)" and an option its config's default."""
    import contextlib
    import io

    from memtoc.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main(["evaluate", "--help"])
        except SystemExit as exc:
            assert exc.code == 0
    text = " ".join(out.getvalue().split())
    assert "--stop-at-final" in text and "--generate-to-budget" in text and "--no-progress" in text
    assert "(default: False)" not in text and "(default: True)" not in text
    assert "Which MemToC episodes a job runs" in text and "--limit INT" in text and "(default: demo)" in text
