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

from memtoc.jobs.evaluate import evaluate
from memtoc.core.values import build_config
from memtoc.tasks.memtoc.evaluation import EvaluationConfig

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
    return build_config(EvaluationConfig, base)


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
        "compare": ["compare", str(inp / "one"), str(inp / "a"), "--out", str(out / "cmp.json")],
        "merge": ["merge", str(inp / "a"), str(inp / "b"), "--out", str(out / "merged")],
        "metrics-file": ["metrics", "--input", str(inp / "one" / "episodes.jsonl"), "--n-boot", "50",
                         "--out", str(out / "m.json")],
        "metrics-dir": ["metrics", "--input", str(inp / "one"), "--n-boot", "50"],
        "report": ["report", str(inp), "--out", str(out / "report")],
        "report-run": ["report", str(inp / "one"), "--out", str(out / "report-one")],
        "score": ["score", "--input", str(inp / "one" / "episodes.jsonl"), "--out", str(out / "s.jsonl")],
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
            # no warning about the files; compare's own note on the arms' differing settings is not one
            stderr = "\n".join(x for x in r["stderr"].splitlines() if "differ in generation / selection" not in x)
            assert "warning" not in stderr, (name, r["stderr"])
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
    """The audit-hook guard itself can fail: a writer told to write under the guarded inputs is stopped
    (``episodes`` reads no run, so the one output rule has nothing to refuse and the write is attempted)."""
    inp = _inputs(runs, tmp_path, torn=True)
    res = _guarded(inp, {"episodes": ["episodes", "--benchmark", "demo", "--limit", "1",
                                      "--out", str(inp / "one" / "eps.jsonl")]}, tmp_path)
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


# -- the one output rule: no command writes onto its inputs, into an input run directory or outside
# the directory it was given; each case destroyed a run or release file before (checked by sha256)

def _tiny_release(root: Path) -> Path:
    """A release checkout of one model x formulation, in the layout verify-release reads."""
    folder = root / "results" / "scored_episodes"
    folder.mkdir(parents=True)
    recs = [{"episode_id": f"{i}-0-tool_error-v0", "condition": "tool_error", "cell": "arb", "outcome": "neither",
             "followed_tool": False, "abstain": i % 2 == 0} for i in range(4)]
    (folder / "gemma-2-9b-it_reference.json").write_text(json.dumps({"aggregate_v1": {}, "scored": recs}))
    (root / "results" / "summaries").mkdir()
    (root / "results" / "summaries" / "arm_metrics.json").write_text(json.dumps(
        {"judged": {"gemma": {"canonical_pv0": {"te_abstain": 0.5}}}}))
    return root


@pytest.fixture(scope="module")
def judged_inputs(runs, tmp_path_factory, tiny_backend, tiny_model_dir) -> Path:
    """Copies of the runs, ``one`` with a judge pass, an annotation key and sheet, and a release checkout."""
    from memtoc.jobs.judge import JudgeConfig, run_judge

    root = tmp_path_factory.mktemp("outputs")
    for name in ("one", "a", "b"):
        shutil.copytree(runs / name, root / "inputs" / name)
    run_judge(JudgeConfig(run_dir=str(root / "inputs" / "one"), judge_model=str(tiny_model_dir), device="cpu",
                          dtype="float32", progress=False), backend=tiny_backend, log=lambda s: None)
    annot = root / "inputs" / "annot"
    annot.mkdir()
    item = {"arm": "one", "run": "one", "episode_id": "e1", "cell": "arb", "screen_flag": True, "llm_flag": True,
            "regex_flag": False}
    (annot / "s.key.json").write_text(json.dumps({"schema": "memtoc-ack-key-v1", "detector": "llm",
                                                  "screen": {"one": {"n": 4, "k": 1}}, "items": {"A000001": item}}))
    (annot / "s.csv").write_text("item_id,question,tool_value,response,ack\nA000001,Q?,x,y,yes\n")
    _tiny_release(root / "inputs" / "rel")
    return root / "inputs"


