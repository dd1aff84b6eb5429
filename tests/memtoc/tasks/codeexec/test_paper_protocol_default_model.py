"""``experiments/codeexec_probe_and_steer.toml --quick`` on the default model, end to end: trajectories labelled by
what the model did, the outcome probe, the three-site direction with |gap| scale, greedy and sampled sweeps, and
the paper table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activations.store import open_store

RECIPE = Path(__file__).resolve().parents[4] / "experiments" / "codeexec_probe_and_steer.toml"


@pytest.mark.real_model
@pytest.mark.slow
def test_paper_protocol_quick_on_the_default_model(default_backend, tmp_path):
    from memtoc.cli import main

    out = tmp_path / "exp"
    assert main(["run-experiment", str(RECIPE), "--quick", "--out", str(out)]) == 0
    with open_store(out / "acts" / "trajectories_all.h5") as store:
        outcomes = set(store.index["outcome"].tolist())
    # labels are what the model did after its first tool return (P0 returns are accepted)
    assert "accepted" in outcomes and outcomes <= {"accepted", "adopted", "rejected", "no_answer", "ambiguous"}
    probe = json.loads((out / "probe" / "adopted_vs_accepted" / "probe.json").read_text())
    # --quick probes the condition: the default model adopts too few corrupted values in 10 problems
    assert probe["meta"]["label"] == "condition" and probe["meta"]["positive"] == "P1"
    edit = json.loads((out / "direction" / "edit.json").read_text())
    assert edit["layers"] == [1, 2, 3] and edit["source"]["scale"] == "|projection gap|"
    assert all(v > 0 for v in edit["scale"].values())
    table = json.loads((out / "table" / "paper_table.json").read_text())
    summary = json.loads((out / "runs" / "all" / "summary.json").read_text())
    p1 = next(r for r in summary["rows"] if r["condition"] == "P1")
    assert table["behaviour"]["P1_adoption"]["value"] == p1["adoption"]["value"]
    assert [r["alpha"] for r in table["steering"]["greedy"]] == [-1.0, 0.0, 1.0]
    assert table["steering"]["sampled_repetitions"] == 3
    md = (out / "table" / "paper_table.md").read_text()
    assert "35.5%" in md and "0.997" in md
