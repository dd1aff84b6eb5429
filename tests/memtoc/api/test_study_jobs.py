"""The remaining jobs in ``mt.*`` (SAE training, mining, lens fit, judge, ack, report, study): each lists its
command's options and writes what ``memtoc COMMAND`` writes. The command line is the reference throughout; tiny
random model."""

from __future__ import annotations

import csv
import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import memtoc as mt
from memtoc.cli import main

#: command -> its mt function; options whose keyword is spelled differently in Python
RENAMED = {"run_dir": "run", "arm": "arms"}
COMMANDS = {("sae", "train"): "sae_train", ("mine-features",): "mine_features", ("lens", "fit"): "lens_fit",
            ("judge",): "judge", ("ack", "export"): "ack_export", ("ack", "import"): "ack_import",
            ("report",): "report", ("study",): "study"}


def _dests(command) -> set[str]:
    """The options ``memtoc COMMAND`` takes, by their public names."""
    from memtoc.cli.parse import command_leaves, commands

    return {RENAMED.get(leaf.spec.public, leaf.spec.public) for leaf in command_leaves(commands()[" ".join(command)])}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_new_api_function_lists_its_commands_options(command) -> None:
    params = inspect.signature(getattr(mt, COMMANDS[command])).parameters
    assert sorted(_dests(command) - set(params)) == []
    with pytest.raises(mt.APIError, match=f"{COMMANDS[command]} takes no option.*bogus"):
        getattr(mt, COMMANDS[command])(**{p: "x" for p, v in params.items() if v.default is inspect._empty
                                           and v.kind != inspect.Parameter.VAR_KEYWORD}, bogus=1)


def _relabel(path: Path) -> None:
    """Alternate kept_memory / followed_tool by question so both behaviours exist on the tiny model."""
    recs = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    for r in recs:
        out = "kept_memory" if (int(float(r["question_id"])) // 2) % 2 == 0 else "followed_tool"
        r.update(outcome=out, kept_memory=out == "kept_memory", followed_tool=out == "followed_tool")
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")


def test_sae_train_and_mine_features_equal_the_command_line(tmp_path, tiny_backend, tiny_model_dir, capsys):
    common = dict(model=str(tiny_model_dir), benchmark="demo", formulations="reference,paraphrase_a",
                  conditions="tool_wrong", limit=6, device="cpu", dtype="float32", progress=False)
    run = mt.evaluate(backend=tiny_backend, out=tmp_path / "run", batch_size=6, max_new_tokens=8, **common)
    _relabel(run.path / "episodes.jsonl")
    acts = mt.extract(backend=tiny_backend, out=tmp_path / "acts.h5", layers="all", position_kinds="last_input,all",
                      run=run, batch_size=6, **common)
    train = dict(d_sae=64, k=8, steps=120, batch_size=128, lr=3e-3, threads=1)
    api = mt.sae_train(acts, layers=2, out=tmp_path / "sae_api", **train)
    assert main(["sae", "train", "--activations", str(acts.path), "--layers", "2", "--d-sae", "64", "--k", "8",
                 "--steps", "120", "--batch-size", "128", "--lr", "3e-3", "--threads", "1",
                 "--out", str(tmp_path / "sae_cli")]) == 0
    assert list(api) == [2]
    a, c = (load_file(next(Path(d).glob("*.safetensors"))) for d in (api[2], tmp_path / "sae_cli"))
    assert a.keys() == c.keys() and all(torch.equal(a[k], c[k]) for k in a)
    mine = dict(fit_fold="A", layers=[2], position_kinds="last_input", budget=0.5, steer_toward="memory")
    res = mt.mine_features(acts, sae={2: tmp_path / "sae_cli"}, run=run, out=tmp_path / "mine_api", **mine)
    assert main(["mine-features", "--activations", str(acts.path), "--run", str(run.path), "--sae",
                 f"2={tmp_path / 'sae_cli'}", "--layers", "2", "--position-kinds", "last_input", "--fit-fold", "A",
                 "--budget", "0.5", "--steer-toward", "memory", "--out", str(tmp_path / "mine_cli")]) == 0
    spec = json.loads((tmp_path / "mine_cli" / "edit.json").read_text(encoding="utf-8"))
    assert res.spec["features"] == spec["features"] and res.spec["features"]["2"]["remove"] + \
        res.spec["features"]["2"]["add"]
    rows = [list(csv.DictReader((tmp_path / d / "features.csv").open())) for d in ("mine_api", "mine_cli")]
    assert rows[0] == rows[1] and rows[0]


def test_lens_fit_equals_the_command_line(tmp_path, tiny_backend, tiny_model_dir):
    from probes.lens import JacobianLens

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The river runs past the old mill and on toward the sea in spring.\n"
                      "A quiet street of red houses leads up the hill to the church.\n", encoding="utf-8")
    opts = dict(corpus=str(corpus), skip_first=2, max_seq_len=20, layers="1-2", mode="one_row", progress=False)
    res = mt.lens_fit(backend=tiny_backend, out=tmp_path / "api.safetensors", **opts)
    assert res.complete
    assert main(["lens", "fit", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--out",
                 str(tmp_path / "cli.safetensors"), "--device", "cpu", "--skip-first", "2", "--max-seq-len", "20",
                 "--layers", "1-2", "--mode", "one_row", "--no-progress"]) == 0
    a, c = JacobianLens.load(tmp_path / "api.safetensors"), JacobianLens.load(tmp_path / "cli.safetensors")
    assert a.sites == c.sites == [1, 2]
    assert a.meta["model"] == c.meta["model"] == str(tiny_model_dir)     # the given backend's own name
    for s in a.sites:
        assert torch.allclose(a.matrices[s], c.matrices[s], atol=1e-6)