def _output_cases(inp: Path, out: Path) -> dict[str, tuple[list[str], str, str]]:
    """name -> (argv, the output path named in the error, the input path named in the error)."""
    one, a, b, annot, rel = (inp / n for n in ("one", "a", "b", "annot", "rel"))
    arm = rel / "results" / "summaries" / "arm_metrics.json"
    return {
        "metrics-run-file": (["metrics", str(one), "--out", str(one / "episodes.jsonl")],
                             str(one / "episodes.jsonl"), str(one)),
        "metrics-input-dir": (["metrics", "--input", str(one / "episodes.jsonl"), "--out",
                               str(one / "summary.json")], str(one / "summary.json"), str(one)),
        "compare": (["compare", str(a), str(b), "--out", str(b / "episodes.jsonl")], str(b / "episodes.jsonl"),
                    str(b)),
        "score": (["score", "--input", str(one / "episodes.jsonl"), "--out", str(one / "episodes.jsonl")],
                  str(one / "episodes.jsonl"), str(one / "episodes.jsonl")),
        "ack-car": (["ack", "car", str(one), "--out", str(one / "judge.jsonl")], str(one / "judge.jsonl"),
                    str(one)),
        "ack-export-sheet": (["ack", "export", str(one), "--sheet", str(one / "closed_book.jsonl")],
                             str(one / "closed_book.jsonl"), str(one)),
        "ack-export-key-is-sheet": (["ack", "export", str(one), "--sheet", str(out / "s.csv"), "--key",
                                     str(out / "s.csv")], str(out / "s.csv"), "--sheet"),
        "ack-import-key": (["ack", "import", str(annot / "s.key.json"), "--labels", str(annot / "s.csv"),
                            "--out", str(annot / "s.key.json")], str(annot / "s.key.json"),
                           str(annot / "s.key.json")),
        "ack-import-labels": (["ack", "import", str(annot / "s.key.json"), "--labels", str(annot / "s.csv"),
                               "--out", str(annot / "s.csv")], str(annot / "s.csv"), str(annot / "s.csv")),
        "verify-release-json": (["verify-release", str(rel), "--json", str(arm)], str(arm), str(rel)),
        "verify-release-csv": (["verify-release", str(rel), "--csv", str(rel / "results" / "x.csv")],
                               str(rel / "results" / "x.csv"), str(rel)),
        "judge-escape": (["judge", str(one), "--judge-model", "default", "--device", "cpu", "--out",
                          "../../evil.jsonl"], "evil.jsonl", str(one)),
        "judge-absolute": (["judge", str(one), "--judge-model", "default", "--device", "cpu", "--out",
                            str(out / "abs.jsonl")], str(out / "abs.jsonl"), str(one)),
        "judge-run-file": (["judge", str(one), "--judge-model", "default", "--device", "cpu", "--out",
                            "episodes.jsonl"], "episodes.jsonl", str(one)),
        "switch-onto-input": (["switch", str(a), str(b), "--gate", "oracle", "--out", str(a)], str(a), str(a)),
        "switch-inside-input": (["switch", str(a), str(b), "--gate", "oracle", "--out", str(a / "sw")],
                                str(a / "sw"), str(a)),
        "switch-holding-input": (["switch", str(a), str(b), "--gate", "oracle", "--out", str(inp)], str(inp),
                                 str(a)),
    }


def test_outputs_onto_inputs_are_refused_and_inputs_stay_byte_identical(judged_inputs, tmp_path, capsys,
                                                                         monkeypatch):
    from memtoc.backends.hf import HFBackend
    from memtoc.cli import main

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: pytest.fail("a model was loaded")))
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(judged_inputs)
    assert any(name.endswith(".writer.lock") for name in before)          # switch must not rewrite it
    outside = {str(p) for p in judged_inputs.parent.parent.rglob("evil.jsonl")}
    failures = []
    for name, (argv, out_path, in_path) in _output_cases(judged_inputs, out).items():
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        ok = (rc == 2 and len(err.splitlines()) == 1 and out_path in err and in_path in err
              and "Traceback" not in err)
        if not ok:
            failures.append((name, rc, err))
        assert snapshot(judged_inputs) == before, name
    assert not failures, failures
    assert {str(p) for p in judged_inputs.parent.parent.rglob("evil.jsonl")} == outside
    assert list(out.iterdir()) == []                                       # nothing written anywhere


def test_separate_outputs_still_work(judged_inputs, tmp_path):
    """The rule refuses only what it should: the same commands with outputs outside their inputs succeed."""
    from memtoc.cli import main

    one, a, b = (judged_inputs / n for n in ("one", "a", "b"))
    before = snapshot(judged_inputs)
    assert main(["metrics", str(one), "--n-boot", "20", "--out", str(tmp_path / "m.json")]) == 0
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c.json")]) == 0
    assert main(["ack", "car", str(one), "--out", str(tmp_path / "car.json")]) == 0
    assert main(["verify-release", str(judged_inputs / "rel"), "--json", str(tmp_path / "v.json")]) == 0
    assert snapshot(judged_inputs) == before
    assert {p.name for p in tmp_path.iterdir()} == {"m.json", "c.json", "car.json", "v.json"}
