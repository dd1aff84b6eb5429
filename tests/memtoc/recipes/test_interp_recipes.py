"""The interpretability recipes under the paper protocol (MemToC App. C: sae_steering.toml; App. H: rank_table.toml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memtoc.cli import main

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.real_model
@pytest.mark.slow
def test_sae_steering_recipe_quick_on_the_default_model(tmp_path):
    from activations.store import open_store
    from memtoc.bench.paper_protocol import sae_sites

    out = tmp_path / "sae"
    assert main(["run-experiment", str(REPO / "experiments" / "sae_steering.toml"), "--quick", "--out", str(out),
                 "--no-report"]) == 0
    state = json.loads((out / "experiment.json").read_text())
    assert state["ok"] and [s["status"] for s in state["steps"]] == ["ok"] * 6
    with open_store(out / "acts" / "acts.h5") as st:          # the paper's Llama Scope band, rescaled to 30 blocks
        assert st.layers == list(sae_sites(st.attrs["architecture"], int(st.attrs["n_layers"]))) == [12, 13, 14, 15]
    spec = json.loads((out / "mined" / "edit.json").read_text())
    assert spec["fvu_rows"] == "sequence" and all(v < 0.5 for v in spec["fvu"].values())
    assert spec["source"]["budget"] == 0.5                     # the paper's headline run (K = 0.5)
    for direction in ("memory", "tool"):
        md = (out / f"sweep_{direction}" / "sweep.md").read_text(encoding="utf-8")
        assert "| toward_memory | toward_tool |" in md and "+0.15" in md
        doc = json.loads((out / f"sweep_{direction}" / "sweep.json").read_text())
        assert doc["direction"] == direction
        row = doc["rows"][-1]["flips"]
        assert row["dev_per_direction"] == 40 and row["bar"] == 0.15
        # dev sets picked by the labelling run (runs/labels), the strength-0 baseline measured on them
        fold_b = {r["episode_id"] for r in _records(out / f"sweep_{direction}" / "strength_0")
                  if r["condition"] == "tool_wrong" and r["cell"] == "arb"}
        for name, base in (("toward_memory", "followed_tool"), ("toward_tool", "kept_memory")):
            base_n = sum(1 for r in _records(out / "runs" / "labels") if r["episode_id"] in fold_b
                         and r["condition"] == "tool_wrong" and r["cell"] == "arb" and r["outcome"] == base)
            assert row[name]["n"] <= min(base_n, 40) and row[name]["baseline_by_construction"] is False


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow       # about 3 min on two cores (`make test-slow`); each step's job has its own default-model test
@pytest.mark.real_model
def test_rank_table_recipe_quick_on_the_default_model(tmp_path):
    """The whole App. H recipe with a Jacobian lens on the default model."""
    from probes.lens import JacobianLens

    out = tmp_path / "rank"
    assert main(["run-experiment", str(REPO / "experiments" / "rank_table.toml"), "--quick", "--out", str(out),
                 "--no-report"]) == 0
    table = json.loads((out / "rank_table" / "rank_table.json").read_text())
    # SmolLM2 is a Llama-architecture model the paper did not study: the band says it was rescaled
    assert table["meta"]["band"] == ("the paper's llama band (32 blocks) rescaled to this model's 30 blocks (a "
                                     "model the paper did not study)")
    assert table["meta"]["sites"] == list(range(9, 28))       # blocks 8-28 rescaled to 30 blocks: 8-26
    # the quick lens was fitted on the table's default band (lens fit --layers default), so it covers every site
    assert JacobianLens.load(out / "lens" / "jacobian_lens.safetensors").sites == table["meta"]["sites"]
    assert any({"jacobian", "logit"} <= set(ep["lenses"]) for ep in table["episodes"])
    md = (out / "rank_table" / "rank_table.md").read_text(encoding="utf-8")
    assert "## Table 8" in md and "Followed: median, all subtokens" in md and "paper: Qwen2.5-7B-Instruct" in md
    for ep in table["episodes"]:
        for d in ep["lenses"].values():
            assert d["rank_subtoken"] <= d["rank"]


def test_recipe_options_reach_only_their_step():
    """``--set edit_positions=tool_span`` (the paper's tool-output-span probe) reaches mine-features alone;
    ``layers = "paper"`` reaches extract, sae train and mine-features."""
    from memtoc.cli.recipes import step_argv
    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(REPO / "experiments" / "sae_steering.toml")
    refs = {st.name: f"/x/{st.name}" for st in recipe.steps}
    argvs = {}
    for st in recipe.steps:
        options = {**recipe.defaults, **st.args, "edit_positions": "tool_span"}
        argvs[st.name] = step_argv(st, options, refs)
    with_span = {n for n, a in argvs.items() if "--edit-positions" in a}
    assert with_span == {"mine"} and argvs["mine"][argvs["mine"].index("--edit-positions") + 1] == "tool_span"
    assert {n for n, a in argvs.items() if "--layers" in a} == {"extract", "sae", "mine"}
    assert all(a[a.index("--layers") + 1] == "paper" for a in argvs.values() if "--layers" in a)
    for name in ("sweep_memory", "sweep_tool"):
        a = argvs[name]
        assert a[a.index("--strengths") + 1] == "0,1,2,3,4,5,6,7,8,9,10,11,12"
        assert a[a.index("--dev-per-direction") + 1] == "40"
        assert a[a.index("--dev-labels") + 1] == "/x/evaluate"        # the labelling run picks the dev sets
    assert argvs["mine"][argvs["mine"].index("--budget") + 1] == "0.5"
    assert argvs["mine"][argvs["mine"].index("--sae") + 1] == "paper"
    assert argvs["mine"][argvs["mine"].index("--sae-fallback") + 1] == "/x/sae"
