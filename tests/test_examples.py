"""Every README and docs snippet: command lines parse with the CLI's own parser, Python blocks compile and name
what exists; the README's Python snippet and command lines run as written on the embedded default model (the
quickstart notebook: tests/test_quickstart_notebook.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# -- every README / docs snippet -------------------------------------------------------------------------------
# Tier 1 (every block, fast): each ``memtoc ...`` command line of every fenced block parses with the CLI's own parser
# (a renamed option, subcommand or value fails here), and each Python block compiles and every name it imports from
# this checkout (and every ``mt.NAME``) exists. Tier 2 (real model): the README's Python snippet runs as written,
# with assertions on what it returns; the notebook above runs top to bottom with its own assertions.

import ast  # noqa: E402
import importlib  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402

DOCS = [REPO / "README.md", REPO / "experiments" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.S | re.M)
_TITLE = re.compile(r'title="([^"]+)\.py"')
#: placeholders the docs use for "your value" that are not parseable values
_PLACEHOLDER_TOKENS = {"...", "…"}
OUR_PACKAGES = ("memtoc", "activations", "probes", "steering")


def doc_blocks() -> list[tuple[str, int, str, str]]:
    """(file, first line, language, text) of every fenced block of the README and docs."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2
            out.append((str(path.relative_to(REPO)), line, m.group(1) or "", m.group(3)))
    return out


def memtoc_command_lines(block: str) -> list[tuple[int, list[str]]]:
    """(offset, argv) of every ``memtoc`` command of a shell block (continuations joined, comments dropped)."""
    joined, start, cmds = "", 0, []
    for i, raw in enumerate(block.splitlines() + [""]):
        if not joined:
            start = i
        joined += raw[:-1] + " " if raw.rstrip().endswith("\\") else raw
        if raw.rstrip().endswith("\\"):
            continue
        line = joined.strip().removeprefix("$ ")
        joined = ""
        if not line.startswith("memtoc "):
            continue
        argv = shlex.split(line, comments=True)[1:]
        if any(a.startswith("[--") for a in argv):   # a synopsis: every optional part given, first alternative
            argv = [a.strip("[]").split("|")[0] for a in argv]
        cmds.append((start, [a for a in argv if a not in _PLACEHOLDER_TOKENS]))
    return cmds


def _shell_blocks():
    return [(f, ln, text) for f, ln, lang, text in doc_blocks() if lang in ("", "bash", "sh", "console")]


def _python_blocks():
    return [(f, ln, text) for f, ln, lang, text in doc_blocks() if lang == "python"]


def test_every_documented_memtoc_command_parses(capsys) -> None:
    from memtoc.cli.parse import parse_config
    from memtoc.core.errors import MemtocError

    n, bad = 0, []
    for f, ln, text in _shell_blocks():
        for off, argv in memtoc_command_lines(text):
            n += 1
            try:
                parse_config(argv)
            except (SystemExit, MemtocError) as exc:
                err = capsys.readouterr().err.strip().splitlines() or [str(exc)]
                bad.append(f"{f}:{ln + off}: memtoc {' '.join(argv)}\n    {err[-1] if err else ''}")
    assert n >= 60, f"only {n} documented commands found: is the block parser broken?"
    assert bad == [], "documented commands that no longer parse:\n" + "\n".join(bad)


def _imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OUR_PACKAGES:
            out += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] in OUR_PACKAGES]
    return out


def _modules_the_docs_create() -> set[str]:
    """Modules a doc writes out itself (a block titled ``title="steering/kinds/scale.py"``): imports of them are the
    reader's new code, not this checkout's."""
    out = set()
    for path in DOCS:
        out |= {t.replace("/", ".").removesuffix(".__init__") for t in _TITLE.findall(path.read_text("utf-8"))}
    return out


