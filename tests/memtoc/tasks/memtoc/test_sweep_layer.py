"""``memtoc sweep --score-layer judged``: the sweep table from the judged layer, by the code path of ``metrics``/``compare``."""

from __future__ import annotations

import json

import torch

from memtoc.cli import main
from memtoc.scoring.judge.layer import layer_records
from memtoc.jobs.judge import JudgeConfig, run_judge
from memtoc.runs.runstore import iter_jsonl
from steering import DirectionEdit
from steering.kinds.direction import save_direction_edit
from memtoc.tasks.memtoc.sweep import strength_row


def _unit(d, seed):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g)
    return v / v.norm()


def test_sweep_judged_layer(tiny_backend, tiny_model_dir, tmp_path, capsys):
    edit = DirectionEdit.build(name="layer-test", layers=[1], vectors={1: _unit(32, 3)}, scale={1: 3.0},
                               positions="last_input", strength=1.0, toward="memory")
    spec = save_direction_edit(tmp_path / "edit.json", edit)
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--edit", str(spec),
            "--strengths", "0,6", "--benchmark", "demo", "--conditions", "tool_wrong,tool_right", "--limit", "3",
            "--batch-size", "6", "--max-new-tokens", "8", "--n-boot", "50", "--no-progress", "--no-plot",
            "--out", str(out)]
    # the judged layer needs every strength judged first: a clear error, no traceback
    assert main(argv + ["--score-layer", "judged"]) == 2
    err = capsys.readouterr().err
    assert "judge.jsonl is missing" in err and "Traceback" not in err
    assert main(argv) == 0
    det = json.loads((out / "sweep.json").read_text())
    assert det["layer"] == "deterministic"
    for s in ("strength_0", "strength_6"):
        run_judge(JudgeConfig(run_dir=str(out / s), judge_model=str(tiny_model_dir), device="cpu", dtype="float32",
                              batch_size=8, progress=False), backend=tiny_backend, log=lambda m: None)
    assert main(argv + ["--score-layer", "judged"]) == 0
    doc = json.loads((out / "sweep_judged.json").read_text())
    assert doc["layer"] == "judged" and doc["judge"]["model"] == str(tiny_model_dir)
    assert (out / "sweep_judged.md").is_file() and (out / "sweep_judged.csv").is_file()
    assert json.loads((out / "sweep.json").read_text())["rows"] == det["rows"]   # the deterministic table stays
    # the rows are the sweep's row function over the judged layer of every strength's records
    recs = {s: layer_records(list(iter_jsonl(out / f"strength_{s:g}" / "episodes.jsonl")), "judged",
                             run_dir=out / f"strength_{s:g}").records for s in (0.0, 6.0)}
    from memtoc.tasks.memtoc.sweep import SweepConfig

    dev = SweepConfig().sweep.dev_per_direction or None          # the sweep's per-direction dev set (App. C: 40)
    expected = [strength_row(s, spec_s, recs[s], recs[0.0], n_boot=50, n_perm=10000, seed=0, dev_per_direction=dev)
                for s, spec_s in ((0.0, 0.0), (6.0, 6.0))]
    assert json.loads(json.dumps(expected)) == doc["rows"]


def test_sweep_dev_labels_pick_the_dev_sets_from_the_labelling_run(tiny_model_dir, tmp_path):
    """``sweep --dev-labels RUN``: the per-direction dev sets come from the labelling run's outcomes and the
    strength-0 baseline is measured on them (App. C), by the same flip_stats the unit tests pin."""
    from memtoc.tasks.memtoc.sweep import flip_stats

    edit = DirectionEdit.build(name="labels-test", layers=[1], vectors={1: _unit(32, 4)}, scale={1: 3.0},
                               positions="last_input", strength=1.0, toward="memory")
    spec = save_direction_edit(tmp_path / "edit.json", edit)
    common = ["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32", "--benchmark", "demo",
              "--conditions", "tool_wrong", "--limit", "3", "--batch-size", "6", "--max-new-tokens", "6",
              "--no-progress"]
    labels = tmp_path / "labels"
    assert main(["evaluate", *common, "--out", str(labels)]) == 0
    out = tmp_path / "sweep"
    assert main(["sweep", *common, "--edit", str(spec), "--strengths", "0,6", "--n-boot", "20", "--no-plot",
                 "--dev-labels", str(labels), "--out", str(out)]) == 0
    doc = json.loads((out / "sweep.json").read_text())
    lab = list(iter_jsonl(labels / "episodes.jsonl"))
    recs = {s: list(iter_jsonl(out / f"strength_{s}" / "episodes.jsonl")) for s in ("0", "6")}
    expected = flip_stats(recs["0"], recs["6"], n_boot=20, seed=0, dev_per_direction=40, labels=lab)
    got = doc["rows"][-1]["flips"]
    for name in ("toward_memory", "toward_tool"):
        assert got[name]["baseline_by_construction"] is False
        assert got[name]["n"] == expected[name]["n"] and got[name]["baseline"] == expected[name]["baseline"]
