"""Validate before loading: user errors are one line, exit 2, name the file / field / option,
and come before any model loads and before any output directory is created."""

from __future__ import annotations

import json

import pytest
import torch

from memtoc.cli import main
from steering.kinds.direction import DirectionEdit, save_direction_edit


@pytest.fixture
def no_model_load(monkeypatch):
    """Every way a job loads weights fails the test loudly (and is not a MemtocError, so main() re-raises it)."""
    from memtoc.backends.hf import HFBackend

    def refuse(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: refuse()))
    try:
        from memtoc.backends.vllm import VLLMBackend

        monkeypatch.setattr(VLLMBackend, "load", classmethod(lambda cls, *a, **k: refuse()))
    except ImportError:  # pragma: no cover
        pass


def _unit(d: int, seed: int = 0) -> torch.Tensor:
    v = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return v / v.norm()


def _spec(path, *, layers, d):
    edit = DirectionEdit.build(name="probe", layers=layers, vectors={s: _unit(d, s) for s in layers},
                               scale={s: 1.0 for s in layers}, positions="last_input", strength=1.0)
    return save_direction_edit(path, edit)


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)
    return err


@pytest.mark.parametrize("layers, d, field", [([1], 16, "vectors"), ([9], 32, "layers")])
def test_evaluate_refuses_an_edit_that_does_not_fit_before_loading(tiny_model_dir, tmp_path, capsys, no_model_load,
                                                                   layers, d, field):
    """tiny model: width 32, 3 blocks (sites 0..3)."""
    spec = _spec(tmp_path / "edit.json", layers=layers, d=d)
    out = tmp_path / "run"
    rc = main(["evaluate", "--model", str(tiny_model_dir), "--edit", str(spec), "--out", str(out), "--limit", "1",
               "--device", "cpu", "--no-progress"])
    assert rc == 2
    _one_line_error(capsys, str(spec), f"field '{field}'")
    assert not out.exists()


def test_sweep_refuses_an_edit_that_does_not_fit_before_loading(tiny_model_dir, tmp_path, capsys, no_model_load):
    spec = _spec(tmp_path / "edit.json", layers=[1], d=16)
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", str(tiny_model_dir), "--edit", str(spec), "--out", str(out), "--limit", "1",
               "--strengths", "0,1", "--device", "cpu", "--no-progress", "--no-plot"])
    assert rc == 2
    _one_line_error(capsys, str(spec), "width 16", "32")
    assert not out.exists()


def test_the_default_gguf_model_is_read_without_weights():
    from memtoc.tasks.validate import read_model_shape

    shape = read_model_shape("default")
    assert (shape.d_model, shape.n_layers) == (576, 30)     # SmolLM2-135M: hidden 576, 30 blocks


def test_model_shape_of_a_local_directory_matches_the_loaded_model(tiny_model_dir, tiny_backend):
    from memtoc.tasks.validate import read_model_shape

    shape = read_model_shape(str(tiny_model_dir))
    assert shape.d_model == tiny_backend.model.config.hidden_size == 32
    assert shape.n_layers == len(tiny_backend.model.model.layers) == 3


def test_settings_mismatch_is_refused_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    base = ["evaluate", "--model", str(tiny_model_dir), "--out", str(out), "--limit", "1", "--conditions",
            "tool_wrong", "--max-new-tokens", "2", "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert main(base) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    from memtoc.backends.hf import HFBackend

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
        AssertionError("the model was loaded"))))
    assert main(base + ["--prompt-intervention", "warn"]) == 2
    _one_line_error(capsys, str(out), "prompt_intervention")
    assert main([a if a != "2" else "3" for a in base]) == 2       # --max-new-tokens 3
    _one_line_error(capsys, "max_new_tokens")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


