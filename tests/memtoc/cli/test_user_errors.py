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

import memtoc.core.durable as durable
import memtoc.runs.runstore as runstore
from memtoc.cli import main
from memtoc.core.values import build_config
from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.jobs.evaluate import evaluate
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec
from memtoc.tasks.agent.task import AgentSettings

REPO = Path(__file__).resolve().parents[3]
ROW = {"question": "What is the capital of Australia?", "gold_answer": "Canberra", "condition": "tool_wrong",
       "response": "FINAL: Canberra", "tool_value": "Sydney", "memory_answer": "FINAL: Canberra", "question_id": "q1"}


def _cfg(model_dir, out, **kw) -> EvaluationConfig:
    base = dict(model=str(model_dir), benchmark="demo", out=str(out), formulations="reference",
                conditions="tool_wrong,tool_right,no_tool", limit=3, batch_size=1, max_new_tokens=6,
                device="cpu", dtype="float32", progress=False)
    base.update(kw)
    return build_config(EvaluationConfig, base)


def _lines(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines()]


# -- score -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["", "\n\n"], ids=["empty", "blank-lines"])
def test_score_on_empty_input_refuses_and_keeps_the_output(tmp_path, capsys, content):
    inp, out = tmp_path / "in.jsonl", tmp_path / "scored.jsonl"
    inp.write_text(content, encoding="utf-8")
    out.write_text("previous results\n", encoding="utf-8")
    assert main(["score", "--input", str(inp), "--out", str(out)]) == 2
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
    assert main(["score", "--input", str(inp), "--out", str(out)]) == 2
    monkeypatch.undo()
    assert out.read_text(encoding="utf-8") == "previous results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "scored.jsonl"]
    assert main(["score", "--input", str(inp), "--out", str(out)]) == 0
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
    real_fsync = durable.os.fsync

    def fsync(fd):                      # the disk fills up at the 4th episode batch
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith("episodes.jsonl"):
            calls[0] += 1
            if calls[0] == 4:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)
    monkeypatch.setattr(durable.os, "fsync", fsync)      # the run store appends through durable
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
    # no bytecode written under the limit: CPython takes a short write of a .pyc for a whole one, and the truncated
    # file would break that module's import in every later process ("marshal data too short")
    res = subprocess.run(argv, capture_output=True, text=True, env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                         preexec_fn=limit, cwd=tmp_path)
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


# -- issue 29: every option and file checked before work: one line, exit 2, before any weights load ------------

@pytest.fixture()
def no_load(monkeypatch):
    """Loading weights fails the test (an AssertionError is no MemtocError: main() would not turn it into 2)."""
    from memtoc.backends.hf import HFBackend

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: pytest.fail("weights were loaded")))


@pytest.fixture(scope="module")
def small_runs(tiny_backend, tiny_model_dir, tmp_path_factory) -> Path:
    """``r``: 3 questions with a 4-token budget (its closed-book spans hit the budget); ``r1``: 1 question."""
    root = tmp_path_factory.mktemp("bad-inputs")
    for name, limit in (("r", 3), ("r1", 1)):
        evaluate(_cfg(tiny_model_dir, root / name, conditions="tool_wrong,tool_right", limit=limit,
                      max_new_tokens=4), backend=tiny_backend, log=lambda s: None)
    return root


def _one_line(capsys, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.mark.parametrize("device", ["tpu9", "", "meta"])
def test_bad_devices_are_refused_before_anything(small_runs, tmp_path, capsys, no_load, device, tiny_model_dir):
    assert main(["judge", str(small_runs / "r"), "--judge-model", str(tiny_model_dir), "--device", device]) == 2
    _one_line(capsys, "--device", repr(device))
    out = tmp_path / "run"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--out", str(out), "--device", device, "--limit", "1",
                 "--no-progress"]) == 2
    _one_line(capsys, "--device")
    assert not out.exists()                          # meta used to leave a run stuck at 'running'


