"""The job layer (memtoc/jobs) and its three adapters: the command line, the Python API and recipes build the
same typed config and get the same records; the API lists its options, refuses bad keywords by name, resolves
a protocol from the fields actually given, and ``mt.compare`` stays free of torch and h5py."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memtoc as mt
from memtoc.cli import main

REPO = Path(__file__).resolve().parents[3]
SMALL = {"limit": 1, "max_new_tokens": 4, "conditions": "tool_wrong,tool_right", "progress": False}
SMALL_ARGV = ["--limit", "1", "--max-new-tokens", "4", "--conditions", "tool_wrong,tool_right", "--no-progress"]


def test_compare_imports_neither_torch_nor_h5py(tiny_backend, tmp_path) -> None:
    """``import memtoc as mt; mt.compare(a, b)`` on two real runs: pure statistics, no torch, no h5py."""
    a = mt.evaluate(backend=tiny_backend, out=tmp_path / "a", **SMALL).path
    b = mt.evaluate(backend=tiny_backend, out=tmp_path / "b", prompt_intervention="warn", **SMALL).path
    # sys.modules, not -X importtime: importtime misses modules loaded by importlib.import_module (the API
    # generates compare's signature from its config that way)
    code = (f"import sys, memtoc as mt; c = mt.compare({str(a)!r}, {str(b)!r}); assert c.to_pandas is not None; "
            "print(chr(10).join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    names = set(out.stdout.split())
    assert {"memtoc.api.jobs", "memtoc.jobs.compare", "memtoc.scoring.metrics"} <= names   # the call ran ...
    assert not {n for n in names if n.split(".")[0] in ("torch", "h5py")}                  # ... and nothing heavy


@pytest.mark.parametrize("fn, config", [
    ("evaluate", "memtoc.jobs.evaluate.EvaluationConfig"), ("extract", "memtoc.jobs.extract.ExtractConfig"),
    ("sweep", "memtoc.jobs.sweep.SweepConfig"), ("rank_table", "memtoc.jobs.rank_table.RankTableJobConfig"),
    ("probe", "memtoc.jobs.probe.ProbeConfig"), ("direction", "memtoc.jobs.direction.DirectionConfig"),
    ("compare", "memtoc.jobs.compare.CompareConfig"), ("load_episodes", "memtoc.jobs.episodes.EpisodesConfig"),
    ("load_backend", "memtoc.core.config.ModelSpec"), ("serve", "memtoc.jobs.serve.ServeConfig"),
])
def test_every_api_signature_lists_its_config_options_with_their_defaults(fn, config) -> None:
    import importlib

    from memtoc.core.values import option_fields

    module, _, name = config.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    params = inspect.signature(getattr(mt, fn)).parameters
    try:   # each option by its public name (the command line's flag without dashes), or still by its field's
        fields = {(leaf.spec.public if leaf.spec.public in params else k): leaf.default
                  for k, leaf in option_fields(cls).items()}
    except TypeError:
        fields = {}
    if not fields:
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
    # backend= is the loaded backend or the runtime's name; load_episodes returns the episodes (no out); what a
    # job does not take is its config's one list (NOT_TAKEN: extract captures the untreated model, no edit, no
    # adapter)
    not_taken = set(getattr(cls, "NOT_TAKEN", ()))
    missing = sorted(set(fields) - set(params) - ({"backend"} if fn != "load_backend" else set())
                     - ({"out"} if fn == "load_episodes" else set()) - not_taken)
    assert missing == []
    assert not not_taken & set(params)
    for k, default in fields.items():
        p = params.get(k)
        if p is None or k in ("backend", "out", "edit", "run", "run_a", "run_b", "activations", "label", "contrast",
                              "strengths"):
            continue
        shown = getattr(p.default, "value", p.default)
        assert shown == default, (fn, k, shown, default)


@pytest.mark.parametrize("call, key", [
    (lambda: mt.evaluate(limit=2.7), "limit"),
    (lambda: mt.evaluate(limit=True), "limit"),
    (lambda: mt.evaluate(limit="three"), "limit"),
    (lambda: mt.evaluate(backend="default"), "backend"),
    (lambda: mt.evaluate(out=5), "out"),
    (lambda: mt.evaluate(frame="nope"), "frame"),
    (lambda: mt.extract(max_new_tokens=1.5), "max_new_tokens"),
    (lambda: mt.load_benchmark(None), "name"),
    (lambda: mt.compare("a", "b", seed="x"), "seed"),
    (lambda: mt.rank_table("run", top_k=False), "top_k"),
    (lambda: mt.load_backend("default", limit=3), "limit"),
    (lambda: mt.serve(port=70000), "port"),
    (lambda: mt.serve(max_batch=0), "max_batch"),
])
def test_bad_keyword_values_are_one_error_naming_the_keyword(call, key) -> None:
    with pytest.raises(mt.APIError) as info:
        call()
    assert key in str(info.value) and "\n" not in str(info.value)


def test_a_protocol_fills_only_the_options_not_given(tiny_backend, tmp_path) -> None:
    """The issue-27 bug: ``protocol="paper", formulations="reference"`` ran all three formulations."""
    run = mt.evaluate(backend=tiny_backend, protocol="paper", formulations="reference", question_set="all",
                      out=tmp_path / "one", **SMALL)
    assert {r["formulation"] for r in run.records} == {"reference"}
    cfg = json.loads((run.path / "run.json").read_text())["config"]
    assert cfg["formulations"] == "reference" and cfg["max_new_tokens"] == 4
    from memtoc.cli.parse import parse_config
    from memtoc.jobs.evaluate import resolve_evaluation

    cli = resolve_evaluation(parse_config(["evaluate", "--out", "x", "--protocol", "paper", "--formulations",
                                           "reference"])[1])
    assert cli.selection.formulations == "reference" and cli.selection.question_set == "analysis"   # the paper's
    allf = mt.evaluate(backend=tiny_backend, protocol="paper", question_set="all", out=tmp_path / "all", **SMALL)
    assert {r["formulation"] for r in allf.records} == {"reference", "paraphrase_a", "paraphrase_b"}


def _store(path: Path) -> dict:
    from activations.store import open_store

    with open_store(path) as s:
        return {"layers": list(s.layers), "index": {k: list(map(str, v)) for k, v in s.index.items()},
                "x": {site: s.read(site) for site in s.layers}}


def _same_store(a: dict, b: dict) -> bool:
    return (a["layers"] == b["layers"] and a["index"] == b["index"]
            and all(np.array_equal(a["x"][s], b["x"][s]) for s in a["layers"]))


def _rank(path: Path) -> dict:
    doc = json.loads((path / "rank_table.json").read_text())
    return {"summary": doc["summary"], "episodes": doc["episodes"]}


def _sweep_rows(path: Path) -> list:
    return json.loads((path / "sweep.json").read_text())["rows"]


def test_cli_api_and_recipe_give_identical_records_for_the_four_jobs(tiny_model_dir, tmp_path) -> None:
    from memtoc.cli.recipes import run_experiment

    model = str(tiny_model_dir)
    cli, api = tmp_path / "cli", tmp_path / "api"
    # evaluate
    assert main(["evaluate", "--model", model, *SMALL_ARGV, "--out", str(cli / "run")]) == 0
    run = mt.evaluate(model=model, out=api / "run", **SMALL)
    # extract (labels joined from the run)
    ext = ["--layers", "all", "--position-kinds", "last_input"]
    assert main(["extract", "--model", model, *ext, *SMALL_ARGV, "--run", str(cli / "run"),
                 "--out", str(cli / "acts.h5")]) == 0
    mt.extract(model=model, layers="all", position_kinds="last_input", run=run, out=api / "acts.h5", **SMALL)
    # an edit for the sweeps: one direction spec shared by all three
    spec = mt.direction(api / "acts.h5", contrast="tool_wrong:tool_right", all_questions=True, layers="2",
                        out=tmp_path / "dir.json").path
    assert main(["sweep", "--edit", str(spec), "--model", model, "--strengths", "2", "--no-plot", "--n-boot", "20",
                 *SMALL_ARGV, "--out", str(cli / "sweep")]) == 0
    mt.sweep(str(spec), strengths=[2], model=model, plot=False, n_boot=20, out=api / "sweep", **SMALL)
    # rank table over the evaluate run (the logit lens: no fitted file)
    cell = next(r["cell"] for r in run.records if r["condition"] == "tool_wrong")   # the cell the run has
    rt = ["--lens", "logit", "--cell", cell, "--answer", "gold", "--no-progress"]  # gold: ranked whatever it recalls
    assert main(["rank-table", "--model", model, "--run", str(cli / "run"), *rt, "--out", str(cli / "rank")]) == 0
    mt.rank_table(run, model=model, lens="logit", cell=cell, answer="gold", progress=False, out=api / "rank")
    # the recipe: the same four steps
    recipe = tmp_path / "four.toml"
    recipe.write_text(f'''name = "four"
description = "the four jobs"
[defaults]
limit = 1
max_new_tokens = 4
conditions = "tool_wrong,tool_right"
no_progress = true
[[steps]]
name = "run"
command = "evaluate"
out = "run"
[[steps]]
name = "acts"
command = "extract"
out = "acts.h5"
args = {{ layers = "all", position_kinds = "last_input", run = "${{run}}" }}
[[steps]]
name = "sweep"
command = "sweep"
out = "sweep"
args = {{ edit = "{spec}", strengths = "2", no_plot = true, n_boot = 20 }}
[[steps]]
name = "rank"
command = "rank-table"
out = "rank"
args = {{ run = "${{run}}", lens = "logit", cell = "{cell}", answer = "gold" }}
''', encoding="utf-8")
    res = run_experiment(recipe, out=tmp_path / "rec", model=model, report=False, log=lambda s: None)
    assert res.ok, res.steps
    rec = tmp_path / "rec"
    # identical records, job by job
    runs = [mt.Run.open(d / "run").records for d in (cli, api, rec)]
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) == 2
    stores = [_store(d / "acts.h5") for d in (cli, api, rec)]
    assert _same_store(stores[0], stores[1]) and _same_store(stores[0], stores[2])
    rows = [_sweep_rows(d / "sweep") for d in (cli, api, rec)]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 2
    dirs = [sorted(p.name for p in (d / "sweep").glob("strength_*")) for d in (cli, api, rec)]
    assert dirs[0] == dirs[1] == dirs[2] and len(dirs[0]) == 2
    for name in dirs[0]:
        strength = [mt.Run.open(d / "sweep" / name).records for d in (cli, api, rec)]
        assert strength[0] == strength[1] == strength[2]
    ranks = [_rank(d / "rank") for d in (cli, api, rec)]
    assert ranks[0] == ranks[1] == ranks[2] and ranks[0]["episodes"]
