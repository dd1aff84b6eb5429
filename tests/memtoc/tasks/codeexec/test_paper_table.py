"""``codeexec table`` reads the study's outputs and prints them beside the paper's numbers (constructed files)."""

from __future__ import annotations

import json

import pytest

from memtoc.tasks.codeexec.paper_table import PaperTableConfig, build_table, paper_numbers, to_markdown, write_table
from memtoc.core.errors import MemtocError


def _est(v, lo, hi, n=10):
    return {"value": v, "ci": {"low": lo, "high": hi}, "n_trials": n, "n_problems": n}


def _files(tmp_path):
    run, probe, sweep = tmp_path / "run", tmp_path / "probe", tmp_path / "sweep"
    for d in (run, probe, sweep):
        d.mkdir()
    (run / "run.json").write_text(json.dumps({"model_spec": "default", "provenance": {"model": "m"}}))
    (run / "summary.json").write_text(json.dumps({"n_problems": 10, "repetitions": 1, "rows": [
        {"condition": "no_tool", "accuracy": _est(0.5, 0.2, 0.8)},
        {"condition": "P0", "accuracy": _est(0.9, 0.7, 1.0)},
        {"condition": "P1", "accuracy": _est(0.4, 0.1, 0.7), "adoption": _est(0.3, 0.1, 0.6),
         "override": _est(0.25, 0.0, 0.5)},
        {"condition": "P2", "accuracy": _est(0.6, 0.3, 0.9), "adoption": _est(0.2, 0.0, 0.4),
         "override": {"value": float("nan"), "ci": {"low": float("nan"), "high": float("nan")}}}]}))
    sites = [{"site": s, "auroc_pooled": a, "ci_low": a - 0.1, "ci_high": min(1.0, a + 0.1)}
             for s, a in ((0, 0.5), (1, 0.7), (2, 0.8), (3, 0.9), (4, 0.95))]
    (probe / "probe.json").write_text(json.dumps({"meta": {"n_positive": 7, "n_negative": 12, "positive": "adopted",
                                                           "negative": "accepted", "label": "outcome"},
                                                  "sites": sites}))

    def row(a, p0, p1a, p1c):
        return {"strength": a, "conditions": {
            "P0": {"accuracy": {"value": p0}, "d_accuracy": {"delta": p0 - 0.9}},
            "P1": {"accuracy": {"value": p1c}, "adoption": {"value": p1a}, "d_adoption": {"delta": p1a - 0.3},
                   "d_accuracy": {"delta": p1c - 0.4}}}}
    (sweep / "sweep.json").write_text(json.dumps({"edit": {"name": "e", "layers": [1, 2, 3]},
                                                  "rows": [row(0.0, 0.9, 0.3, 0.4), row(-1.0, 0.8, 0.5, 0.3),
                                                           row(1.0, 0.85, 0.1, 0.5)]}))
    return run, probe, sweep


def test_table_cells_come_from_the_files(tmp_path):
    run, probe, sweep = _files(tmp_path)
    t = build_table(PaperTableConfig(run=str(run), probe=str(probe), sweep=str(sweep)))
    assert t["probe"]["band"] == [1, 2, 3] and t["probe"]["band_mean"] == pytest.approx(0.8)
    assert t["probe"]["best_site"] == 4
    assert [r["alpha"] for r in t["steering"]["greedy"]] == [-1.0, 0.0, 1.0]
    assert t["behaviour"]["P2_override"] is None           # NaN override (no known problem) -> not available
    md = to_markdown(t)
    assert "| m | 30.0% [10, 60] | 25.0% [0, 50] | 20.0% [0, 40] | n/a |" in md
    assert "| paper: mean of models | 35.5% | 33.5% | 24.5% | n/s |" in md
    assert "1: 0.700, 2: 0.800, 3: 0.900 | 0.800 | 4 (0.950) | 7 adopted / 12 accepted |" in md
    assert "| Qwen3-30B (paper) | 40–42 |" in md and "0.997" in md
    # the probe layer: the paper's Table 39 layer is not in the text, so the band's middle site, said so
    assert t["probe"]["probe_site"] == 2 and t["probe"]["probe_site_auroc"] == pytest.approx(0.8)
    assert t["probe"]["probe_site_source"].startswith("FALLBACK")
    assert "| 7 adopted / 12 accepted | 2 (0.800); fallback |" in md
    assert "| 1 | 85.0% | -5.0 | 10.0% | -20.0 | 50.0% | +10.0 |" in md
    paths = write_table(PaperTableConfig(run=str(run), probe=str(probe), sweep=str(sweep), band=(2, 3)),
                        tmp_path / "out")
    assert json.loads(paths["json"].read_text())["probe"]["band"] == [2, 3]


def test_paper_numbers_are_the_papers():
    p = paper_numbers()
    mean = p["behaviour"]["rows"][0]
    assert (mean["P1_adoption"], mean["P2_adoption"], mean["P1_override"]) == (0.355, 0.245, 0.335)
    assert {r["model"]: r["auroc"] for r in p["probe"]["rows"]} == {"Qwen3-30B": 0.997, "GPT-OSS-20B": 0.993,
                                                                    "Gemma-4-31B": 1.0}


def test_missing_inputs_and_band_sites_are_clear_errors(tmp_path):
    run, probe, sweep = _files(tmp_path)
    with pytest.raises(MemtocError, match="band site"):
        build_table(PaperTableConfig(run=str(run), probe=str(probe), sweep=str(sweep), band=(7, 8, 9)))
    with pytest.raises(MemtocError, match="run the sweep step first"):
        build_table(PaperTableConfig(run=str(run), probe=str(probe), sweep=str(tmp_path / "nope")))


def test_the_command_writes_and_prints_the_table(tmp_path, capsys):
    """``memtoc codeexec table``: the job writes both files, the command prints the markdown and what it wrote."""
    from memtoc.cli import main

    run, probe, sweep = _files(tmp_path)
    out = tmp_path / "table"
    assert main(["codeexec", "table", "--run", str(run), "--probe", str(probe), "--sweep", str(sweep),
                 "--band", "2-3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    md = (out / "paper_table.md").read_text(encoding="utf-8")
    assert printed.startswith(md.rstrip()) and printed.rstrip().endswith(str(out / "paper_table.md"))
    assert json.loads((out / "paper_table.json").read_text())["probe"]["band"] == [2, 3]