CODEEXEC_CASES = [
    (["evaluate", "--conditions", "P9"], "--conditions", "P9"),
    (["evaluate", "--limit", "0"], "--limit", "0"),
    (["evaluate", "--repetitions", "0"], "--repetitions", "0"),
    (["evaluate", "--memory-mb", "10"], "--memory-mb", "10"),
    (["evaluate", "--timeout-s", "0"], "--timeout-s", "0"),
    (["evaluate", "--cpu-s", "0"], "--cpu-s", "0"),
    (["evaluate", "--memory-mb", "99999999999"], "--memory-mb", "99999999999"),      # bounded limits
    (["evaluate", "--cpu-s", "1000000000"], "--cpu-s", "86400"),
    (["evaluate", "--timeout-s", "100000"], "--timeout-s", "86400"),
    (["evaluate", "--max-new-tokens", "0"], "--max-new-tokens", "0"),
    (["evaluate", "--batch-size", "0"], "--batch-size", "0"),
    (["evaluate", "--first-call", "scripted", "--max-tool-rounds", "0"], "--max-tool-rounds", "scripted"),
    (["extract", "--conditions", "no_tool"], "--conditions", "no_tool"),
    (["extract", "--conditions", "P0,P7"], "--conditions", "P7"),
    (["extract", "--limit", "0"], "--limit", "0"),
    (["extract", "--memory-mb", "10"], "--memory-mb", "10"),
    (["extract", "--memory-mb", "99999999999"], "--memory-mb", "65536"),
]


@pytest.mark.parametrize("argv, option, value", CODEEXEC_CASES, ids=lambda x: " ".join(x) if isinstance(x, list)
                         else None)
def test_codeexec_option_errors_are_one_line_exit_2_and_leave_nothing(tmp_path, capsys, no_model_load, argv,
                                                                      option, value):
    out = tmp_path / ("acts.h5" if argv[0] == "extract" else "run")
    rc = main(["codeexec", *argv, "--out", str(out), "--no-progress"])
    assert rc == 2
    _one_line_error(capsys, option, value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_corrected_codeexec_command_is_not_blocked(tmp_path, capsys, no_model_load):
    """The refused command left nothing, so the corrected one gets as far as loading the model."""
    out = tmp_path / "run"
    assert main(["codeexec", "evaluate", "--limit", "0", "--out", str(out)]) == 2
    with pytest.raises(AssertionError, match="the model was loaded"):
        main(["codeexec", "evaluate", "--limit", "1", "--out", str(out), "--no-progress"])


def test_codeexec_settings_mismatch_is_refused_before_loading(tmp_path, capsys, no_model_load):
    from memtoc.tasks.codeexec.agent import AgentConfig
    from memtoc.tasks.codeexec.problems import generate_problems, problems_sha256

    out = tmp_path / "run"
    out.mkdir()
    ident = {"model": "x", "problems_sha256": problems_sha256(generate_problems(0)), "problem_seed": 0,
             "policy": "Plain", "agent": AgentConfig().to_dict()}
    (out / "run.json").write_text(json.dumps({"identity": ident, "identity_sha256": "0"}))
    assert main(["codeexec", "evaluate", "--policy", "Verify", "--limit", "1", "--out", str(out)]) == 2
    _one_line_error(capsys, str(out), "policy")


def test_extract_settings_mismatch_is_refused_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "acts.h5"
    base = ["extract", "--model", str(tiny_model_dir), "--out", str(out), "--limit", "1", "--conditions",
            "tool_wrong", "--layers", "last", "--device", "cpu", "--dtype", "float32", "--no-progress"]
    assert main(base) == 0
    before = out.read_bytes()
    capsys.readouterr()
    from memtoc.backends.hf import HFBackend

    monkeypatch.setattr(HFBackend, "load", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
        AssertionError("the model was loaded"))))
    assert main(base + ["--frame", "passage"]) == 2
    _one_line_error(capsys, str(out), "frame")
    assert out.read_bytes() == before


@pytest.mark.parametrize("argv, option", [
    (["--max-new-tokens", "0"], "--max-new-tokens"), (["--batch-size", "0"], "--batch-size"),
    (["--limit", "0"], "--limit"), (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization")])
def test_evaluate_option_errors_come_before_loading(tmp_path, capsys, no_model_load, argv, option):
    out = tmp_path / "run"
    assert main(["evaluate", "--out", str(out), "--no-progress", *argv]) == 2
    _one_line_error(capsys, option.lstrip("-") if option == "--limit" else option)
    assert not out.exists()
