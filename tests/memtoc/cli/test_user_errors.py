"""Errors a user meets on a full disk, an empty input, a mistyped model path or bad records: one line, exit 2,
naming the file (and row), nothing already written lost."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import memtoc.runs.runstore as runstore
from memtoc.cli import main
from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.tasks.memtoc.evaluate import EvaluationConfig, evaluate

REPO = Path(__file__).resolve().parents[3]
ROW = {"question": "What is the capital of Australia?", "gold_answer": "Canberra", "condition": "tool_wrong",
       "response": "FINAL: Canberra", "tool_value": "Sydney", "memory_answer": "FINAL: Canberra", "question_id": "q1"}


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right,no_tool", limit=3, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return EvaluationConfig(**base)


def _lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]


# -- score -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["", "\n\n"], ids=["empty", "blank-lines"])
def test_score_on_empty_input_refuses_and_keeps_the_output(tmp_path, capsys, content):
    inp, out = tmp_path / "in.jsonl", tmp_path / "scored.jsonl"
    inp.write_text(content, encoding="utf-8")
    out.write_text("previous results\n", encoding="utf-8")
    assert main(["score", "--input", str(inp), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(inp) in err and "no records" in err
    assert out.read_text(encoding="utf-8") == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "scored.jsonl"]


def test_score_replaces_output_atomically(tmp_path, monkeypatch):
    """A write failure while scoring leaves the old output whole (temp file + rename)."""
    import memtoc.core.fileio as fileio

    inp, out = tmp_path / "in.jsonl", tmp_path / "scored.jsonl"
    inp.write_text(json.dumps(ROW) + "\n", encoding="utf-8")
    out.write_text("previous results\n", encoding="utf-8")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(fileio.os, "fsync", full)
    assert main(["score", "--input", str(inp), "--output", str(out)]) == 2
    monkeypatch.undo()
    assert out.read_text(encoding="utf-8") == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "scored.jsonl"]
    assert main(["score", "--input", str(inp), "--output", str(out)]) == 0
    assert _lines(out)[0]["outcome"] == "kept_memory"


# -- model path typo -------------------------------------------------------------------------------------------

@pytest.fixture()
def no_hub(monkeypatch):
    """Any attempt to reach a hub (or to load anything through transformers) fails the test."""
    import transformers

    def forbidden(*a, **k):
        raise AssertionError(f"a model loader was called: {a} {k}")
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM, transformers.AutoConfig):
        monkeypatch.setattr(cls, "from_pretrained", forbidden)
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", forbidden)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", forbidden)


@pytest.mark.parametrize("spec", ["models/mymodel", "./models/mymodel", "models/sub/mymodel", "~/nowhere/m",
                                  "models/mymodel.gguf", "mymodel"])
def test_mistyped_local_model_path_is_named_before_any_hub_call(tmp_path, monkeypatch, capsys, no_hub, spec):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    rc = main(["evaluate", "--model", spec, "--out", str(tmp_path / "run"), "--limit", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "does not exist" in err and spec.lstrip("./~").split("/")[-1] in err, err
    assert not (tmp_path / "run").exists()


def test_hub_ids_stay_hub_ids():
    from memtoc.backends.models import resolve_model

    for spec in ("HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-0.5B-Instruct", "hub:models/mymodel"):
        src = resolve_model(spec)
        assert src.kind == "hub" and not src.local and src.path == spec.removeprefix("hub:")


# -- full disk during evaluate -----------------------------------------------------------------------------------

def test_enospc_in_the_run_store_is_one_line_and_keeps_committed_records(tiny_backend, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    ref = tmp_path / "ref"
    evaluate(_cfg(tiny_model_dir, ref), backend=tiny_backend, log=lambda s: None)
    run = tmp_path / "run"
    calls = [0]
    real_fsync = runstore.os.fsync

    def fsync(fd):                      # the disk fills up at the 4th episode batch
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith("episodes.jsonl"):
            calls[0] += 1
            if calls[0] == 4:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)
    monkeypatch.setattr(runstore.os, "fsync", fsync)
    with pytest.raises(RunStoreError) as info:
        evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)
    msg = str(info.value)
    assert "episodes.jsonl: cannot append 1 records (No space left on device (ENOSPC))" in msg
    assert "3 records written before are intact" in msg and "\n" not in msg
    assert (run / "episodes.jsonl").read_bytes().endswith(b"\n")        # the failed batch was cut back
    done = _lines(run / "episodes.jsonl")
    want = {r["episode_id"]: r for r in _lines(ref / "episodes.jsonl")}
    assert len(done) == 3 and all(want[r["episode_id"]] == r for r in done)
    monkeypatch.undo()
    evaluate(_cfg(tiny_model_dir, run), backend=tiny_backend, log=lambda s: None)   # disk freed: resume
    assert {r["episode_id"]: r for r in _lines(run / "episodes.jsonl")} == want


def test_file_size_limit_in_a_real_process_is_exit_2_one_line(tiny_model_dir, tmp_path):
    """A real write failure (RLIMIT_FSIZE: the kernel refuses writes past a size, EFBIG) in `memtoc evaluate`."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "memtoc.cli", "evaluate", "--model", str(tiny_model_dir), "--out", str(run),
            "--limit", "3", "--conditions", "tool_wrong,tool_right,no_tool", "--batch-size", "1",
            "--max-new-tokens", "6", "--device", "cpu", "--dtype", "float32", "--no-progress"]

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, 12_000))
    res = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=limit, cwd=tmp_path)
    err_lines = [l for l in res.stderr.splitlines() if l.startswith("memtoc evaluate:")]
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(err_lines) == 1, res.stderr
    assert "File too large (EFBIG)" in err_lines[0] and ".jsonl" in err_lines[0]
    for name in ("closed_book.jsonl", "episodes.jsonl"):
        if (run / name).exists():
            raw = (run / name).read_bytes()
            assert not raw or raw.endswith(b"\n")
            _lines(run / name)                              # every committed line is a whole record
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)   # limit lifted: resume
    assert res.returncode == 0, res.stderr
    assert json.loads((run / "run.json").read_text())["status"] == "complete"


