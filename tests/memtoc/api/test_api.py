"""The Python API (``memtoc.api``, re-exported from ``memtoc``): the same records as the command line, callable
edits through the edit registry, results as DataFrames and arrays. Tiny random model throughout."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import memtoc as mt
from memtoc.cli import main
from memtoc.core.errors import MemtocError

SMALL = {"limit": 1, "max_new_tokens": 6, "conditions": "tool_wrong,tool_right", "progress": False}


def _without(records, key):
    return [{k: v for k, v in r.items() if k != key} for r in records]


@pytest.fixture(scope="module")
def base_run(tiny_backend, tmp_path_factory):
    return mt.evaluate(backend=tiny_backend, out=tmp_path_factory.mktemp("api") / "base", **SMALL)


def test_evaluate_gives_the_records_and_config_of_the_cli(tiny_model_dir, tmp_path, capsys) -> None:
    run = mt.evaluate(model=str(tiny_model_dir), benchmark="demo", limit=2, max_new_tokens=8, out=tmp_path / "api",
                      progress=False)
    assert main(["evaluate", "--model", str(tiny_model_dir), "--benchmark", "demo", "--limit", "2",
                 "--max-new-tokens", "8", "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    cli = mt.Run.open(tmp_path / "cli")
    assert len(run.records) == 12 and run.records == cli.records
    doc = {k: json.loads((p / "run.json").read_text())["config"] for k, p in (("a", run.path), ("c", cli.path))}
    assert {k: v for k, v in doc["a"].items() if k != "out"} == {k: v for k, v in doc["c"].items() if k != "out"}
    # the metric table as a DataFrame: the job's own table, row for row
    df = run.metrics.to_pandas()
    table = run.result.table.to_dict()["metrics"]
    row = df[(df.metric == "incorrect_tool_following") & (df.formulation == "reference")].iloc[0]
    cell = table["incorrect_tool_following"]["per_formulation"]["reference"]
    assert (row.k, row.n) == (cell["k"], cell["n"])
    assert set(df.metric) == set(table) and len(run.to_pandas()) == 12


def test_unknown_and_missing_options_are_refused() -> None:
    with pytest.raises(mt.APIError, match="takes no option.*limitt.*it takes.*limit"):
        mt.evaluate(limitt=3)
    with pytest.raises(mt.APIError, match="exactly one of fold"):
        mt.direction("acts.h5", contrast="tool_wrong:tool_right")
    with pytest.raises(mt.APIError, match="function_edit"):
        mt.evaluate(edit=lambda site, h, pos: h)


def test_field_names_and_flag_words_fill_the_same_options(monkeypatch, tmp_path) -> None:
    """``mt.direction`` takes the command line's words, ``position_kinds=``/``edit_positions=``, which are the config's
    field names; the fields' older names (``position_kind=``, ``positions=``) are refused in one line naming them,
    alone or beside the option; exactly one training split."""
    import dataclasses
    import warnings
    from types import SimpleNamespace

    import memtoc.jobs.direction as job

    seen = []
    monkeypatch.setattr(job, "run_direction", lambda cfg: seen.append(cfg) or SimpleNamespace(result=None, path="d"))
    monkeypatch.chdir(tmp_path)                 # the store exists (the API checks inputs before the job, as the CLI)
    (tmp_path / "acts.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(32))
    common = dict(contrast="tool_wrong:tool_right", fold="A", out=tmp_path / "d.json")
    with warnings.catch_warnings(), pytest.raises(mt.APIError, match=r"takes no option\(s\) position_kind, "
                                                                     r"positions; it takes .*\bposition_kinds\b"):
        warnings.simplefilter("error")
        mt.direction("acts.h5", position_kind="all", positions="tool_span", **common)
    mt.direction("acts.h5", position_kinds="all", edit_positions="tool_span", **common)
    (new,) = seen
    assert (new.position_kinds, new.edit_positions) == ("all", "tool_span")
    assert {"position_kinds", "edit_positions"} <= {f.name for f in dataclasses.fields(new)}
    with pytest.raises(mt.APIError, match=r"takes no option\(s\) positions; it takes .*\bedit_positions\b"):
        mt.direction("acts.h5", positions="tool_span", edit_positions="last_input", **common)
    with pytest.raises(mt.APIError, match=r"exactly one of fold, split_questions, all_questions \(the "
                                          r"training split\); got fold, all_questions"):
        mt.direction("acts.h5", all_questions=True, **common)
    assert len(seen) == 1


def _push(scale: float, d: int, site: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(site)
    u = torch.randn(d, generator=g)
    u = u / u.norm()
    return u, scale * u


def test_a_callable_adding_a_vector_gives_the_records_of_the_direction_spec(tiny_backend, tmp_path) -> None:
    """Edited prompt and generated tokens (from_tool_return: the KV-cached steps and row compaction too)."""
    from steering.kinds.direction import DirectionEdit, save_direction_edit

    site, scale = 2, 3.0
    u, v = _push(scale, tiny_backend.parts.d_model, site)
    spec = save_direction_edit(tmp_path / "push.json", DirectionEdit.build(
        name="push", layers=[site], vectors={site: u}, scale={site: scale}, positions="from_tool_return"))

    def add_push(s, hidden, positions):
        return hidden + v.to(hidden)

    edit = mt.function_edit(add_push, layers=[site], positions="from_tool_return", name="push")
    by_fn = mt.evaluate(backend=tiny_backend, edit=edit, out=tmp_path / "fn", **SMALL)
    by_spec = mt.evaluate(backend=tiny_backend, edit=str(spec), out=tmp_path / "spec", **SMALL)
    assert by_fn.records == by_spec.records
    base = mt.evaluate(backend=tiny_backend, out=tmp_path / "base", **SMALL)
    assert _without(by_fn.records, "edit") != _without(base.records, "edit")   # the push changes answers
    ident = json.loads((by_fn.path / "run.json").read_text())["identity"]
    assert ident["edit_function_sha256"] == edit.spec["function_sha256"]


def test_an_identity_callable_gives_the_records_of_no_edit(tiny_backend, base_run, tmp_path) -> None:
    def keep(site, hidden, positions):
        assert hidden.shape[0] == positions.rows.shape[0] == positions.cols.shape[0]
        return hidden

    run = mt.evaluate(backend=tiny_backend, edit=mt.function_edit(keep, layers=[0, 1, 3],
                                                                  positions="from_tool_return"),
                      out=tmp_path / "keep", **SMALL)
    assert {r["edit"] for r in run.records} == {"keep"}
    assert _without(run.records, "edit") == _without(base_run.records, "edit")


def test_a_changed_function_is_refused_on_resume_naming_the_field(tiny_backend, tmp_path) -> None:
    def nudge(site, hidden, positions):
        return hidden * 1.0

    out = tmp_path / "nudge"
    mt.evaluate(backend=tiny_backend, edit=mt.function_edit(nudge, layers=[1]), out=out, **SMALL)
    mt.evaluate(backend=tiny_backend, edit=mt.function_edit(nudge, layers=[1]), out=out, **SMALL)   # resumes

    def nudge_v2(site, hidden, positions):
        return hidden * 2.0

    changed = mt.function_edit(nudge_v2, layers=[1], name="nudge")
    with pytest.raises(MemtocError, match="edit_function_sha256"):
        mt.evaluate(backend=tiny_backend, edit=changed, out=out, **SMALL)


def test_function_edit_strength_and_spec_file(tmp_path) -> None:
    from steering import EditSpecError, load_edit
    from steering.kinds.function import FunctionEdit, function_source_sha256

    def double(site, hidden, positions):
        return hidden * 2.0

    e = mt.function_edit(double, layers=1, strength=0.25)
    assert e.spec["function_sha256"] == function_source_sha256(double)
    assert e.spec["function"].endswith("double")
    model = torch.nn.Linear(2, 2)
    h = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    rows, cols = torch.tensor([0, 1]), torch.tensor([2, 0])
    out = e.appliers(model)[1](h, rows, cols)
    want = h.clone()
    want[rows, cols] = h[rows, cols] * 1.25                  # h + 0.25 * (2h - h)
    assert torch.equal(out, want)
    assert e.with_strength(0.0).appliers(model) == {}       # strength 0: no hook at all
    e.save(tmp_path / "double.json")
    with pytest.raises(EditSpecError, match="field 'function'.*cannot be loaded from a spec file"):
        load_edit(tmp_path / "double.json")
    with pytest.raises(EditSpecError, match="function_sha256"):
        FunctionEdit({**e.spec, "function_sha256": "0" * 64}, fn=double)


def test_vector_edit_adds_the_vector(tiny_backend) -> None:
    v = torch.tensor([3.0, 4.0] + [0.0] * (tiny_backend.parts.d_model - 2))
    e = mt.vector_edit(v, layers=[1, 2], strength=2.0)
    assert e.kind == "direction" and set(e.layers) == {1, 2}
    assert torch.allclose(e.delta(1), 2.0 * v) and torch.allclose(e.delta(2), 2.0 * v)


def test_store_probe_direction_sweep_rank_table_compare(tiny_model_dir, tiny_backend, base_run, tmp_path) -> None:
    acts = mt.extract(backend=tiny_backend, model=str(tiny_model_dir), limit=2, conditions="tool_wrong,tool_right",
                      layers="all", position_kinds="last_input,tool_span", run=base_run, out=tmp_path / "acts.h5",
                      progress=False)
    with acts:
        from activations.store import open_store

        with open_store(tmp_path / "acts.h5") as raw:
            rows = raw.select(position_kind="last_input")
            assert np.array_equal(acts.read(2, positions="last_input"), raw.read(2, rows))
            x = acts.read(2, positions="last_input", xarray=True)
            assert x.dims == ("row", "d_model") and x.shape == (len(rows), raw.d_model)
            assert list(x.coords["row"].values) == list(rows)
            assert list(x.coords["condition"].values) == list(raw.index["condition"][rows])
            assert np.array_equal(x.sel(row=rows[0]).values, raw.read(2, [rows[0]])[0])
        assert len(acts.to_pandas()) == len(acts)
    # probe: the same report as `memtoc probe`
    opts = ["--label", "condition", "--positive", "tool_wrong", "--negative", "tool_right", "--folds", "2",
            "--n-boot", "20", "--no-progress"]
    pr = mt.probe(acts, label="condition", positive="tool_wrong", negative="tool_right", folds=2, n_boot=20,
                  progress=False, out=tmp_path / "probe_api")
    assert main(["probe", "--activations", str(acts.path), *opts, "--out", str(tmp_path / "probe_cli")]) == 0
    cli = json.loads((tmp_path / "probe_cli" / "probe.json").read_text())
    api = json.loads((tmp_path / "probe_api" / "probe.json").read_text())
    assert api["sites"] == cli["sites"]
    df = pr.to_pandas()
    assert list(df.site) == acts.layers and np.allclose(df.auroc_pooled, [s["auroc_pooled"] for s in cli["sites"]],
                                                        equal_nan=True)
    d = mt.direction(acts, contrast="tool_wrong:tool_right", all_questions=True, layers="2",
                     out=tmp_path / "dir.json")
    # a call without out= writes into a temporary folder that is gone when the interpreter exits
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    code = ("import os, memtoc as mt; d = mt.direction(os.environ['ACTS'], contrast='tool_wrong:tool_right', "
            "all_questions=True, layers='2'); assert os.path.exists(d.path), d.path; print(d.path)")
    env = {**os.environ, "TMPDIR": str(tmp), "ACTS": str(acts.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(tmp) in done.stdout and list(tmp.iterdir()) == []
    assert d.edit.kind == "direction" and list(d.to_pandas().site) == [2]
    sw = mt.sweep(d, strengths=[2], backend=tiny_backend, out=tmp_path / "sweep", plot=False, n_boot=20, **SMALL)
    table = sw.to_pandas()
    assert len(table) == 2 and set(sw.runs) == {0.0, 2.0}
    assert _without(sw.runs[0.0].records, "edit") == _without(base_run.records, "edit")   # strength 0 = untreated
    comp = mt.compare(base_run, sw.runs[2.0])
    assert "metric" in comp.to_pandas().columns and comp.verdict
    rt = mt.rank_table(base_run, model=str(tiny_model_dir), lens="logit", backend=tiny_backend, cell="all",
                       progress=False, out=tmp_path / "rank")
    assert (tmp_path / "rank" / "rank_table.csv").is_file()
    assert len(rt.to_pandas()) == len(rt.table.episodes)


def test_the_package_names_are_the_api_even_after_the_evaluator_module_is_imported() -> None:
    import memtoc.jobs.evaluate as module

    assert mt.evaluate is not module and mt.evaluate.__module__ == "memtoc.api.jobs"   # no submodule shares the name
    with pytest.raises(mt.APIError, match="takes no option"):
        mt.evaluate(not_an_option=1)
    with pytest.raises(AttributeError):
        mt.__getattr__("no_such_name")


def test_load_episodes_is_memtoc_episodes(tmp_path) -> None:
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    eps = mt.load_episodes(limit=2, conditions="tool_wrong,no_tool")
    want = build_episodes(load_benchmark("demo").select("all", 2), formulations=("reference",),
                          conditions=("tool_wrong", "no_tool"), frame=eps.frame)
    assert [e.to_dict() for e in eps] == [e.to_dict() for e in want] and len(eps) == 4
    assert main(["episodes", "--limit", "2", "--conditions", "tool_wrong,no_tool", "--out",
                 str(tmp_path / "e.jsonl")]) == 0
    cli = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert cli == [e.to_dict() for e in eps]
    assert list(eps.to_pandas().episode_id) == [e["episode_id"] for e in cli]
    with pytest.raises(mt.APIError, match="load_backend takes no option"):
        mt.load_backend("default", limit=3)


def test_a_run_opened_from_disk_has_the_jobs_metric_table(base_run) -> None:
    opened = mt.Run.open(base_run.path)
    assert opened.records == base_run.records
    assert opened.metrics.to_dict() == base_run.metrics.to_dict() == base_run.summary["metrics"]


def test_old_keywords_are_refused(base_run, tmp_path) -> None:
    """``compare`` takes ``out=``/``score_layer=`` (the command's flags, and the config's field names); the old
    ``output=`` and ``layer=`` are refused in one line naming them, and nothing is written."""
    import shutil

    twin = tmp_path / "twin"                       # one input given twice is refused: a copy of it
    shutil.copytree(base_run.path, twin)
    new = mt.compare(base_run, twin, out=tmp_path / "new.json", score_layer="deterministic")
    assert (tmp_path / "new.json").exists()
    with pytest.raises(mt.APIError, match=r"compare takes no option\(s\) output; it takes .*\bout\b"):
        mt.compare(base_run, twin, output=tmp_path / "old.json")
    assert not (tmp_path / "old.json").exists()
    same = mt.compare(base_run, twin, score_layer="deterministic")
    assert same.to_pandas().equals(new.to_pandas())
    with pytest.raises(mt.APIError, match=r"compare takes no option\(s\) layer; it takes .*\bscore_layer\b"):
        mt.compare(base_run, twin, layer="deterministic", score_layer="deterministic")
    params = inspect.signature(mt.compare).parameters
    assert "out" in params and "score_layer" in params and "output" not in params and "layer" not in params


def test_load_backend_chat_template_goes_into_the_spec_not_onto_a_shared_backend(tiny_model_dir) -> None:
    """``chat_template=False`` is ``--chat-template off``: the backend is loaded so (its spec says so), and a model
    kept for reuse (``keep_models``) is not switched under another caller's feet."""
    from memtoc.backends.factory import keep_models

    keep_models(True)
    try:
        auto = mt.load_backend(str(tiny_model_dir))
        raw = mt.load_backend(str(tiny_model_dir), chat_template=False)
        assert auto.chat is True                   # the tiny tokenizer has a chat template
        assert raw.chat is False and raw is not auto
        assert mt.load_backend(str(tiny_model_dir)).chat is True
    finally:
        keep_models(False)