def test_every_documented_python_snippet_compiles_and_names_what_exists() -> None:
    import memtoc as mt

    created = _modules_the_docs_create()
    blocks = _python_blocks()
    assert len(blocks) >= 8
    bad = []
    for f, ln, text in blocks:
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            bad.append(f"{f}:{ln + (exc.lineno or 1) - 1}: {exc.msg}")
            continue
        for module, name in _imports(tree):
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                bad.append(f"{f}:{ln}: import {module}: {exc}")
                continue
            if name is not None and not hasattr(mod, name) and f"{module}.{name}" not in created:
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    bad.append(f"{f}:{ln}: {module} has no {name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mt":
                if node.attr not in mt.API_NAMES:
                    bad.append(f"{f}:{ln}: mt.{node.attr} is not an API name")
    assert bad == [], "\n".join(bad)


def test_snippet_count_is_reported() -> None:
    """The numbers the docs note (docs/api.md, 'Examples that run') are the numbers found here."""
    n_cmd = sum(len(memtoc_command_lines(t)) for _, _, t in _shell_blocks())
    n_py = len(_python_blocks())
    note = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    m = re.search(r"(\d+) documented `memtoc` commands.*?(\d+) Python snippets", note, re.S)
    assert m, "docs/api.md must state the counts of documented commands and Python snippets"
    assert (int(m.group(1)), int(m.group(2))) == (n_cmd, n_py)


def _readme_python() -> str:
    blocks = [t for f, _, t in _python_blocks() if f == "README.md"]
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.real_model
def test_the_readme_python_snippet_runs_as_written(tmp_path, monkeypatch, default_model) -> None:

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import runpy

    snippet = tmp_path / "readme_snippet.py"          # a file, so a function edit's source can be read and hashed
    snippet.write_text(_readme_python(), encoding="utf-8")
    scope = runpy.run_path(str(snippet))               # the documented snippet itself
    run, acts, edited = scope["run"], scope["acts"], scope["edited"]
    assert len(run.metrics.to_pandas().dropna(subset=["value"])) > 0
    x = acts.read(15, positions="last_input", xarray=True)
    assert x.shape[0] > 0 and x.shape[1] == acts.d_model
    probe = scope["mt"].probe(acts, label="condition", positive="tool_wrong", negative="tool_right")
    assert len(probe.to_pandas()) == len(acts.layers)
    assert len(scope["mt"].compare(run, edited).to_pandas()) > 0
    t = scope.get("t")
    if t is not None:
        assert t.names and t.logits.ndim == 3


# -- the README's command lines run as written -----------------------------------------------------------------
# Tier 3 (slow, the default model): every ``memtoc`` line of the README's shell blocks runs in order in one working
# directory, except a line marked ``# full size`` (the whole-benchmark command beside its quick form: parsed above,
# not run). Each line states its time in its comment ("about ..."); the times printed here are what the README shows.

_FULL_SIZE = re.compile(r"#.*\bfull size\b")
_TIME = re.compile(r"#.*\babout [0-9][^#]*\b(s|min|h|hours?)\b|#.*\bhours\b|#.*\bnot timed here\b")


def readme_command_lines() -> list[tuple[str, list[str], bool]]:
    """(the line as written, argv, full size?) of every ``memtoc`` line of the README's shell blocks, in order."""
    out = []
    for f, _, text in _shell_blocks():
        if f != "README.md":
            continue
        joined = ""
        for raw in text.splitlines():
            joined += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw
            if raw.rstrip().endswith("\\"):
                continue
            line, joined = joined.strip(), ""
            if line.startswith("memtoc "):
                out.append((line, shlex.split(line, comments=True)[1:], bool(_FULL_SIZE.search(line))))
    return out


def test_every_readme_command_states_its_time_and_the_quick_ones_are_small() -> None:
    lines = readme_command_lines()
    assert len(lines) >= 20
    untimed = [line for line, _, _ in lines if not _TIME.search(line)]
    assert untimed == [], "README commands without their time ('# ... about N s|min'):\n" + "\n".join(untimed)
    # a quick line that evaluates or extracts over the demo set says how few questions (or reads a quick corpus)
    heavy = [line for line, argv, full in lines if not full and argv[0] in ("evaluate", "extract", "sweep")
             and "--limit" not in argv]
    assert heavy == [], "\n".join(heavy)


@pytest.mark.slow
@pytest.mark.real_model
def test_every_readme_command_runs_as_written(tmp_path, monkeypatch, capsys, default_model) -> None:
    import time

    from memtoc.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    times = []
    for line, argv, full in readme_command_lines():
        if full or argv[0] == "serve":      # a server runs until stopped (tests/memtoc/jobs/test_serve.py)
            continue
        t0 = time.perf_counter()
        rc = main(argv)
        times.append((time.perf_counter() - t0, line))
        err = capsys.readouterr().err
        assert rc == 0, f"{line}\n{err[-2000:]}"
    with capsys.disabled():
        for dt, line in times:
            print(f"README {dt:7.1f} s  {line}")
    assert (tmp_path / "runs" / "demo" / "report.html").exists() and (tmp_path / "patch").is_dir()
    assert list((tmp_path / "features").glob("*.html"))


@pytest.mark.slow
@pytest.mark.real_model
def test_the_readme_chain_as_a_newcomer_runs_it(tmp_path, default_model) -> None:
    """A fresh clone, ``make demo`` interrupted first, then every quick README line typed into a shell as the README
    says (the project's environment activated): each exits 0, and the interrupted full-size run never mixes with
    the quick chain's folders."""
    import signal
    import subprocess
    import sys
    import time


    venv = Path(sys.executable).parent.parent
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    (clone / ".venv").symlink_to(venv)                       # `make demo`'s install, already made
    os.utime(clone / "pyproject.toml", (0, 0))               # older than the install: make does not redo it
    (clone / ".venv" / ".memtoc-installed").exists() or pytest.skip("the environment was not made by make setup")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(clone), TMPDIR=str(tmp_path))
    demo = subprocess.Popen(["make", "-s", "demo"], cwd=clone, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(45)                                           # the model loaded, some episodes scored
    os.killpg(demo.pid, signal.SIGINT)
    demo.wait(timeout=120)
    times = []
    for line, _, full in readme_command_lines():
        if full or line.split()[1] == "serve":
            continue
        cmd = line.split("#", 1)[0]
        t0 = time.perf_counter()
        done = subprocess.run(["bash", "-c", f"source .venv/bin/activate && {cmd}"], cwd=clone, env=env,
                              capture_output=True, text=True)
        times.append((time.perf_counter() - t0, os.getloadavg()[0], line))
        assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
    print("\n".join(f"README {dt:7.1f} s  load {ld:4.1f}  {line}" for dt, ld, line in times))
    demo_run = clone / "runs" / "demo"
    run_json = json.loads((demo_run / "run.json").read_text(encoding="utf-8"))
    assert run_json["config"]["limit"] == 4
    records = [json.loads(x) for x in (demo_run / "episodes.jsonl").read_text(encoding="utf-8").splitlines() if x]
    assert len({r["question_id"] for r in records}) <= 4
