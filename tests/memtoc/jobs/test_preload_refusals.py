"""Option values and outputs the job itself checks (not the parser): each refused in one line, exit 2, before
any weights load or the store is read (issue 49, item 8). Through the public CLI, so the cases survive a parser
change."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.core.config import CaptureSettings, EpisodeSelection, JobSettings, ModelSpec


@pytest.fixture()
def no_load(monkeypatch):
    """Loading weights fails the test (an AssertionError is no MemtocError: main() would not turn it into 2)."""
    from memtoc.backends.hf import HFBackend

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: pytest.fail("weights were loaded")))


@pytest.fixture(scope="module")
def store_site1(tiny_backend, tiny_model_dir, tmp_path_factory) -> Path:
    """A small store of the tiny model at site 1 only."""
    from memtoc.jobs.extract import ExtractConfig, run_extract

    out = tmp_path_factory.mktemp("store") / "acts.h5"
    run_extract(ExtractConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir), device="cpu", dtype="float32"),
        selection=EpisodeSelection(benchmark="demo", conditions="tool_wrong", limit=2),
        capture=CaptureSettings(layers="1", position_kinds="last_input,all"),
        job=JobSettings(out=str(out), progress=False)), backend=tiny_backend)
    return out


def _one_line(capsys, *needles) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.mark.parametrize("argv, needles", [
    (["lens", "fit", "--model", "{model}", "--stop-after", "0", "--out", "{tmp}/l.safetensors"], ["--stop-after 0"]),
    (["lens", "fit", "--model", "{model}", "--out", "{tmp}/notes.txt"], ["--out", "notes.txt", "not a memtoc lens"]),
    (["finetune", "train", "--model", "{model}", "--objective", "dpo", "--beta", "-1", "--out", "{tmp}/ad"],
     ["--beta -1"]),
    (["finetune", "train", "--model", "{model}", "--objective", "sft", "--epochs", "0", "--out", "{tmp}/ad"],
     ["--epochs 0"]),
    (["finetune", "crossfit", "--model", "{model}", "--max-length", "0", "--out", "{tmp}/cf"], ["--max-length 0"]),
    (["extract", "--model", "{model}", "--layers", "3", "--limit", "2", "--conditions", "tool_wrong",
      "--position-kinds", "last_input,all", "--out", "{store}"], ["{store}", "sites: [1] in the store, [3] now"]),
], ids=["lens-stop-after-0", "lens-out-not-a-lens", "finetune-beta-neg", "finetune-epochs-0", "crossfit-max-length-0",
        "extract-other-layers"])
def test_job_level_checks_come_before_the_model_loads(tmp_path, capsys, no_load, tiny_model_dir, store_site1, argv,
                                                       needles):
    (tmp_path / "notes.txt").write_text("my notes\n", encoding="utf-8")
    before = {p: p.read_bytes() for p in (tmp_path / "notes.txt", store_site1)}
    fill = {"model": str(tiny_model_dir), "tmp": str(tmp_path), "store": str(store_site1)}
    assert main([a.format(**fill) for a in argv]) == 2
    _one_line(capsys, *[n.format(**fill) for n in needles])
    assert {p: p.read_bytes() for p in before} == before                  # nothing overwritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]     # nothing created


@pytest.mark.parametrize("option, value, needle", [
    ("--d-sae", "0", "--d-sae 0"), ("--steps", "0", "--steps 0"), ("--val-fraction", "1.5", "--val-fraction 1.5"),
    ("--threads", "0", "--threads 0"), ("--l1-coefficient", "-1", "--l1-coefficient -1"),
])
def test_sae_train_checks_its_numbers_before_reading_the_store(tmp_path, capsys, monkeypatch, store_site1, option,
                                                               value, needle):
    import activations.store as store_mod

    monkeypatch.setattr(store_mod, "open_store", lambda *a, **k: pytest.fail("the store was read"))
    assert main(["sae", "train", "--activations", str(store_site1), "--layers", "1", option, value,
                 "--out", str(tmp_path / "sae")]) == 2
    _one_line(capsys, needle)
    assert not (tmp_path / "sae").exists()
