"""Readers never write: ``compare``, ``merge``, ``metrics``, ``report`` and ``score`` leave their input run
directories byte-identical, with and without a torn last line, and work on a read-only mount.

Two independent guards, because we run as root (permission bits do not stop root):

- an audit hook (``sys.addaudithook``) in the command's process that kills it the moment anything opens a
  file under the inputs for writing, renames, truncates, removes or creates anything there;
- a real read-only bind mount of the inputs in a private mount namespace (``unshare -m``), where any write
  fails with ``EROFS`` (skipped where the kernel does not let us make one).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memtoc.tasks.memtoc.evaluate import EvaluationConfig, evaluate

REPO = Path(__file__).resolve().parents[3]

GUARD = r'''
import os, sys
ROOTS = [os.path.realpath(p) for p in sys.argv[1].split(os.pathsep)]
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

def _path(p):
    if isinstance(p, int):
        try:
            return os.readlink(f"/proc/self/fd/{p}")
        except OSError:
            return None
    try:
        return os.path.realpath(os.fsdecode(p))
    except Exception:
        return None

def _inside(p):
    p = _path(p)
    return p is not None and any(p == r or p.startswith(r + os.sep) for r in ROOTS)

def _die(what, p):
    os.write(2, f"GUARD: write attempt under the inputs: {what} {p!r}\n".encode())
    os._exit(99)

def hook(event, args):
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        if path is None:
            return
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                 (isinstance(flags, int) and flags & WRITE)
        if writes and _inside(path):
            _die(event, path)
    elif event in ("os.rename", "os.replace", "os.link", "os.symlink"):
        for p in args[:2]:
            if _inside(p):
                _die(event, p)
    elif event in ("os.remove", "os.rmdir", "os.truncate", "os.mkdir", "os.chmod", "os.chown", "os.utime",
                   "shutil.rmtree", "os.chflags", "os.setxattr", "os.removexattr"):
        if args and _inside(args[0]):
            _die(event, args[0])

if ROOTS != ["-"]:
    sys.addaudithook(hook)
import contextlib, io, json
from memtoc.cli import main
results = {}
for name, argv in json.loads(open(sys.argv[2]).read()).items():   # every command in one process: one import
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    results[name] = {"rc": rc, "stderr": err.getvalue()}
print(json.dumps(results))
'''


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right", limit=2, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return EvaluationConfig(**base)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_backend, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("readers")
    log = lambda s: None  # noqa: E731
    evaluate(_cfg(tiny_model_dir, root / "one"), backend=tiny_backend, log=log)
    evaluate(_cfg(tiny_model_dir, root / "a", conditions="tool_wrong"), backend=tiny_backend, log=log)
    evaluate(_cfg(tiny_model_dir, root / "b", conditions="tool_right"), backend=tiny_backend, log=log)
    return root


def tear(run: Path) -> None:
    """What a kill mid-append leaves: half a record after the last newline, and run.json still 'running'."""
    eps = run / "episodes.jsonl"
    line = eps.read_text(encoding="utf-8").splitlines()[0]
    with eps.open("a", encoding="utf-8") as fh:
        fh.write(line[: len(line) // 2])
    info = json.loads((run / "run.json").read_text(encoding="utf-8"))
    (run / "run.json").write_text(json.dumps({**info, "status": "running"}), encoding="utf-8")


def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with the sha256 of its bytes (directories: 'dir')."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _inputs(runs: Path, dst: Path, torn: bool) -> Path:
    inp = dst / "inputs"
    for name in ("one", "a", "b"):
        shutil.copytree(runs / name, inp / name)
        if torn:
            tear(inp / name)
    return inp


def _commands(inp: Path, out: Path) -> dict[str, list[str]]:
    return {
        "compare": ["compare", str(inp / "one"), str(inp / "a"), "--output", str(out / "cmp.json")],
        "merge": ["merge", str(inp / "a"), str(inp / "b"), "--out", str(out / "merged")],
        "metrics-file": ["metrics", "--input", str(inp / "one" / "episodes.jsonl"), "--n-boot", "50",
                         "--output", str(out / "m.json")],
        "metrics-dir": ["metrics", "--input", str(inp / "one"), "--n-boot", "50"],
        "report": ["report", str(inp), "--out", str(out / "report")],
        "report-run": ["report", str(inp / "one"), "--out", str(out / "report-one")],
        "score": ["score", "--input", str(inp / "one" / "episodes.jsonl"), "--output", str(out / "s.jsonl")],
    }


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "MPLBACKEND": "Agg"}


def _script(tmp: Path, commands: dict[str, list[str]]) -> tuple[Path, Path]:
    script, cmds = tmp / "guard.py", tmp / "commands.json"
    script.write_text(GUARD, encoding="utf-8")
    cmds.write_text(json.dumps(commands), encoding="utf-8")
    return script, cmds


def _guarded(inp: Path, commands: dict[str, list[str]], tmp: Path) -> subprocess.CompletedProcess:
    script, cmds = _script(tmp, commands)
    return subprocess.run([sys.executable, str(script), str(inp), str(cmds)], capture_output=True, text=True,
                          env=_env(), cwd=tmp)


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_readers_leave_inputs_byte_identical(runs, tmp_path, torn):
    inp = _inputs(runs, tmp_path, torn)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(inp)
    res = _guarded(inp, _commands(inp, out), tmp_path)
    assert "GUARD" not in res.stderr and res.returncode == 0, res.stderr
    assert snapshot(inp) == before
    results = json.loads(res.stdout.splitlines()[-1])
    assert set(results) == set(_commands(inp, out))
    for name, r in results.items():
        assert r["rc"] == 0, (name, r["stderr"])
        if torn:
            assert "interrupted" in r["stderr"] and "torn" in r["stderr"], (name, r["stderr"])
        else:
            assert "warning" not in r["stderr"], (name, r["stderr"])
    merged = json.loads((out / "merged" / "run.json").read_text())
    assert merged["status"] == ("partial" if torn else "complete")
    whole = [json.loads(l) for l in (runs / "a" / "episodes.jsonl").read_text().splitlines()] + \
            [json.loads(l) for l in (runs / "b" / "episodes.jsonl").read_text().splitlines()]
    got = [json.loads(l) for l in (out / "merged" / "episodes.jsonl").read_text().splitlines()]
    assert sorted(r["episode_id"] for r in got) == sorted(r["episode_id"] for r in whole)  # torn half: not a record
    if torn:
        html = (out / "report-one" / "report.html").read_text(encoding="utf-8")
        md = (out / "report-one" / "report.md").read_text(encoding="utf-8")
        assert 'class="warn"' in html and "interrupted" in html
        assert "> **Warning:**" in md and "interrupted" in md


def test_guard_catches_a_write(runs, tmp_path):
    """The audit-hook guard itself can fail: evaluate (a writer) on a guarded run directory is stopped."""
    inp = _inputs(runs, tmp_path, torn=True)
    res = _guarded(inp, {"score": ["score", "--input", str(inp / "one" / "episodes.jsonl"),
                                   "--output", str(inp / "one" / "scored.jsonl")]}, tmp_path)
    assert res.returncode == 99 and "GUARD" in res.stderr


def _can_mount_readonly(tmp: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    d = tmp / "probe"
    d.mkdir()
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {d} {d} && mount -o remount,bind,ro {d} {d} "
                        f"&& ! touch {d}/x 2>/dev/null"], capture_output=True)
    return r.returncode == 0 and not (d / "x").exists()


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_readers_work_on_a_readonly_mount(runs, tmp_path, torn):
    if not _can_mount_readonly(tmp_path):
        pytest.skip("no private read-only bind mount here (needs unshare -m)")
    inp = _inputs(runs, tmp_path, torn)
    subprocess.run(["chmod", "-R", "a-w", str(inp)], check=True)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(inp)
    script, cmds = _script(tmp_path, _commands(inp, out))
    try:
        cmd = " ".join(["mount --bind", str(inp), str(inp), "&& mount -o remount,bind,ro", str(inp), str(inp),
                        "&& touch", str(inp / "x"), "2>/dev/null || exec", sys.executable, str(script), "-",
                        str(cmds)])
        res = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, env=_env(),
                             cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        results = json.loads(res.stdout.splitlines()[-1])
        assert set(results) == set(_commands(inp, out))
        for name, r in results.items():
            assert r["rc"] == 0, (name, r["stderr"])
            assert "Read-only" not in r["stderr"] and "Traceback" not in r["stderr"], (name, r["stderr"])
        assert snapshot(inp) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(inp)], check=True)


def test_evaluate_is_the_one_that_repairs(runs, tmp_path, tiny_backend, tiny_model_dir):
    """Resuming with evaluate cuts the torn line off and finishes the run; readers then see it complete."""
    from memtoc.runs.runstore import RunStore

    inp = _inputs(runs, tmp_path, torn=True)
    torn_bytes = (inp / "one" / "episodes.jsonl").read_bytes()
    store = RunStore.read(inp / "one", warn=None)
    assert store.state.state == "interrupted" and store.state.torn == ["episodes.jsonl"]
    evaluate(_cfg(tiny_model_dir, inp / "one"), backend=tiny_backend, log=lambda s: None)
    fixed = (inp / "one" / "episodes.jsonl").read_bytes()
    assert fixed == (runs / "one" / "episodes.jsonl").read_bytes() and fixed != torn_bytes
    again = RunStore.read(inp / "one", warn=None)
    assert again.state.state == "complete" and again.state.warnings() == []
