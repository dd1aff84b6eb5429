"""Fault injection for the activation store: SIGKILL or ENOSPC at every write-family system call of a small
``memtoc extract`` and ``memtoc merge-activations``, then a normal resume, compared with an uninterrupted run.

1. The job runs uninterrupted under ``strace -e trace=write,writev,pwrite64,pwritev,fsync,fdatasync,rename,...``
   (main thread only, no ``-f``: every file write of the job is made there) to list its write-family calls;
   its store is the reference. strace attaches once the job's imports are done (``_attached_cli.py``): under
   ptrace every system call stops, and the imports make most of them (a traced job took 31 s instead of 8).
2. For each call (``--all``) or an even sample of them (``--points K``), the job is re-run under
   ``strace -e inject=SYSCALL:signal=KILL:when=N`` (the N-th call of that syscall) and under
   ``inject=SYSCALL:error=ENOSPC:when=N``; the store left behind is inspected (a store reported complete must
   equal the reference; for merges, ``--out`` must be the old file or a complete new one); then the same
   command is resumed normally (in this process, the CLI code path with the model loaded once) and its store
   must equal the reference: same sites, index, episode table and raw activations, byte for byte.

Prints ``N of N resumed identical`` per job and fault type. Examples::

    .venv/bin/python benchmarks/fault_inject_store.py --all                      # default model, every call
    .venv/bin/python benchmarks/fault_inject_store.py --model tests-tiny --points 6 --faults kill
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
try:
    from benchmarks import _guard
except ImportError:          # run as a script, or loaded by file path: the guard sits next to this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _guard
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FAMILY = ("write", "writev", "pwrite64", "pwritev", "pwritev2", "fsync", "fdatasync", "rename", "renameat",
          "renameat2", "ftruncate", "truncate", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat")
_LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?([a-z0-9_]+)\((.*)$")


@dataclass(frozen=True)
class Call:
    """One write-family call of the job's main thread: the syscall, its ordinal among calls of that syscall."""

    syscall: str
    nth: int
    text: str


@dataclass
class Outcome:
    job: str
    fault: str
    call: Call
    rc: int
    injected: bool
    state_ok: bool
    resumed_identical: bool
    detail: str = ""


@dataclass
class Job:
    """A command to break and resume: ``argv`` runs it; ``prepare`` resets the output; ``check_state`` inspects
    what a faulted run left; ``resume`` re-runs it normally and returns its exit status."""

    name: str
    argv: list[str]
    out: Path
    prepare: Callable[[], None]
    check_state: Callable[[], tuple[bool, str]]
    resume: Callable[[], int]
    reference: Path | None = None
    calls: list[Call] = field(default_factory=list)
    commit_marker: str | None = None     # a call on a path containing this that is an fsync commits one batch
    batch_episodes: int = 0


def committed_before(job: Job, i: int) -> int:
    """Batches whose commit (the journal's fsync) returned before call ``i`` in the uninterrupted run."""
    if not job.commit_marker:
        return 0
    return sum(1 for c in job.calls[:i] if c.syscall == "fsync" and job.commit_marker in c.text)


def _episodes_in(out: Path) -> int:
    from activations.store import open_store
    from memtoc.core.errors import MemtocError

    try:
        with open_store(out) as st:
            return st.n_episodes
    except MemtocError:
        return 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), "PYTHONDONTWRITEBYTECODE": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return env


def _cli(args: Sequence[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve().parent / "_attached_cli.py"), *args]


