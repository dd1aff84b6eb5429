"""The patching job (memtoc patch / mt.patch) on a tiny model's run of the demo set.

Independent checks: patching the last block's output at the final position makes the corrupt run's logits the
clean run's (the rest of the network reads only that vector), so its exact effect is each pair's whole
clean - corrupt gap; a role that is identical in both prompts (the question, which precedes the tool output)
changes nothing at the first block.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import memtoc as mt
from memtoc.cli import main
from memtoc.jobs.evaluate import EvaluationConfig, evaluate
from memtoc.jobs.patch import PatchConfig, run_patch
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec


@pytest.fixture(scope="module")
def pair_run(tiny_backend, tiny_model_dir, tmp_path_factory) -> Path:
    """A tiny run of tool_right and tool_wrong whose closed-book answers are made the gold answers (a random
    model's own are mostly empty), so every question has a memory answer to patch toward."""
    root = tmp_path_factory.mktemp("patch") / "run"
    evaluate(EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", formulations="reference", conditions="tool_right,tool_wrong",
                                   limit=3),
        job=JobSettings(out=str(root), progress=False), generation=GenerationConfig(batch_size=6, max_new_tokens=4)), backend=tiny_backend, log=lambda s: None)
    path = root / "episodes.jsonl"
    recs = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    for r in recs:
        r.update(memory_span=r["gold_answer"], mem_absent=False)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return root


def test_exact_patching_of_the_last_block_at_the_final_token_restores_the_clean_metric(pair_run, tiny_backend,
                                                                                        tmp_path) -> None:
    n = tiny_backend.parts.n_layers
    res = run_patch(PatchConfig(run=str(pair_run), out=str(tmp_path / "p"), method="exact", components="resid,attn",
                                progress=False, n_boot=50), backend=tiny_backend)
    # a pair whose two answers start with the same token has no decision to read: skipped, and counted
    assert res.meta["n_pairs"] >= 2 and res.meta["n_pairs"] + sum(res.meta["skipped"].values()) == 3
    by = {(r["name"], r["role"]): r for r in res.table}
    last = by[(f"blocks.{n - 1}.hook_resid_post", "final")]
    gaps = res.meta["mean_clean_metric"] - res.meta["mean_corrupt_metric"]
    assert last["exact_effect"] == pytest.approx(gaps, abs=1e-4)
    assert last["exact_normalised"] == pytest.approx(1.0, abs=1e-4)
    assert by[("blocks.0.hook_resid_post", "question")]["exact_effect"] == pytest.approx(0.0, abs=1e-6)
    pairs = [r for r in res.pairs if r["name"] == f"blocks.{n - 1}.hook_resid_post" and r["role"] == "final"]
    assert all(abs(r["effect"] - (r["clean_metric"] - r["corrupt_metric"])) < 1e-4 for r in pairs)
    for key in ("json", "csv", "pairs", "markdown", "plot", "attention", "dla"):
        assert res.files[key].is_file() and res.files[key].stat().st_size > 0
    # direct logit attribution: the components of each condition add up to that condition's mean metric
    for cond, metric in (("tool_right", res.meta["mean_clean_metric"]), ("tool_wrong", res.meta["mean_corrupt_metric"])):
        total = sum(r["dla"] for r in res.dla if r["condition"] == cond and r["head"] is None)
        assert total == pytest.approx(metric, abs=1e-3)
    heads = [r for r in res.attention if r["condition"] == "tool_wrong"]
    assert len(heads) == n * tiny_backend.model.config.num_attention_heads
    assert all(0.0 <= r["attention_to_tool_span"] <= 1.0 + 1e-6 for r in heads)


def test_both_methods_confirm_the_top_cells_and_report_agreement(pair_run, tiny_backend, tmp_path) -> None:
    res = mt.patch(pair_run, backend=tiny_backend, out=tmp_path / "p", top_cells=5, progress=False, n_boot=50,
                   heads=False)
    confirmed = [r for r in res.table if "exact_effect" in r]
    assert 1 <= len({(r["name"], r["role"]) for r in confirmed}) <= 5 * 3
    assert all("attribution_effect" in r for r in res.table)
    ag = res.meta["agreement"]
    assert ag["n_cells"] >= 3 and -1.0 <= ag["spearman"] <= 1.0
    frame = res.to_pandas()
    assert {"name", "role", "attribution_effect"} <= set(frame.columns)
    # the confirmed cells are the largest by |mean attribution|
    attr = sorted(res.table, key=lambda r: -abs(r["attribution_effect"]) if not np.isnan(r["attribution_effect"])
                  else 0)
    assert {(r["name"], r["role"]) for r in attr[:5]} <= {(r["name"], r["role"]) for r in confirmed}