@pytest.mark.parametrize("argv, needle", [
    (["judge", "{r}", "--judge-model", "{model}", "--batch-size", "0"], "--batch-size 0"),
    (["metrics", "{r}", "--n-boot", "0"], "--n-boot 0"),
    (["metrics", "--input", "{r}/episodes.jsonl", "--n-boot", "-5"], "--n-boot -5"),
    (["switch", "{r}", "{r}", "--gate", "oracle", "--out", "{tmp}/sw", "--n-boot", "0"], "--n-boot 0"),
    (["agent", "evaluate", "--model", "{model}", "--out", "{tmp}/ag", "--n-boot", "0"], "--n-boot 0"),
    (["agent", "evaluate", "--model", "{model}", "--out", "{tmp}/ag", "--temperature", "-1"], "--temperature"),
    (["agent", "evaluate", "--model", "{model}", "--out", "{tmp}/ag", "--temperature", "nan"], "--temperature"),
    (["ack", "export", "{r}", "--sheet", "{tmp}/s.csv", "--per-stratum", "-2"], "--per-stratum -2"),
    (["ack", "export", "{r}", "{r}/", "--sheet", "{tmp}/s.csv", "--detector", "regex"], "given twice"),
    (["ack", "car", "{r}", "{r}"], "given twice"),
    (["rank-table", "--run", "{tmp}/nonexistent", "--model", "{model}", "--out", "{tmp}/rt"], "nonexistent"),
    (["lens", "fit", "--model", "{model}", "--backend", "vllm", "--out", "{tmp}/l.safetensors"], "--backend vllm"),
], ids=["judge-batch-0", "metrics-nboot-0", "metrics-nboot-neg", "switch-nboot", "agent-nboot", "agent-temp-neg",
        "agent-temp-nan", "ack-per-stratum", "ack-export-repeated", "ack-car-repeated", "rank-table-no-run",
        "lens-fit-vllm"])
def test_bad_option_values_are_one_line_before_work(small_runs, tmp_path, capsys, no_load, tiny_model_dir, argv,
                                                    needle):
    fill = {"r": str(small_runs / "r"), "model": str(tiny_model_dir), "tmp": str(tmp_path)}
    assert main([a.format(**fill) for a in argv]) == 2
    _one_line(capsys, needle)
    assert list(tmp_path.iterdir()) == []              # no run directory, sheet or table left behind


def _prompt_file(tmp_path, change) -> Path:
    from importlib import resources

    data = json.loads(resources.files("memtoc").joinpath("data/judge_prompts.json").read_text(encoding="utf-8"))
    change(data)
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


@pytest.mark.parametrize("change, field", [
    (lambda d: d["prompts"].update(ack=d["prompts"]["ack"] + " {foo}"), "prompts.ack"),
    (lambda d: d["prompts"].update(extract=d["prompts"]["extract"] + " {0}"), "prompts.extract"),
    (lambda d: d["prompts"].update(ack=d["prompts"]["ack"] + " {"), "prompts.ack"),
    (lambda d: d["generation"].update(max_new_tokens="lots"), "generation.max_new_tokens"),
    (lambda d: d["generation"].update(max_new_tokens=-1), "generation.max_new_tokens"),
    (lambda d: d["parse"].update(max_words=0), "parse.max_words"),
], ids=["foo", "positional", "unbalanced", "tokens-lots", "tokens-neg", "words-0"])
def test_bad_judge_prompt_files_name_the_field_before_loading(small_runs, tmp_path, capsys, no_load, change, field,
                                                              tiny_model_dir):
    p = _prompt_file(tmp_path, change)
    assert main(["judge", str(small_runs / "r"), "--judge-model", str(tiny_model_dir), "--prompts", str(p)]) == 2
    _one_line(capsys, str(p), f"field '{field}'")
    assert not (small_runs / "r" / "judge.jsonl").exists()


def test_literal_braces_in_a_judge_prompt_still_load(tmp_path):
    from memtoc.scoring.judge.prompts import load_judge_prompts

    p = _prompt_file(tmp_path, lambda d: d["prompts"].update(ack=d["prompts"]["ack"] + " {{json}}"))
    assert load_judge_prompts(p).render("ack", answer="x").endswith(" {json}")


def _annotation(tmp_path) -> tuple[Path, Path]:
    item = {"arm": "r", "run": "r", "episode_id": "e1", "cell": "arb", "screen_flag": True, "llm_flag": True,
            "regex_flag": False}
    key = tmp_path / "s.key.json"
    key.write_text(json.dumps({"schema": "memtoc-ack-key-v1", "detector": "llm", "screen": {"r": {"n": 4, "k": 2}},
                               "items": {"A000001": item, "A000002": {**item, "episode_id": "e2"}}}))
    sheet = tmp_path / "s.csv"
    sheet.write_text("item_id,question,tool_value,response,ack\nA000001,Q?,x,y,yes\nA000002,Q?,x,y,no\n",
                     encoding="utf-8")
    return key, sheet