def _traced(strace: str, options: Sequence[str], argv: Sequence[str]) -> subprocess.CompletedProcess:
    """``argv`` (an :func:`_cli` command) with ``strace OPTIONS -p PID`` attached after its imports."""
    proc = subprocess.Popen(list(argv), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = proc.stdout.readline() if proc.stdout is not None else ""
    tracer = None
    if ready.strip() == "ready":
        tracer = subprocess.Popen([strace, *options, "-p", str(proc.pid)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    out, err = proc.communicate()
    if tracer is not None:
        tracer.wait()
    return subprocess.CompletedProcess(list(argv), proc.returncode, ready + out, err)


def list_calls(strace: str, argv: Sequence[str], trace_file: Path) -> tuple[int, list[Call]]:
    """Run ``argv`` under strace (main thread) and list its write-family calls in order."""
    proc = _traced(strace, ["-qq", "-y", "-s", "40", "-e", "trace=" + ",".join(FAMILY), "-o", str(trace_file)], argv)
    counts: dict[str, int] = {}
    calls = []
    for line in trace_file.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m or m.group(1) not in FAMILY:
            continue
        name = m.group(1)
        counts[name] = counts.get(name, 0) + 1
        calls.append(Call(name, counts[name], line[:160]))
    if proc.returncode not in (0,):
        raise SystemExit(f"uninterrupted run failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode, calls


def inject(strace: str, argv: Sequence[str], call: Call, fault: str) -> subprocess.CompletedProcess:
    how = "signal=KILL" if fault == "kill" else "error=ENOSPC"
    return _traced(strace, ["-qq", "-o", os.devnull, "-e", f"trace={call.syscall}",
                            "-e", f"inject={call.syscall}:{how}:when={call.nth}"], argv)


def same_store(a: Path, b: Path) -> tuple[bool, str]:
    """Equal sites, index, episode table and raw (stored) activations."""
    import numpy as np

    from activations.store import open_store

    with open_store(a) as x, open_store(b) as y:
        if x.layers != y.layers or len(x) != len(y) or x.n_episodes != y.n_episodes:
            return False, f"shape: {len(x)} rows/{x.n_episodes} episodes vs {len(y)}/{y.n_episodes}"
        for col in y.index:
            if col not in x.index or not np.array_equal(x.index[col], y.index[col]):
                return False, f"index column {col}"
        for col in y.episodes:
            if not np.array_equal(x.episodes[col], y.episodes[col]):
                return False, f"episode column {col}"
        for s in y.layers:
            if not np.array_equal(x.read_raw(s), y.read_raw(s)):
                return False, f"site {s}"
    return True, ""


def _store_state(out: Path, ref: Path) -> tuple[bool, str]:
    """What a faulted run left: readable or absent, and never complete with data that differ."""
    from activations.store import open_store
    from memtoc.core.errors import MemtocError

    try:
        with open_store(out) as st:
            complete = st.complete
    except MemtocError as exc:
        if "no such activation store" in str(exc):
            return True, "no store yet"
        return False, f"unreadable: {exc}"
    if complete:
        ok, why = same_store(out, ref)
        return ok, "complete and equal" if ok else f"COMPLETE BUT DIFFERENT ({why})"
    return True, "incomplete"


def run_sweep(job: Job, strace: str, faults: Sequence[str], points: Sequence[int],
              log: Callable[[str], None] = print, on_result: Callable[[Outcome], None] | None = None
              ) -> list[Outcome]:
    results = []
    for fault in faults:
        for i in points:
            call = job.calls[i]
            job.prepare()
            proc = inject(strace, job.argv, call, fault)
            injected = proc.returncode in (-9, 137) if fault == "kill" else proc.returncode != 0
            state_ok, detail = job.check_state()
            if job.commit_marker:
                with_ref = _episodes_in(job.reference)
                need = min(committed_before(job, i) * job.batch_episodes, with_ref)
                have = _episodes_in(job.out)
                if have < need:
                    state_ok, detail = False, f"LOST COMMITTED BATCHES: {have} episodes left, {need} were committed"
            rc = job.resume()
            ok, why = same_store(job.out, job.reference) if rc == 0 else (False, f"resume exit {rc}")
            if ok:
                from activations.store import open_store

                with open_store(job.out) as st:
                    ok, why = (st.complete, "") if st.complete else (False, "resumed store not complete")
            out = Outcome(job.name, fault, call, proc.returncode, injected, state_ok, ok and state_ok,
                          "; ".join(x for x in (detail, why) if x))
            results.append(out)
            if on_result is not None:
                on_result(out)
            if not out.resumed_identical or not injected:
                log(f"  {job.name} {fault} at #{i + 1} {call.syscall}#{call.nth}: rc={proc.returncode} "
                    f"injected={injected} state_ok={state_ok} identical={ok} {out.detail} | {call.text}")
    return results


def on_files_under(call: Call, root: Path) -> bool:
    """A call on a file under ``root`` (not a write to stdout/stderr that merely mentions such a path: their
    count varies with the model loader's progress bars, so their ordinals are not stable between runs)."""
    if re.match(r"^write\([12]<", call.text):
        return False
    return str(Path(root).resolve()) in call.text


def pick_points(n: int, k: int | None) -> list[int]:
    """All indices, or ``k`` spread evenly over the list (first and last included)."""
    if k is None or k >= n:
        return list(range(n))
    if k <= 1:
        return [n - 1]
    return sorted({round(j * (n - 1) / (k - 1)) for j in range(k)})


# -- the two jobs --------------------------------------------------------------------------------------------

class _InProcessCLI:
    """Runs ``memtoc`` commands in this process with one loaded backend (a resume without reloading weights)."""

    def __init__(self) -> None:
        self._backend: Any = None

    def __call__(self, args: Sequence[str]) -> int:
        import contextlib
        import io

        import memtoc.jobs.extract as ex
        from memtoc.cli import main

        real = ex.load_capture_backend

        def cached(cfg: Any) -> Any:
            if self._backend is None:
                self._backend = real(cfg)
            return self._backend

        ex.load_capture_backend = cached
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                return int(main(list(args)))
        finally:
            ex.load_capture_backend = real


def extract_job(work: Path, extract_args: Sequence[str], cli: _InProcessCLI) -> Job:
    out = work / "extract" / "acts.h5"
    args = ["extract", *extract_args, "--out", str(out), "--no-progress"]

    def prepare() -> None:
        shutil.rmtree(out.parent, ignore_errors=True)
        out.parent.mkdir(parents=True)

    job = Job("extract", _cli(args), out, prepare, lambda: _store_state(out, job.reference),
              lambda: cli(args), commit_marker="journal.jsonl",
              batch_episodes=int(extract_args[list(extract_args).index("--batch-size") + 1]))
    return job


def merge_job(work: Path, source: Path, cli: _InProcessCLI) -> Job:
    """Two overlapping shards of ``source`` merged with --overwrite over an older merge output."""
    from activations.store import INDEX_COLUMNS, ActivationWriter, RowBlock, open_store

    d = work / "merge"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with open_store(source) as st:
        eps = st.episodes
        n = st.n_episodes
        if n < 2:
            raise SystemExit("the merge job needs a source store with at least 2 episodes")
        halves = {"a.h5": range(0, n // 2 + 1), "b.h5": range(n // 2, n)}     # one episode in both
        attrs = st.attrs
        for name, rng in halves.items():
            with ActivationWriter.open(d / name, identity=attrs["identity"], provenance={"model_id": attrs.get(
                    "model_id")}, sites=st.layers, d_model=st.d_model, storage_dtype=st.storage_dtype) as w:
                for i in rng:
                    a, b = int(eps["row_start"][i]), int(eps["row_stop"][i])
                    block = RowBlock(episodes=[{"episode_id": str(eps["episode_id"][i]), "n_rows": b - a,
                                                "n_prompt_tokens": int(eps["n_prompt_tokens"][i]),
                                                "n_generated_tokens": int(eps["n_generated_tokens"][i])}],
                                     index={c: v[a:b] for c, v in st.index.items() if c in INDEX_COLUMNS},
                                     acts={s: st.read(s, slice(a, b)) for s in st.layers})
                    w.append(block)
                w.finish(planned=[str(eps["episode_id"][i]) for i in rng])
    out = d / "merged.h5"
    old = d / "old.h5"
    assert cli(["merge-activations", str(d / "a.h5"), "--out", str(old)]) == 0
    args = ["merge-activations", str(d / "a.h5"), str(d / "b.h5"), "--out", str(out), "--overwrite"]
    old_bytes = old.read_bytes()

    def prepare() -> None:
        for p in d.iterdir():
            if ".merge-tmp-" in p.name:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        shutil.copyfile(old, out)

    def check_state() -> tuple[bool, str]:
        if not out.exists():
            return False, "OUTPUT GONE"
        if out.read_bytes() == old_bytes:
            return True, "old output intact"
        ok, why = _store_state(out, job.reference)
        if ok and why != "complete and equal":
            return False, f"output replaced by an incomplete store ({why})"
        return ok, why

    def resume() -> int:
        rc = cli(args)
        left = [p.name for p in d.iterdir() if ".merge-tmp-" in p.name]
        return rc if not left else 99

    job = Job("merge-activations", _cli(args), out, prepare, check_state, resume)
    return job


def prepare_reference(job: Job, strace: str, work: Path) -> None:
    job.prepare()
    _, job.calls = list_calls(strace, job.argv, work / f"{job.name}.strace")
    job.reference = work / f"{job.name}.reference.h5"
    shutil.copyfile(job.out, job.reference)


def summarize(results: Sequence[Outcome]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in results:
        k = f"{r.job}/{r.fault}"
        e = out.setdefault(k, {"points": 0, "resumed_identical": 0, "injected": 0, "state_ok": 0,
                               "complete_but_different": 0})
        e["points"] += 1
        e["resumed_identical"] += r.resumed_identical
        e["injected"] += r.injected
        e["state_ok"] += r.state_ok
        e["complete_but_different"] += "COMPLETE BUT DIFFERENT" in r.detail
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="'default' (embedded SmolLM2 GGUF), a model directory, or "
                    "'tests-tiny' (the tiny random model of tests/conftest.py, built in the work directory)")
    ap.add_argument("--conditions", default="tool_wrong,no_tool")
    ap.add_argument("--limit", type=int, default=2, help="questions (episodes = questions x conditions)")
    ap.add_argument("--layers", default="0,15,30", help="sites to store (the tiny model has sites 0..3)")
    ap.add_argument("--position-kinds", "--positions", dest="positions", default="last_input,tool_span")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--jobs", default="extract,merge", help="comma list of extract, merge")
    ap.add_argument("--faults", default="kill,enospc", help="comma list of kill, enospc")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--all", action="store_true", help="every write-family call (the default)")
    g.add_argument("--points", type=int, default=None, help="only K calls spread evenly over the list")
    ap.add_argument("--start", type=int, default=1, help="first point to run (1-based): continues an interrupted "
                    "sweep; the call list is printed so a continuation can be checked against the first run")
    ap.add_argument("--store-calls-only", action="store_true", help="only calls on files under the work directory "
                    "(skips writes to stdout/stderr, e.g. the model loader's progress bars)")
    ap.add_argument("--strace", default=shutil.which("strace") or "/usr/bin/strace")
    ap.add_argument("--workdir", default=None, help="kept when given (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write the per-point results here")
    args = ap.parse_args(argv)
    if not Path(args.strace).exists():
        print(f"strace not found at {args.strace}", file=sys.stderr)
        return 2
    work = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="fault_inject_store_"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model == "tests-tiny":
        sys.path.insert(0, str(REPO / "tests"))
        from conftest import build_tiny_model

        model = str(build_tiny_model(work / "tiny-model"))
    extract_args = ["--model", model, "--conditions", args.conditions, "--limit", str(args.limit), "--layers",
                    args.layers, "--position-kinds", args.positions, "--batch-size", str(args.batch_size),
                    "--device", "cpu", "--dtype", "float32"]
    cli = _InProcessCLI()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    t0 = time.time()
    guard = _guard.Guard("fault_inject_store").__enter__()   # the load is recorded (a correctness check, no ratio)
    results: list[Outcome] = []
    ex = extract_job(work, extract_args, cli)
    prepare_reference(ex, args.strace, work)
    jobs = [ex] if "extract" in args.jobs else []
    if "merge" in args.jobs:
        mj = merge_job(work, ex.reference, cli)
        prepare_reference(mj, args.strace, work)
        jobs.append(mj)
    seen: list[Outcome] = []
    for job in jobs:
        if args.store_calls_only:
            keep = [i for i, c in enumerate(job.calls) if on_files_under(c, work)]
            pts = [keep[j] for j in pick_points(len(keep), args.points)]
        else:
            pts = pick_points(len(job.calls), args.points)
        if args.start > 1:
            print(f"{job.name}: continuing at point {args.start}; points before it were "
                  f"{', '.join(f'{job.calls[i].syscall}#{job.calls[i].nth}' for i in pts[:args.start - 1])}",
                  flush=True)
            pts = pts[args.start - 1:]
        counts = {s: sum(c.syscall == s for c in job.calls) for s in FAMILY}
        print(f"{job.name}: {len(job.calls)} write-family calls in an uninterrupted run "
              f"({', '.join(f'{s} {n}' for s, n in counts.items() if n)}); "
              f"injecting at {len(pts)}", flush=True)
        def progress(r: Outcome, job: Job = job, n: int = (len(pts) + args.start - 1) * len(faults)) -> None:
            seen.append(r)
            done = sum(x.job == r.job for x in seen) + args.start - 1
            print(f"  [{job.name} {done}/{n}] {r.fault} at {r.call.syscall}#{r.call.nth}: "
                  f"{'identical' if r.resumed_identical else 'FAILED'} ({r.detail})", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({"args": vars(args), "partial": True,
                                                       "results": [asdict(x) for x in seen]}, indent=1))

        results += run_sweep(job, args.strace, faults, pts, on_result=progress)
    summary = summarize(results)
    guard.__exit__(None, None, None)
    for key, e in summary.items():
        print(f"{key}: {e['resumed_identical']} of {e['points']} resumed identical "
              f"(fault took effect in {e['injected']}; state after the fault sound in {e['state_ok']}; "
              f"complete-but-different: {e['complete_but_different']})")
    print(f"({time.time() - t0:.0f} s; work directory {work})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "load": guard.record(),
                                               "results": [asdict(r) for r in results]}, indent=1))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    bad = sum(e["points"] - e["resumed_identical"] + e["complete_but_different"] for e in summary.values())
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
