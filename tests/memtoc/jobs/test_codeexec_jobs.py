"""The code-executor commands through their jobs (memtoc/jobs/codeexec.py): ``codeexec evaluate`` is the one
evaluate job, as ``mt.evaluate(family="codeexec")``, and its paper protocol fills only the options not given."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtoc.cli import main
from memtoc.runs.result import RunResult
from memtoc.tasks.codeexec.protocol import main_settings
from memtoc.core.config import CodeexecTask
from memtoc.tasks.codeexec.agent import AgentConfig


@pytest.fixture
def reached(monkeypatch, tmp_path):
    """The evaluate job up to the family's run: every config it would run, and a stand-in result."""
    import memtoc.jobs.evaluate as job

    seen: list = []

    def run(cfg, **kw):
        seen.append(cfg)
        return RunResult(root=Path(cfg.job.out), records=[{}] * 3, summary={}, table_text="TABLE", n_new=2,
                         family="codeexec")

    monkeypatch.setattr(job, "evaluate", run)
    return seen


def test_codeexec_evaluate_keeps_an_explicitly_typed_default_under_the_paper_protocol(reached, tmp_path, capsys):
    paper, base = main_settings(), CodeexecTask()
    assert paper["repetitions"] != base.repetitions and paper["split"] != base.split   # the test can fail
    out = str(tmp_path / "r")
    assert main(["codeexec", "evaluate", "--protocol", "paper", "--repetitions", str(base.repetitions),
                 "--split", base.split, "--out", out]) == 0
    cfg = reached[-1]
    assert (cfg.task.repetitions, cfg.task.split) == (base.repetitions, base.split)      # typed: kept
    assert cfg.agent.max_tool_rounds == paper["max_tool_rounds"] and cfg.agent.temperature == paper["temperature"]
    assert "repetitions" not in cfg.protocol_filled and "max_tool_rounds" in cfg.protocol_filled
    # the presenter prints what the old handler printed
    assert capsys.readouterr().out == f"TABLE\n\nrun directory: {out}  (3 trials; 2 new)\n"
    # not typed: the paper's values
    assert main(["codeexec", "evaluate", "--protocol", "paper", "--out", out]) == 0
    assert (reached[-1].task.repetitions, reached[-1].task.split) == (paper["repetitions"], paper["split"])
    # no protocol: the toolkit's defaults
    assert main(["codeexec", "evaluate", "--out", out]) == 0
    assert (reached[-1].task.repetitions, reached[-1].agent.max_tool_rounds) == (base.repetitions,
                                                                                 AgentConfig().max_tool_rounds)


def test_the_api_runs_the_same_job_with_the_same_given_options(reached, tmp_path):
    import memtoc as mt

    base = CodeexecTask()
    mt.evaluate(family="codeexec", protocol="paper", repetitions=base.repetitions, out=tmp_path / "r")
    cfg = reached[-1]
    assert cfg.task.repetitions == base.repetitions and cfg.agent.max_tool_rounds == main_settings()["max_tool_rounds"]
    assert "repetitions" not in cfg.protocol_filled and "max_tool_rounds" in cfg.protocol_filled


def test_codeexec_evaluate_loads_its_edit_through_the_job(reached, tmp_path):
    """--edit is a field of the config now (the job loads it), not a separate handler argument."""
    (tmp_path / "e.json").write_text("{}", encoding="utf-8")      # an input must exist (the path contract)
    assert main(["codeexec", "evaluate", "--edit", str(tmp_path / "e.json"), "--out", str(tmp_path / "r")]) == 0
    assert reached[-1].edit == str(tmp_path / "e.json")


def test_each_codeexec_command_calls_its_job():
    from memtoc.cli.parse import commands

    runs = {c.name: c.run for c in commands().values()}
    assert runs["codeexec evaluate"] == runs["agent evaluate"] == "memtoc.jobs.evaluate:run_evaluate"
    assert runs["codeexec extract"] == "memtoc.jobs.codeexec:run_codeexec_extract"
    assert runs["codeexec table"] == "memtoc.jobs.codeexec:run_codeexec_table"


def test_codeexec_extract_checks_the_sandbox_before_the_extract_job(monkeypatch, tmp_path, capsys):
    import memtoc.jobs.codeexec as ext
    import memtoc.tasks.codeexec.sandbox as sandbox_mod
    from memtoc.core.errors import MemtocError
    from memtoc.tasks.codeexec.sandbox import IsolationStatus

    def reached_extract(cfg, **kw):
        raise MemtocError("reached the extract job")

    monkeypatch.setattr(ext, "capture_codeexec", reached_extract)
    monkeypatch.setattr(sandbox_mod, "_require_default", [False])
    monkeypatch.setattr(sandbox_mod, "isolation_status",
                        lambda: IsolationStatus(in_force=("netns",), missing=("landlock: simulated",)))
    argv = ["codeexec", "extract", "--out", str(tmp_path / "a.h5")]
    assert main([*argv, "--require-isolation"]) == 2
    assert "--require-isolation: the sandbox lacks landlock" in capsys.readouterr().err
    assert main(argv) == 2                  # without the requirement: a warning, then the extract job
    assert "reached the extract job" in capsys.readouterr().err