def test_the_command_line_refuses_bad_values_before_any_model(pair_run, tmp_path, capsys, monkeypatch) -> None:
    """Values that need no weights (the block range needs only the GGUF header) are refused before a load."""
    import memtoc.backends.factory as factory

    def no_load(*a, **k):
        raise AssertionError("the model loader was reached")

    monkeypatch.setattr(factory, "load_backend", no_load)
    for argv, msg in ((["--pair", "tool_right:tool_right"], "two different conditions"),
                      (["--components", "resid,heads"], "--components"),
                      (["--layers", "99"], "this model has sites 1..30 to patch"),
                      (["--top-cells", "0"], "--top-cells 0"),
                      (["--out", str(pair_run / "inside")], "inside the input")):
        rc = main(["patch", "--run", str(pair_run), "--out", str(tmp_path / "o"), "--model", "default", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not (tmp_path / "o").exists() and not (pair_run / "inside").exists()


def _mixed_result():
    from memtoc.jobs.patch import PatchJobResult

    table = []
    for block in range(3):
        for comp in ("resid", "attn"):
            for role in ("tool_span", "last_input"):
                row = {"name": f"blocks.{block}.hook_{comp}", "component": comp, "block": block, "site": block + 1,
                       "role": role,
                       "attribution_effect": (-1.0) ** block * (block + 1)}
                if block == 2 and role == "tool_span":          # the confirmed cells: exact measured, other sign
                    row["exact_effect"] = -0.5
                table.append(row)
    meta = {"pair": {"clean": "tool_right", "corrupt": "tool_wrong"}, "n_pairs": 2, "n_questions": 2,
            "metric": "logit diff", "mean_clean_metric": 1.0, "mean_corrupt_metric": -1.0,
            "agreement": {"n_cells": 2, "spearman": -0.4, "top_half_overlap": 0.5}}
    return PatchJobResult(table=table, pairs=[], meta=meta)


def test_the_heat_map_keeps_exact_and_attribution_values_apart(tmp_path) -> None:
    """Exact effects and attribution estimates are different quantities: each gets its own panel (named by kind),
    never one colour field where an estimate sits beside a measurement."""
    from memtoc.jobs.patch import heat_panels, plot_patch

    res = _mixed_result()
    titles = plot_patch(res, tmp_path / "patch.png")
    assert (tmp_path / "patch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert titles == ["resid: attribution (first-order estimate)", "attn: attribution (first-order estimate)",
                      "resid: exact (patched)", "attn: exact (patched)"]
    exact = {p["component"]: p["grid"] for p in heat_panels(res) if p["kind"] == "exact_effect"}
    attribution = {p["component"]: p["grid"] for p in heat_panels(res) if p["kind"] == "attribution_effect"}
    for comp in ("resid", "attn"):
        assert np.isfinite(exact[comp]).sum() == 1 and exact[comp][2, 0] == -0.5     # only what was patched
        assert np.isfinite(attribution[comp]).all() and attribution[comp][2, 0] == 3.0


def test_the_report_names_its_spearman_as_the_confirmed_cells_one() -> None:
    from memtoc.jobs.patch import to_markdown

    text = to_markdown(_mixed_result())
    assert "confirmed-cell Spearman" in text and "not the all-cell Spearman of docs/BENCHMARKS.md" in text


def test_patch_layers_are_the_sites_extract_captures(tiny_backend) -> None:
    """``--layers`` counts sites in patch as in extract (site s = output of block s-1): the hook point patch reads
    for ``--layers S`` holds exactly the state a capture stores at site S; site 0 (the embedding output) is
    refused with the range."""
    import torch

    from activations.capture import ResidualCapture, parse_layers
    from memtoc.backends.plans import HookPlan
    from memtoc.core.values import ConfigError
    from memtoc.jobs.patch import parse_blocks
    from probes.patching import hook_names_for

    parts = tiny_backend.parts
    n = parts.n_layers
    prompts = ["What is the capital of France?"]
    ids = list(tiny_backend.encode(prompts).rows[0])
    for spec in ("1", "2", f"{n}", f"1-{n}"):
        sites = parse_layers(spec, n + 1)                               # what extract --layers SPEC captures
        names = hook_names_for(n, ["resid"], parse_blocks(spec, n))      # what patch --layers SPEC patches
        assert len(names) == len(sites)
        cap = ResidualCapture(sites, "last_input", prompts=prompts)
        tiny_backend.forward(prompts, capture=cap)
        seen = {}
        with torch.no_grad(), parts.intervene(None, HookPlan(lambda k, v: seen.__setitem__(k, v[0, -1].clone()),
                                                              names=names)):
            parts.forward(input_ids=torch.tensor([ids]))
        for site, name in zip(sites, names):
            torch.testing.assert_close(seen[name], cap.values[site][0], rtol=1e-5, atol=1e-5)
    assert parse_blocks("all", n) is None
    with pytest.raises(ConfigError, match=f"sites 1..{n} to patch"):
        parse_blocks("0", n)


def test_write_patch_writes_a_nan_cell_as_null_in_strict_json(tmp_path) -> None:
    """A cell with nothing behind it (NaN: every pair's gap was ~0, so no normalised effect) is written as null:
    the JSON stays strict (a strict parser reads it back) and the other files are written too."""
    from memtoc.jobs.patch import write_patch

    res = _mixed_result()
    res.table[0]["attribution_normalised"] = float("nan")
    res.table[1]["attribution_effect"] = np.float64("nan")
    res.meta["agreement"]["spearman"] = float("nan")                  # constant ranks: no correlation
    files = write_patch(res, tmp_path / "p")

    def refuse(token: str) -> None:
        raise AssertionError(f"non-strict JSON constant {token}")

    doc = json.loads(files["json"].read_text(encoding="utf-8"), parse_constant=refuse)
    assert doc["table"][0]["attribution_normalised"] is None and doc["table"][1]["attribution_effect"] is None
    assert doc["table"][2]["attribution_effect"] == res.table[2]["attribution_effect"]
    assert doc["meta"]["agreement"] == {"n_cells": 2, "spearman": None, "top_half_overlap": 0.5}
    assert all(files[k].is_file() and files[k].stat().st_size > 0 for k in ("csv", "markdown", "plot"))
