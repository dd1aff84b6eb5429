"""Recipe steps of registered jobs: keys are the job config's options, values are checked by the one config
builder before any step runs, and each step runs as its job from its config values (no parser, no argv)."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memtoc.core.options import opt
from memtoc.recipes.experiment import ExperimentError, JobCommands, load_recipe, run_experiment, validate_recipe

RAN: list = []


@dataclass
class PosConfig:
    """A stand-in job with every kind of option a recipe step can set."""

    first: str = field(default="", metadata=opt("first positional", positional=True, required=True))
    rest: tuple[str, ...] = field(default=(), metadata=opt("the other positionals", positional=True, nargs="*"))
    arm: tuple[str, ...] = field(default=(), metadata=opt("repeatable", repeat=True))
    count: int = field(default=3, metadata=opt("a whole number"))
    mode: str = field(default="a", metadata=opt("a choice", choices=("a", "b")))
    progress: bool = field(default=True, metadata=opt("no progress bar"))
    out: str = field(default="", metadata=opt("output file", path=True))

    def __post_init__(self) -> None:
        from memtoc.core.values import ConfigError

        if self.count > 100:
            raise ConfigError(f"--count must be at most 100, got {self.count}")


def run_pos(cfg: PosConfig) -> None:
    RAN.append(cfg)
    Path(cfg.out).write_text(json.dumps({"first": cfg.first, "count": cfg.count}), encoding="utf-8")


@pytest.fixture
def pos_job(monkeypatch):
    from memtoc.jobs import catalog, registry

    catalog.job("probe")                             # the table loaded, then the stand-in added to it
    monkeypatch.setitem(registry.JOBS, "zz-pos", registry.Job("zz-pos", f"{__name__}:PosConfig",
                                                              f"{__name__}:run_pos", "a stand-in job"))
    RAN.clear()
    return RAN


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "r.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_a_job_step_runs_from_its_config_values(pos_job, tmp_path):
    text = ('[defaults]\ncount = 5\nno_progress = true\n[[steps]]\nname = "a"\ncommand = "zz-pos"\nout = "a.json"\n'
            'positional = ["x", "--arm", "k=${out}", "y", "z", "--arm=two"]\nargs = { mode = "b" }\n')
    res = run_experiment(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None)
    assert res.ok, res.steps
    cfg, = pos_job
    exp = tmp_path / "exp"
    assert (cfg.first, cfg.rest, cfg.arm) == ("x", ("y", "z"), (f"k={exp}", "two"))
    assert (cfg.count, cfg.mode, cfg.progress, cfg.out) == (5, "b", False, str(exp / "a.json"))
    rec = json.loads((exp / "experiment.json").read_text())["steps"][0]
    assert rec["config"] == {"first": "x", "rest": ["y", "z"], "arm": [f"k={exp}", "two"], "count": 5,
                             "progress": False, "mode": "b", "out": str(exp / "a.json")}
    assert rec["argv"] == ["memtoc", "zz-pos", "x", "y", "z", "--arm", f"k={exp}", "--arm", "two", "--count", "5",
                           "--no-progress", "--mode", "b", "--out", str(exp / "a.json")]
    # a re-run with the same values skips the step; another value runs it again
    assert run_experiment(_write(tmp_path, text), out=exp, report=False, log=lambda s: None).steps[0]["resumed"]
    assert len(pos_job) == 1
    run_experiment(_write(tmp_path, text.replace("count = 5", "count = 6")), out=exp, report=False,
                   log=lambda s: None)
    assert len(pos_job) == 2 and pos_job[-1].count == 6


def test_public_names_and_field_names_are_keys_too(pos_job, tmp_path):
    text = '[[steps]]\nname = "a"\ncommand = "zz-pos"\nout = "a.json"\npositional = ["x"]\nargs = { progress = false }\n'
    assert run_experiment(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None).ok
    assert pos_job[-1].progress is False


@pytest.mark.parametrize("args, match", [
    ("{ cuont = 2 }", r"r.toml: step a \(args\): `memtoc zz-pos` has no option --cuont \(key 'cuont'\); its options: "
                      r".*--count"),
    ('{ count = "three" }', r"r.toml: step a: count must be a whole number, got 'three'"),
    ("{ count = 2.5 }", r"r.toml: step a: count must be a whole number"),
    ('{ mode = "c" }', r"r.toml: step a: mode must be one of a, b"),
    ('{ no_progress = "yes" }', r"r.toml: step a: no_progress is a switch"),
    ('{ progress = "no" }', r"r.toml: step a: progress must be true or false"),
    ("{ count = 101 }", r"r.toml: step a: --count must be at most 100"),       # the config's own check
])
def test_keys_and_values_are_checked_before_any_step_runs(pos_job, tmp_path, args, match):
    text = ('[[steps]]\nname = "ok"\ncommand = "zz-pos"\nout = "ok.json"\npositional = ["x"]\n'
            f'[[steps]]\nname = "a"\ncommand = "zz-pos"\nout = "a.json"\npositional = ["x"]\nargs = {args}\n')
    with pytest.raises(ExperimentError, match=match):
        run_experiment(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None)
    assert pos_job == [] and not (tmp_path / "exp" / "ok.json").exists()           # nothing ran


def test_positional_arguments_that_do_not_fit_are_refused(pos_job, tmp_path):
    r = load_recipe(_write(tmp_path, '[[steps]]\nname = "a"\ncommand = "zz-pos"\npositional = ["--nope", "x"]\n'))
    with pytest.raises(ExperimentError, match="step a: positional '--nope'.*has no option --nope"):
        validate_recipe(r)


def test_job_tasks_pickle_for_ray(pos_job, tmp_path):
    """What an executor ships is a module-level function and JSON values: it survives pickling and runs."""
    from memtoc.jobs.executor import LocalExecutor

    shipped = []

    class Pickling(LocalExecutor):
        def run(self, tasks, **kw):
            tasks = [pickle.loads(pickle.dumps(t)) for t in tasks]
            shipped.extend(tasks)
            return super().run(tasks, **kw)

    text = '[[steps]]\nname = "a"\ncommand = "zz-pos"\nout = "a.json"\npositional = ["x"]\n'
    ex = Pickling()
    try:
        assert run_experiment(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None,
                              executor=ex).ok
    finally:
        ex.close()
    assert [t.args[0] for t in shipped] == ["zz-pos"] and pos_job[-1].first == "x"


def test_the_codeexec_protocol_reaches_a_recipe_step_and_keeps_its_given_values(tmp_path, monkeypatch):
    """``protocol = "paper"`` on a codeexec evaluate step: the paper fills what the step does not give; a value
    the step gives at its default stays (the step's keys are its given fields)."""
    import memtoc.jobs.evaluate as job
    from memtoc.cli.recipes import run_experiment as cli_run
    from memtoc.runs.result import RunResult
    from memtoc.tasks.codeexec.protocol import main_settings

    seen = []

    def reached(cfg, **kw):
        seen.append(cfg)
        return RunResult(root=Path(cfg.job.out), records=[], summary={}, table_text="T", family="codeexec")

    monkeypatch.setattr(job, "evaluate", reached)
    text = ('protocol = "paper"\n[[steps]]\nname = "given"\ncommand = "codeexec evaluate"\nout = "g"\n'
            'args = { repetitions = 1 }\n[[steps]]\nname = "filled"\ncommand = "codeexec evaluate"\nout = "f"\n')
    res = cli_run(_write(tmp_path, text), out=tmp_path / "exp", report=False, log=lambda s: None)
    assert res.ok, res.steps
    given, filled = seen
    assert given.task.repetitions == 1 and filled.task.repetitions == main_settings()["repetitions"] != 1
    assert given.agent.max_tool_rounds == filled.agent.max_tool_rounds == main_settings()["max_tool_rounds"]
    assert res.steps[0]["config"]["protocol"] == "paper"


def test_the_registry_is_the_default_vocabulary(tmp_path):
    """Without an adapter the runner reads the job registry: a codeexec evaluate step takes every option of
    CodeexecRunConfig, an unknown command is refused."""
    opts = JobCommands().options(["codeexec", "evaluate"])
    assert {"--repetitions", "--call-format", "--protocol", "--no-progress", "--require-isolation"} <= set(opts)
    assert opts["--protocol"].field == "protocol" and opts["--call-format"].field == "call_format"
    assert JobCommands().options(["no-such-command"]) is None


def test_a_step_recorded_under_a_fields_older_name_is_the_same_step():
    """A recipe's state file written before a field took its flag's name is read under today's names, per command
    (``positions`` is extract's ``position_kinds`` but direction's ``edit_positions``), so the step is not run again
    for a rename alone."""
    from memtoc.recipes.experiment import current_fields

    assert current_fields("study", {"layer": "judged", "arms": ["a"], "seed": 0}) == {
        "score_layer": "judged", "arm": ["a"], "seed": 0}
    assert current_fields("codeexec evaluate", {"protocol": "native", "run_protocol": "paper"}) == {
        "call_format": "native", "protocol": "paper"}
    assert current_fields("extract", {"chat": False, "positions": "x"}) == {"chat_template": False,
                                                                             "position_kinds": "x"}
    assert current_fields("direction", {"positions": "tool_span"}) == {"edit_positions": "tool_span"}
    assert current_fields("evaluate", None) is None