@pytest.fixture(scope="module")
def judged_runs(tiny_backend, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("judged")
    small = dict(limit=2, max_new_tokens=6, conditions="tool_wrong,tool_right,tool_error", progress=False)
    base = mt.evaluate(backend=tiny_backend, out=root / "base", **small)
    arm = mt.evaluate(backend=tiny_backend, out=root / "warn", prompt_intervention="warn", **small)
    for r in (base, arm):                       # the reference: the command line's judge pass, as copies
        shutil.copytree(r.path, root / f"cli-{r.path.name}")
        assert main(["judge", str(root / f"cli-{r.path.name}"), "--judge-model", str(tiny_model_dir),
                     "--device", "cpu", "--no-progress"]) == 0
    for r in (base, arm):
        mt.judge(r, judge_model=str(tiny_model_dir), device="cpu", progress=False)
    return root, base, arm


def _judge_records(path: Path) -> list[dict]:
    return sorted(({k: v for k, v in json.loads(x).items() if k not in ("created", "seconds")}
                   for x in path.read_text(encoding="utf-8").splitlines() if x.strip()), key=lambda r: r["request_id"])


def test_judge_report_and_study_equal_the_command_line(judged_runs, tmp_path):
    root, base, arm = judged_runs
    for name in ("base", "warn"):
        assert _judge_records(root / name / "judge.jsonl") == _judge_records(root / f"cli-{name}" / "judge.jsonl")
    stats = dict(n_boot=20, n_perm=200)
    study = mt.study(base, [f"warn={arm.path}"], score_layer="both", out=tmp_path / "api", **stats)
    assert set(study) == {"judged", "deterministic"}
    assert main(["study", "--base", str(base.path), "--arm", f"warn={arm.path}", "--score-layer", "both",
                 "--n-boot", "20", "--n-perm", "200", "--out", str(tmp_path / "cli")]) == 0
    for sub in ("", "deterministic"):
        a, c = (json.loads((tmp_path / d / sub / "study.json").read_text()) for d in ("api", "cli"))
        assert a == c and a["layer"] == (sub or "judged")
    rep = mt.report(base, out=tmp_path / "rep_api")
    assert main(["report", str(base.path), "--out", str(tmp_path / "rep_cli")]) == 0
    assert rep.markdown.read_text(encoding="utf-8") == (tmp_path / "rep_cli" / "report.md").read_text(encoding="utf-8")


def test_ack_export_and_import_equal_the_command_line(judged_runs, tmp_path):
    root, base, arm = judged_runs
    # the regex detector (the tiny judge's acknowledgment verdicts do not parse)
    info = mt.ack_export([base, arm], sheet=tmp_path / "api.csv", per_stratum=3, detector="regex",
                         score_layer="deterministic")
    assert main(["ack", "export", str(base.path), str(arm.path), "--sheet", str(tmp_path / "cli.csv"),
                 "--per-stratum", "3", "--detector", "regex", "--score-layer", "deterministic"]) == 0
    api_rows = list(csv.DictReader((tmp_path / "api.csv").open(encoding="utf-8-sig")))
    assert api_rows == list(csv.DictReader((tmp_path / "cli.csv").open(encoding="utf-8-sig")))
    assert info["n_items"] == len(api_rows) > 0 and info["key"] == str(tmp_path / "api.key.json")
    for i, r in enumerate(api_rows):                            # the annotator says yes to every other item
        r["ack"] = "yes" if i % 2 else "no"
    with (tmp_path / "labels.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(api_rows[0]))
        w.writeheader()
        w.writerows(api_rows)
    got = mt.ack_import(tmp_path / "api.key.json", labels=tmp_path / "labels.csv", out=tmp_path / "imp.json")
    assert main(["ack", "import", str(tmp_path / "api.key.json"), "--labels", str(tmp_path / "labels.csv"),
                 "--out", str(tmp_path / "imp_cli.json")]) == 0
    assert got == json.loads((tmp_path / "imp_cli.json").read_text()) == json.loads((tmp_path / "imp.json").read_text())
    assert got["n_consensus"] == len(api_rows)


@pytest.mark.parametrize("fn, old, new, value", [
    ("ack_import", "output", "out", "o.json"), ("ack_export", "layer", "score_layer", "deterministic"),
    ("study", "family", "holm_family", "model"), ("study", "layer", "score_layer", "both"),
    ("study", "model_pairs", "model_pair", ["a:b"]), ("judge", "output", "out", "judge_b.jsonl"),
])
def test_the_field_is_named_as_its_option_and_an_old_field_name_is_refused(fn, old, new, value, monkeypatch, tmp_path) -> None:
    """The API uses the command line's words, and the config's field has the same name (``score_layer``); a field's
    older name (``layer``) is refused in one line naming it, alone or beside the option, and nothing runs."""
    import importlib

    from memtoc.api import study_jobs

    monkeypatch.chdir(tmp_path)                 # the inputs exist (the API checks them before the job, as the CLI)
    for name in ("r", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text("{}", encoding="utf-8")
    for name in ("k.json", "s.csv"):
        (tmp_path / name).write_text("{}", encoding="utf-8")

    module, run = {"ack_import": ("memtoc.jobs.ack", "run_ack_import"), "ack_export": ("memtoc.jobs.ack", "run_ack_export"),
                   "study": ("memtoc.jobs.study.run", "run_study"), "judge": ("memtoc.jobs.judge", "run_judge")}[fn]
    seen = []
    monkeypatch.setattr(importlib.import_module(module), run, lambda cfg: seen.append(cfg) or _Stub())
    args = {"ack_import": (("k.json",), {"labels": "s.csv"}), "ack_export": ((["r"],), {"sheet": "s.csv"}),
            "study": ((["b"],), {}), "judge": (("r",), {})}[fn]
    with pytest.raises(mt.APIError, match=rf"takes no option\(s\) {old}; it takes .*\b{new}\b"):
        getattr(mt, fn)(*args[0], **args[1], **{old: value})
    getattr(mt, fn)(*args[0], **args[1], **{new: value})
    from memtoc.core.values import option_fields

    field = next(k for k, leaf in option_fields(type(seen[0])).items() if leaf.spec.public == new)
    assert getattr(seen[0], field) != getattr(type(seen[0])(**_required(fn)), field)
    assert field == new
    with pytest.raises(mt.APIError, match=rf"takes no option\(s\) {old};"):
        getattr(study_jobs, fn)(*args[0], **args[1], **{old: value, new: value})
    assert len(seen) == 1


def _required(fn: str) -> dict:
    return {"judge": {"run_dir": "r"}}.get(fn, {})


class _Stub:
    """Stands in for a job's result (the API reads ``by_layer`` of a study)."""

    def by_layer(self) -> dict:
        return {"judged": None, "deterministic": None, "both": None}
