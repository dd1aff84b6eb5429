"""Every command that loads a model refuses an error its configuration alone refutes before the weights load
(issue 39): on the default model, exit 2, one line, and the loader never called. The case table is the one
``benchmarks/bench_config_checks.py`` times in fresh processes (no clock here; the figures are in
docs/BENCHMARKS.md). A case marked with a gap is a check that still loads first: it is an expected failure until the
check moves before the load, and then its mark must go (strict)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.cli.parse import commands
from memtoc.core.config import EpisodeSelection, GenerationConfig, JobSettings, ModelSpec

COMMANDS = tuple(commands().values())

REPO = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_config_checks", REPO / "benchmarks" / "bench_config_checks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod                         # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
#: the config fields through which a command names a model it loads
MODEL_FIELDS = ("model", "judge_model")


def model_loading_commands() -> set[str]:
    """Commands with an option that names a model to load (their generated options, so nested configs count)."""
    from memtoc.cli.parse import command_leaves

    return {c.name for c in COMMANDS if {leaf.field for leaf in command_leaves(c)} & set(MODEL_FIELDS)}


def test_the_walk_covers_every_command_that_loads_a_model() -> None:
    """A new model-loading command needs its case in the table (or the walk would silently skip it)."""
    cases = {c.command for c in BENCH.walk_cases(Path("t"), Path("r"), Path("e"))}
    assert cases == model_loading_commands()


@pytest.fixture(scope="module")
def default_shape():
    from memtoc.backends.preflight import model_shape
    from memtoc.core.errors import ModelNotAvailableError

    try:
        return model_shape("default")
    except ModelNotAvailableError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def walk_inputs(tiny_backend, tiny_model_dir, default_shape, tmp_path_factory):
    """A one-question run (the tiny model's: ``patch``, ``rank-table`` and ``judge`` read a run) and an edit at
    site 99, which the default model (sites 0..30) does not have."""
    from memtoc.jobs.evaluate import EvaluationConfig, run_evaluate

    root = tmp_path_factory.mktemp("config-walk")
    run_evaluate(EvaluationConfig(
        model_spec=ModelSpec(model=str(tiny_model_dir)),
        selection=EpisodeSelection(benchmark="demo", conditions="tool_right,tool_wrong", limit=1),
        generation=GenerationConfig(max_new_tokens=4), job=JobSettings(out=str(root / "run"), progress=False)),
                 backend=tiny_backend)
    assert default_shape.n_sites < 99
    edit = BENCH.write_site_edit(root / "site99.json", 99, default_shape.d_model)
    return root / "run", edit


def _params():
    out = []
    for c in BENCH.walk_cases(Path("t"), Path("r"), Path("e")):
        marks = [pytest.mark.xfail(strict=True, reason=c.gap)] if c.gap else []
        out.append(pytest.param(c.command, marks=marks, id=c.command))
    return out


@pytest.mark.parametrize("command", _params())
def test_a_config_only_error_is_refused_before_the_weights_load(command, walk_inputs, tmp_path, monkeypatch,
                                                                capsys) -> None:
    from memtoc.backends.hf import HFBackend

    loads = []

    def refuse(cls, *a, **k):
        loads.append(a)
        raise AssertionError("weights were loaded")     # no MemtocError: main() does not turn it into exit 2

    monkeypatch.setattr(HFBackend, "load", classmethod(refuse))
    run, edit = walk_inputs
    case = next(c for c in BENCH.walk_cases(tmp_path / "out", run, edit) if c.command == command)
    try:
        rc = main(list(case.argv))
    except SystemExit as exc:
        rc = exc.code
    except AssertionError:
        rc = None
    err = capsys.readouterr().err.strip()
    assert loads == [], f"{command}: the weights loaded before the check"
    assert rc == 2, (rc, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert case.needle in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())   # nothing written