# -- messages ------------------------------------------------------------------------------------------------------

def test_duplicate_question_id_names_its_row(tmp_path):
    from memtoc.bench.questions import load_mapping

    row = {"id": "1.0", "question": "Q?", "gold_answer": "A", "final_near": "B"}
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, {**row, "id": "2.0"}, row)), encoding="utf-8")
    with pytest.raises(BenchmarkDataError) as info:
        load_mapping(path)
    assert info.value.row == 3
    assert str(info.value) == f"{path}, row 3, field 'id': duplicate question id '1.0' (first on row 1)"


def test_json_errors_say_at_once(tmp_path):
    from memtoc.bench.questions import load_mapping

    path = tmp_path / "m.jsonl"
    path.write_text('{"id": "1.0", "question": "unterminated', encoding="utf-8")
    with pytest.raises(BenchmarkDataError) as info:
        load_mapping(path)
    assert "at at" not in str(info.value) and "Unterminated string starting at column" in str(info.value)
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"a": "x\n{"a": 1}\n', encoding="utf-8")
    with pytest.raises(RunStoreError) as info:
        list(runstore.iter_jsonl(bad))
    assert "at at" not in str(info.value) and "line 1" in str(info.value)


def test_metrics_errors_name_the_file(tmp_path, capsys):
    path = tmp_path / "scored.jsonl"
    rec = {"question_id": "q1", "condition": "tool_wrong", "cell": "arb"}     # no formulation, no outcome
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    assert main(["metrics", "--input", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}, row 1, field" in err, err


def test_metrics_tolerates_a_torn_last_line_of_a_plain_file(tmp_path, capsys):
    from memtoc.bench.offline import score_record

    scored = score_record(ROW)
    scored.update(formulation="reference", cell="arb", memory_correct=True, mem_absent=False)
    path = tmp_path / "scored.jsonl"
    text = json.dumps(scored) + "\n"
    path.write_text(text + text[:20], encoding="utf-8")
    before = path.read_bytes()
    assert main(["metrics", "--input", str(path), "--n-boot", "20"]) == 0
    err = capsys.readouterr().err
    assert "torn" in err and "interrupted" in err
    assert path.read_bytes() == before