def test_ack_import_reads_excel_bom_sheets(tmp_path, capsys):
    key, sheet = _annotation(tmp_path)
    sheet.write_bytes(b"\xef\xbb\xbf" + sheet.read_bytes())         # Excel's "CSV UTF-8"
    assert main(["ack", "import", str(key), "--labels", str(sheet)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["n_labelled"] == [2] and res["n_positive"] == 1


@pytest.mark.parametrize("case, needle", [
    ("binary-labels", "not a UTF-8 CSV"), ("sheet-as-key", "not an annotation key"),
    ("conflicting-labels", "appears twice"), ("same-sheet-twice", "given twice")])
def test_bad_ack_files_are_one_line(tmp_path, capsys, case, needle):
    key, sheet = _annotation(tmp_path)
    argv = ["ack", "import", str(key), "--labels", str(sheet)]
    if case == "binary-labels":
        sheet.write_bytes(bytes(range(256)) * 4)
    elif case == "sheet-as-key":                              # a copy: the same path twice is "given twice"
        copy = tmp_path / "sheet_as_key.csv"
        copy.write_bytes(sheet.read_bytes())
        argv[2] = str(copy)
    elif case == "conflicting-labels":                        # last-wins used to give prevalence 1.0
        sheet.write_text(sheet.read_text() + "A000002,Q?,x,y,yes\n", encoding="utf-8")
    else:
        argv += ["--labels", str(sheet)]
    assert main(argv) == 2
    _one_line(capsys, needle)


def test_closed_book_source_with_a_cut_budget_or_another_dtype_is_refused(small_runs, tmp_path, capsys, no_load,
                                                                          tiny_model_dir):
    src = small_runs / "r"
    cut = [json.loads(l)["stop_reason"] for l in (src / "closed_book.jsonl").read_text().splitlines()]
    assert "max_tokens" in cut                                   # the 4-token source's spans were truncated
    base = ["evaluate", "--model", str(tiny_model_dir), "--closed-book-from", str(src), "--limit", "3",
            "--conditions", "tool_wrong", "--device", "cpu", "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "a"), "--max-new-tokens", "16", "--dtype", "float32"]) == 2
    _one_line(capsys, "max_new_tokens", "(4 there, 16 here)")
    assert main(base + ["--out", str(tmp_path / "b"), "--max-new-tokens", "4", "--dtype", "bfloat16"]) == 2
    _one_line(capsys, "field dtype", "'float32' there, 'bfloat16' here")
    assert list(tmp_path.iterdir()) == []


def test_switch_of_runs_with_different_episodes_is_refused(small_runs, tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["switch", str(small_runs / "r"), str(small_runs / "r1"), "--gate", "oracle", "--out", str(out),
                 "--n-boot", "20"]) == 2
    _one_line(capsys, "r has 6 episodes", "r1 has 2,", "2 in common")
    assert not out.exists()


def test_agent_run_of_another_model_or_more_questions_than_limit(small_runs, tmp_path, tiny_backend,
                                                                 tiny_model_dir):
    import shutil

    from memtoc.tasks.agent.task import AgentRunConfig, evaluate_agent
    from memtoc.core.config import ConfigError

    other = tmp_path / "other"
    shutil.copytree(small_runs / "r", other)
    info = json.loads((other / "run.json").read_text())
    info["identity"]["weights_sha256"] = "0" * 64
    (other / "run.json").write_text(json.dumps(info))

    def cfg(run, out):
        return AgentRunConfig(
            agent=AgentSettings(run=str(run), slice="all"),
            selection=EpisodeSelection(conditions="tool_wrong", limit=1),
            model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
            job=JobSettings(out=str(out), progress=False, n_boot=20), generation=GenerationConfig(max_new_tokens=6))
    with pytest.raises(ConfigError, match="identity.weights_sha256"):
        evaluate_agent(cfg(other, tmp_path / "a"), backend=tiny_backend)
    assert not (tmp_path / "a").exists()
    res = evaluate_agent(cfg(small_runs / "r", tmp_path / "b"), backend=tiny_backend)   # 3 questions, --limit 1
    assert {r["question_id"] for r in res.records} == {"0.0"} and len(res.records) == 1


def test_rank_table_api_checks_the_run_before_loading(tmp_path, no_load, tiny_model_dir):
    import memtoc.api as api
    from memtoc.core.errors import MemtocError

    with pytest.raises(MemtocError, match="nonexistent"):
        api.rank_table(str(tmp_path / "nonexistent"), model=str(tiny_model_dir), out=str(tmp_path / "rt"))
    assert not (tmp_path / "rt").exists()
