"""Issue 37's case lists, re-run through the command line (and the API where the issue names it): every case is
refused with exit status 2 and one line (the API: one MemtocError line), the model loader is replaced by a failure,
and the files the cases point at keep their bytes.

Class 1 (outputs over inputs), class 2 (checks after the model loads, or none) and the recipe cases are here;
class 3 (forged judge records) is tests/memtoc/scoring/judge/test_judge_run.py::
test_a_forged_verdict_or_answer_text_is_refused.
The fixtures are a tiny random model's config and weights (tests/conftest.py), one 3-question run made with it, a
copy of that run, and a store extracted from it; nothing of a real model loads.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from memtoc.cli import main
from memtoc.core.errors import MemtocError
from tests.contract_walk import digest
from memtoc.core.config import CaptureSettings, EpisodeSelection, GenerationConfig, JobSettings, ModelSpec

#: (id, argv template, a text the line must hold); {R} the run, {R2} its copy, {H} the store, {D} the folder
#: holding the store, {M} the tiny model, {T} a fresh folder, {X} the folder of hand-made bad files
OUTPUTS_OVER_INPUTS = [
    ("direction-out-on-its-store", "direction --activations {H} --contrast tool_wrong:tool_right --all-questions "
     "--out {H}", "--out"),
    ("score-out-on-a-store", "score --input {R}/episodes.jsonl --out {H}", "--out"),
    ("score-out-on-another-runs-episodes", "score --input {R}/episodes.jsonl --out {R2}/episodes.jsonl", "--out"),
    ("metrics-out-on-a-store", "metrics {R} --out {H}", "--out"),
    ("metrics-out-on-another-runs-episodes", "metrics {R} --out {R2}/episodes.jsonl", "--out"),
    ("episodes-out-on-a-store", "episodes --out {H}", "--out"),
    ("episodes-out-on-another-runs-episodes", "episodes --out {R2}/episodes.jsonl", "--out"),
    ("probe-out-into-a-run", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right "
     "--out {R}", "--out"),
    ("probe-out-on-the-folder-holding-its-input", "probe --activations {H} --label condition --positive tool_wrong "
     "--negative tool_right --out {D}", "--out"),
    ("study-out-on-its-base-run", "study --base {R} --arm {R2} --out {R} --score-layer deterministic", "--out"),
    ("study-out-into-its-arm-run", "study --base {R} --arm {R2} --out {R2}/x --score-layer deterministic", "--out"),
    ("study-out-into-a-labelled-arm", "study --base {R} --arm tuned={R2} --out {R2}/x --score-layer deterministic",
     "--out"),
    ("ack-export-sheet-on-a-store", "ack export {R} --sheet {H} --detector regex", "--sheet"),
    ("outcome-round-sheet-on-summary", "outcome-round export {R} --sheet {R}/summary.json", "--sheet"),
    ("merge-one-run-twice", "merge {R} {R} --out {T}/m", "given twice"),
    ("merge-activations-one-store-twice", "merge-activations {H} {H} --out {T}/m.h5", "given twice"),
]

CHECKS_BEFORE_LOAD = [
    ("extract-layers-99", "extract --model {M} --out {T}/a.h5 --layers 99", "--layers"),
    ("extract-layers-minus-1", "extract --model {M} --out {T}/a.h5 --layers -1", "--layers"),
    ("extract-layers-bogus", "extract --model {M} --out {T}/a.h5 --layers bogus", "--layers"),
    ("extract-layers-empty", "extract --model {M} --out {T}/a.h5 --layers ''", "--layers"),
    ("extract-run-missing", "extract --model {M} --out {T}/a.h5 --run {T}/missing", "--run"),
    ("extract-out-a-directory", "extract --model {M} --out {T}", "--out"),
    ("extract-out-a-text-file", "extract --model {M} --out {X}/text.txt", "--out"),
    ("extract-out-a-truncated-store", "extract --model {M} --out {X}/truncated.h5", "truncated.h5"),
    ("rank-table-lens-bogus", "rank-table --model {M} --run {R} --out {T}/rt --lens bogus", "--lens"),
    ("rank-table-lens-missing-file", "rank-table --model {M} --run {R} --out {T}/rt --lens jacobian={T}/missing",
     "not found"),
    ("rank-table-lens-not-a-lens", "rank-table --model {M} --run {R} --out {T}/rt --lens jacobian={X}/text.txt",
     "text.txt"),
    ("rank-table-lens-not-a-memtoc-lens", "rank-table --model {M} --run {R} --out {T}/rt "
     "--lens jacobian={X}/foreign.safetensors", "not a memtoc Jacobian lens"),
    ("rank-table-top-k-0", "rank-table --model {M} --run {R} --out {T}/rt --top-k 0", "--top-k"),
    ("rank-table-batch-size-0", "rank-table --model {M} --run {R} --out {T}/rt --batch-size 0", "--batch-size"),
    ("rank-table-layers-99", "rank-table --model {M} --run {R} --out {T}/rt --layers 99", "--layers"),
    ("lens-fit-max-seq-len-0", "lens fit --model {M} --out {T}/l.safetensors --max-seq-len 0", "--max-seq-len"),
    ("lens-fit-batch-rows-0", "lens fit --model {M} --out {T}/l.safetensors --batch-rows 0", "--batch-rows"),
    ("lens-fit-limit-0", "lens fit --model {M} --out {T}/l.safetensors --limit 0", "--limit"),
    ("lens-fit-checkpoint-minus-1", "lens fit --model {M} --out {T}/l.safetensors --checkpoint-seconds -1",
     "--checkpoint-seconds"),
    ("lens-fit-checkpoint-nan", "lens fit --model {M} --out {T}/l.safetensors --checkpoint-seconds nan",
     "--checkpoint-seconds"),
    ("lens-fit-corpus-missing", "lens fit --model {M} --out {T}/l.safetensors --corpus {T}/missing", "--corpus"),
    ("lens-fit-layers-99", "lens fit --model {M} --out {T}/l.safetensors --layers 99", "--layers"),
    ("finetune-train-r-0", "finetune train --objective sft --model {M} --r 0 --out {T}/ft", "--r"),
    ("finetune-train-dropout-1.5", "finetune train --objective sft --model {M} --lora-dropout 1.5 --out {T}/ft",
     "--lora-dropout"),
    ("finetune-train-lr-nan", "finetune train --objective sft --model {M} --lr nan --out {T}/ft", "--lr"),
    ("finetune-train-epochs-0", "finetune train --objective sft --model {M} --epochs 0 --out {T}/ft", "--epochs"),
    ("finetune-train-pairs-missing", "finetune train --objective sft --model {M} --pairs {T}/missing --out {T}/ft",
     "--pairs"),
    ("sweep-strengths-1e308", "sweep --model {M} --edit {X}/edit.json --strengths 0,1e308 --out {T}/sw",
     "strengths"),
    ("sweep-dev-labels-missing", "sweep --model {M} --edit {X}/edit.json --strengths 0,1 --dev-labels {T}/missing "
     "--out {T}/sw", "--dev-labels"),
    ("evaluate-out-empty", "evaluate --model {M} --out ''", "--out"),
    ("evaluate-out-a-file", "evaluate --model {M} --out {X}/text.txt", "--out"),
    ("evaluate-out-in-proc", "evaluate --model {M} --out /proc/self/memtoc-run", "--out"),
    ("evaluate-max-new-tokens-huge", "evaluate --model {M} --out {T}/r --max-new-tokens 99999999999",
     "--max-new-tokens"),
    ("evaluate-batch-size-huge", "evaluate --model {M} --out {T}/r --batch-size 10000000000000", "--batch-size"),
    # tracebacks before
    ("evaluate-binary-benchmark", "evaluate --model {M} --out {T}/r --benchmark {H}", "acts.h5"),
    ("evaluate-fake-gguf", "evaluate --model {X}/fake.gguf --out {T}/r", "fake.gguf"),
    ("score-nan-answer", "score --input {X}/nan.jsonl --out {T}/s.jsonl", "response"),
    ("metrics-n-boot-huge", "metrics {R} --n-boot 1000000000000", "--n-boot"),
    ("probe-folds-0", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right "
     "--folds 0 --out {T}/p", "--folds"),
    ("probe-folds-1", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right "
     "--folds 1 --out {T}/p", "--folds"),
    ("probe-C-0", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right --C 0 "
     "--out {T}/p", "--C"),
    ("probe-C-nan", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right --C nan "
     "--out {T}/p", "--C"),
    ("probe-C-inf", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right --C inf "
     "--out {T}/p", "--C"),
    # accepted silently before
    ("probe-n-boot-minus-1", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right "
     "--n-boot -1 --out {T}/p", "--n-boot"),
    ("probe-n-permutations-minus-1", "probe --activations {H} --label condition --positive tool_wrong "
     "--negative tool_right --n-permutations -1 --out {T}/p", "--n-permutations"),
    ("probe-run-missing", "probe --activations {H} --label condition --positive tool_wrong --negative tool_right "
     "--run {T}/missing --out {T}/p", "--run"),
    ("outcome-round-per-stratum-minus-1", "outcome-round export {R} --per-stratum -1 --sheet {T}/s.csv",
     "--per-stratum"),
    ("direction-zero-pairs", "direction --activations {H} --contrast tool_wrong:tool_right --split-questions "
     "{X}/no_questions.txt --out {T}/d.json", ""),
    ("metrics-on-a-json-that-is-not-a-run", "metrics {X}/not_a_run.json", "not_a_run.json"),
    ("metrics-input-a-json-that-is-not-a-run", "metrics --input {X}/not_a_run.json", "not_a_run.json"),
    # argparse's own errors: one line, no usage block
    ("argparse-missing-value", "evaluate --model {M} --out {T}/r --limit", "--limit"),
    ("argparse-unknown-option", "evaluate --model {M} --out {T}/r --limt 3", "--limit"),
    ("argparse-bad-choice", "evaluate --model {M} --out {T}/r --backend nope", "--backend"),
]

#: the recipe cases: each refused before any step runs ({Q}: the folder of recipe files made by the fixture)
RECIPES = [
    ("recipe-args-out-beside-the-steps-out", "run-experiment {Q}/args_out.toml --out {T}/x", "out is given twice"),
    ("recipe-set-out", "run-experiment {Q}/one.toml --out {T}/x --set out={T}/escape.jsonl", "--set out="),
    ("recipe-two-steps-one-output", "run-experiment {Q}/same_out.toml --out {T}/x", "also written by step one"),
    ("recipe-limit-a-list", "run-experiment {Q}/limit_list.toml --out {T}/x", "limit"),
    ("recipe-limit-0", "run-experiment {Q}/limit_0.toml --out {T}/x", "limit 0"),
    ("recipe-out-dot", "run-experiment {Q}/out_dot.toml --out {T}/x", "--out"),
]
_STEP = '[[steps]]\nname = "{name}"\ncommand = "episodes"\nout = "{out}"\n'
RECIPE_FILES = {
    "one.toml": _STEP.format(name="one", out="e1.jsonl"),
    "args_out.toml": _STEP.format(name="one", out="e1.jsonl") + 'args = { out = "{T}/escape.jsonl" }\n',
    "same_out.toml": _STEP.format(name="one", out="e1.jsonl") + _STEP.format(name="two", out="e1.jsonl"),
    "limit_list.toml": _STEP.format(name="one", out="e1.jsonl") + _STEP.format(name="two", out="e2.jsonl")
    + "args = { limit = [1, 2] }\n",
    "limit_0.toml": _STEP.format(name="one", out="e1.jsonl") + _STEP.format(name="two", out="e2.jsonl")
    + "args = { limit = 0 }\n",
    "out_dot.toml": _STEP.format(name="one", out="e1.jsonl") + _STEP.format(name="two", out="."),
}


@pytest.fixture(scope="module")
def files(tiny_backend, tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """The run, its copy, a store and the hand-made bad files the cases point at."""
    from memtoc.jobs.extract import ExtractConfig, run_extract
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    root = tmp_path_factory.mktemp("issue37")
    run, data, bad = root / "run", root / "data", root / "bad"
    evaluate(EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", formulations="reference",
                                   conditions="tool_wrong,tool_right,no_tool", limit=3),
        job=JobSettings(out=str(run), progress=False), generation=GenerationConfig(batch_size=1, max_new_tokens=4)), backend=tiny_backend, log=lambda s: None)
    shutil.copytree(run, root / "run2")
    data.mkdir()
    run_extract(ExtractConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(limit=3), job=JobSettings(out=str(data / "acts.h5"), progress=False),
        capture=CaptureSettings(layers="1-3"), run=str(run)), backend=tiny_backend)
    bad.mkdir()
    (bad / "text.txt").write_text("just text\n", encoding="utf-8")
    (bad / "truncated.h5").write_bytes((data / "acts.h5").read_bytes()[:3000])
    (bad / "fake.gguf").write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x01\x02")
    header = json.dumps({"__metadata__": {"format": "someone-else"}}).encode()
    (bad / "foreign.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    record = json.loads((run / "episodes.jsonl").read_text(encoding="utf-8").splitlines()[0])
    (bad / "nan.jsonl").write_text(json.dumps({**record, "response": float("nan")}) + "\n", encoding="utf-8")
    (bad / "not_a_run.json").write_text(json.dumps({"hello": 1}), encoding="utf-8")
    (bad / "no_questions.txt").write_text("no-such-question\n", encoding="utf-8")
    import memtoc as mt                          # a valid edit spec for the sweep cases: a direction of the store

    mt.direction(str(data / "acts.h5"), contrast="tool_wrong:tool_right", all_questions=True,
                 out=str(bad / "edit.json"))
    recipes = root / "recipes"
    recipes.mkdir()
    for name, text in RECIPE_FILES.items():
        (recipes / name).write_text(f'name = "{name[:-5]}"\n' + text.replace("{T}", str(root / "elsewhere")),
                                    encoding="utf-8")
    return {"R": run, "R2": root / "run2", "H": data / "acts.h5", "D": data, "M": tiny_model_dir, "X": bad,
            "Q": recipes}



def _run(template: str, files: dict[str, Path], tmp: Path) -> tuple[int, list[str]]:
    import shlex

    argv = shlex.split(template.format(**{k: str(v) for k, v in files.items()}, T=str(tmp)))
    try:
        rc = main(argv)
    except SystemExit as exc:                    # argparse's own errors exit from the parser
        rc = exc.code
    return rc, argv


CLI_CASES = OUTPUTS_OVER_INPUTS + CHECKS_BEFORE_LOAD + RECIPES


@pytest.mark.parametrize("template, needle", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_every_case_of_the_issue_is_one_line_and_exit_2(template, needle, files, tmp_path, capsys, no_model):
    before = {k: digest(files[k]) for k in ("R", "R2", "H", "X")}
    rc, argv = _run(template, files, tmp_path)
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "usage:" not in err, err
    assert needle in err, (needle, err)
    assert {k: digest(files[k]) for k in before} == before          # nothing the case pointed at was touched
    assert not (tmp_path / "x" / "e1.jsonl").exists()               # a recipe: no step ran
    assert not (files["Q"].parent / "elsewhere").exists() and not (tmp_path / "escape.jsonl").exists()


def _api_cases(files: dict[str, Path], tmp: Path) -> list[tuple[str, Any, str]]:
    import memtoc as mt

    h, r, r2 = str(files["H"]), str(files["R"]), str(files["R2"])
    probe = dict(label="condition", positive="tool_wrong", negative="tool_right")
    return [
        ("direction-out-on-its-store", lambda: mt.direction(h, contrast="tool_wrong:tool_right", all_questions=True,
                                                            out=h), "--out"),
        ("probe-out-on-its-store", lambda: mt.probe(h, **probe, out=h), "--out"),
        ("probe-folds-0", lambda: mt.probe(h, **probe, folds=0, out=str(tmp / "p")), "folds"),
        ("compare-layer-bogus", lambda: mt.compare(r, r2, score_layer="bogus"), "bogus"),
        ("extract-layers-99", lambda: mt.extract(model=str(files["M"]), layers="99", out=str(tmp / "a.h5")),
         "--layers"),
        ("rank-table-lens-not-a-lens", lambda: mt.rank_table(r, model=str(files["M"]), out=str(tmp / "rt"),
                                                            lens=[f"jacobian={files['X'] / 'text.txt'}"]), "text.txt"),
        ("lens-fit-corpus-missing", lambda: mt.lens_fit(model=str(files["M"]), corpus=str(tmp / "missing"),
                                                        out=str(tmp / "l.safetensors")), "--corpus"),
    ]


API_IDS = ["direction-out-on-its-store", "probe-out-on-its-store", "probe-folds-0", "compare-layer-bogus",
           "extract-layers-99", "rank-table-lens-not-a-lens", "lens-fit-corpus-missing"]


@pytest.mark.parametrize("case", API_IDS)
def test_the_api_cases_of_the_issue_raise_one_memtoc_error_line(case, files, tmp_path, no_model):
    import warnings

    _, call, needle = next(c for c in _api_cases(files, tmp_path) if c[0] == case)
    before = digest(files["H"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)        # layer= is compare's old keyword
        with pytest.raises(MemtocError) as info:
            call()
    text = str(info.value)
    assert len(text.splitlines()) == 1 and needle in text, text
    assert digest(files["H"]) == before


def test_the_count_of_the_re_run() -> None:
    """N of N: the note of issue 37 reports this count (every case above must pass for it to hold)."""
    n = len(CLI_CASES) + len(API_IDS)
    assert len({c[0] for c in CLI_CASES}) == n - len(API_IDS)
    assert n >= 80
