"""Job configs as plain dataclasses of pieces (``memtoc.core.config``): the flat record run directories store,
fields by name, and the flat option names routed into the pieces by the one config builder."""

from __future__ import annotations

import dataclasses

import pytest

from memtoc.core.config import (CaptureSettings, CodeexecTask, EpisodeSelection, ExecutorSettings, GenerationConfig,
                                Intervention, JobSettings, ModelSpec, ScoreLayer, SweepSettings, field_path,
                                field_value, flat_record, with_fields)
from memtoc.core.options import opt
from memtoc.core.values import build_config
from memtoc.jobs.extract import ExtractConfig
from memtoc.jobs.finetune.crossfit import CrossfitConfig
from memtoc.jobs.finetune.jobs import TrainSettings
from memtoc.jobs.serve import ServeConfig
from memtoc.tasks.agent.task import AgentRunConfig, AgentSettings
from memtoc.tasks.codeexec.agent import AgentConfig
from memtoc.tasks.codeexec.capture import CodeexecExtractConfig
from memtoc.tasks.codeexec.run import CodeexecRunConfig, SandboxCheck
from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig
from memtoc.tasks.memtoc.evaluation import EvaluationConfig
from memtoc.tasks.memtoc.sweep import SweepConfig

#: a value other than the default for one field of each piece type, so the record shows where each came from
CHANGES = {ModelSpec: {"model": "tiny-model", "adapter": "adapter-dir"}, EpisodeSelection: {"limit": 4},
           Intervention: {"edit": "edit.json"},
           GenerationConfig: {"max_new_tokens": 8, "batch_size": 2}, JobSettings: {"out": "elsewhere", "seed": 3},
           CaptureSettings: {"layers": "last"}, SweepSettings: {"strengths": "0,2"},
           ScoreLayer: {"score_layer": "judged"}, ExecutorSettings: {"executor": "ray", "cpus_per_arm": 2.0},
           CodeexecTask: {"limit": 2, "repetitions": 3}, AgentConfig: {"max_tool_rounds": 3},
           AgentSettings: {"sample_seed": 5}, TrainSettings: {"r": 4}, SandboxCheck: {"require_isolation": True}}

#: what each config's record is made of, in field order: ``flat`` pieces appear field by field, ``whole`` ones
#: under their own name (their ``to_dict``, else as a dict), ``omit`` ones not at all; every other field appears
#: as it is.
#: This is the run.json ``config`` (and the run identities built on it) the configs have always written.
LAYOUT = {
    EvaluationConfig: {"flat": ("model_spec", "selection", "intervention", "generation", "job")},
    ExtractConfig: {"flat": ("model_spec", "selection", "intervention", "generation", "job", "capture")},
    SweepConfig: {"flat": ("model_spec", "selection", "intervention", "generation", "job", "sweep"),
                  "omit": ("scoring", "execution")},
    CrossfitConfig: {"flat": ("model_spec", "selection", "intervention", "generation", "job", "training",
                              "execution"), "whole": ("train",)},
    ServeConfig: {"flat": ("model_spec",)},
    AgentRunConfig: {"flat": ("model_spec", "selection", "generation", "job", "agent")},
    CodeexecRunConfig: {"flat": ("model_spec", "task", "job", "sandbox"), "whole": ("agent",)},
    CodeexecExtractConfig: {"flat": ("model_spec", "task", "job", "capture", "sandbox"), "whole": ("agent",)},
    CodeexecSweepConfig: {"flat": ("model_spec", "task", "job", "sweep", "intervention"), "whole": ("agent",),
                          "omit": ("execution",)},
}


def _changed(cls: type) -> object:
    """``cls`` with every piece changed from the class's own default piece (``CHANGES``), a protocol-filled field
    left None (not given) set to its piece's ordinary default, as a resolved config holds it."""
    base = cls()
    pieces = {}
    for f in dataclasses.fields(cls):
        value = getattr(base, f.name)
        if type(value) in CHANGES:
            plain = type(value)()
            unset = {p.name: getattr(plain, p.name) for p in dataclasses.fields(value)
                     if getattr(value, p.name) is None}
            pieces[f.name] = dataclasses.replace(value, **{**unset, **CHANGES[type(value)]})
    return cls(**pieces)


@pytest.mark.parametrize("cls", list(LAYOUT), ids=lambda c: c.__name__)
def test_flat_record_of_every_job_config_is_its_pieces_in_place(cls):
    layout = LAYOUT[cls]
    flat, whole, omit = layout["flat"], layout.get("whole", ()), layout.get("omit", ())
    cfg = _changed(cls)
    expected: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        value = getattr(cfg, f.name)
        if f.name in flat:
            expected.update({p.name: getattr(value, p.name) for p in dataclasses.fields(value)})
        elif f.name in whole:
            expected[f.name] = value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
        elif f.name not in omit:
            assert not dataclasses.is_dataclass(value), f"{cls.__name__}.{f.name}: a piece missing from LAYOUT"
            expected[f.name] = value
    record = flat_record(cfg)
    assert list(record.items()) == list(expected.items())          # same keys, same order, same values
    assert not any(dataclasses.is_dataclass(v) for v in record.values())
    for piece in omit:                                             # how a job runs is no part of its record
        assert not set(f.name for f in dataclasses.fields(getattr(cfg, piece))) & set(record)
    # the changed values are the ones recorded (the record is read from the config, not from the defaults)
    assert record["model"] == "tiny-model" and record["adapter"] == "adapter-dir"
    for piece in flat:
        assert all(record[k] == v for k, v in CHANGES.get(type(getattr(cfg, piece)), {}).items()), piece


def test_flat_record_refuses_a_field_two_pieces_define():
    @dataclasses.dataclass
    class Both:
        selection: EpisodeSelection = dataclasses.field(default_factory=EpisodeSelection)
        task: CodeexecTask = dataclasses.field(default_factory=CodeexecTask)

    with pytest.raises(TypeError, match=r"Both: field 'conditions' is defined twice \(again in task\)"):
        flat_record(Both())


def test_fields_by_name_read_and_set_the_piece_that_holds_them():
    cfg = build_config(EvaluationConfig, {"limit": 4, "protocol": "paper"})
    assert field_path(EvaluationConfig, "limit") == ("selection", "limit")
    assert field_path(EvaluationConfig, "protocol") == ("protocol",) and field_path(EvaluationConfig, "x") is None
    assert field_value(cfg, "limit") == 4 and field_value(cfg, "model") == "default"
    assert field_value(cfg, "nothing", None) is None
    with pytest.raises(AttributeError, match="EvaluationConfig has no field 'nothing'"):
        field_value(cfg, "nothing")
    new = with_fields(cfg, {"limit": 2, "frame": "passage", "protocol": "none"})
    assert new.selection == dataclasses.replace(cfg.selection, limit=2)
    assert new.intervention == dataclasses.replace(cfg.intervention, frame="passage")
    assert new.protocol == "none" and cfg.selection.limit == 4 and cfg.protocol == "paper"   # a copy
    assert EpisodeSelection().limit is None                    # the class default piece is not touched
    cx = CodeexecRunConfig()
    object.__setattr__(cx, "protocol_filled", ["repetitions"])
    moved = with_fields(cx, {"limit": 3, "max_tool_rounds": 4})
    assert (moved.task.limit, moved.agent.max_tool_rounds) == (3, 4) and cx.task.limit is None
    assert moved.protocol_filled == ["repetitions"]             # the config's other attributes stay on the copy
    with pytest.raises(AttributeError, match="no field 'nothing'"):
        with_fields(cfg, {"nothing": 1})


def test_build_config_routes_flat_option_names_into_the_pieces():
    cfg = build_config(EvaluationConfig, {"model": "m", "limit": 4, "frame": "passage", "max_new_tokens": 8,
                                          "out": "x", "adapter": "a", "protocol": "paper"})
    # the protocol-filled fields not given are None (the evaluation resolves them)
    assert cfg.selection == EpisodeSelection(limit=4, formulations=None, question_set=None)
    assert cfg.intervention == Intervention(frame="passage", closed_book=None)
    assert cfg.model_spec == ModelSpec(model="m", adapter="a")
    assert cfg.generation == GenerationConfig(max_new_tokens=8, stop_at_final_line=None)
    assert cfg.job == JobSettings(out="x")
    assert cfg.protocol == "paper"
    record = flat_record(cfg)
    assert (record["limit"], record["model"], record["out"], record["frame"]) == (4, "m", "x", "passage")
    assert not any(dataclasses.is_dataclass(v) or isinstance(v, dict) for v in record.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.selection.limit = 3  # type: ignore[misc]
    # a piece's class default stays the starting point: the codeexec capture's own task and agent defaults
    cx = build_config(CodeexecExtractConfig, {"limit": 2, "max_tool_rounds": 3})
    assert cx.task == dataclasses.replace(CodeexecExtractConfig().task, limit=2)
    assert cx.agent == AgentConfig(first_call="scripted", max_tool_rounds=3)


@dataclasses.dataclass(frozen=True)
class _Inner:
    depth: int = dataclasses.field(default=0, metadata=opt("how deep"))


@dataclasses.dataclass(frozen=True)
class _Outer:
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    width: int = dataclasses.field(default=1, metadata=opt("how wide"))


@dataclasses.dataclass
class _Job:
    outer: _Outer = dataclasses.field(default_factory=lambda: _Outer(width=2))
    name: str = dataclasses.field(default="job", metadata=opt("a name"))


def test_build_config_reaches_a_piece_nested_two_levels_deep():
    cfg = build_config(_Job, {"depth": 3, "name": "n"})
    assert cfg == _Job(outer=_Outer(inner=_Inner(depth=3), width=2), name="n")
    assert field_path(_Job, "depth") == ("outer", "inner", "depth") and field_value(cfg, "depth") == 3
    assert with_fields(cfg, {"depth": 5, "width": 7}).outer == _Outer(inner=_Inner(depth=5), width=7)
    assert flat_record(cfg) == {"inner": {"depth": 3}, "width": 2, "name": "n"}


def test_no_job_config_defines_a_field_name_twice():
    """A flat name (an option, a record key, ``field_value``) means one field of a job's config: no name is a field
    of two of its pieces, or of a piece and the config itself."""
    import memtoc.jobs.catalog  # noqa: F401 - the job table
    from memtoc.core.options import piece_type
    from memtoc.jobs.registry import JOBS

    def names(cls: type) -> list[str]:
        out: list[str] = []
        for f in dataclasses.fields(cls):
            sub = piece_type(cls, f)
            out += names(sub) if sub is not None else [f.name]
        return out

    classes = {job.config_class() for job in JOBS.values()}
    assert set(LAYOUT) <= classes
    twice = {cls.__name__: sorted({n for n in names(cls) if names(cls).count(n) > 1}) for cls in classes}
    assert {k: v for k, v in twice.items() if v} == {}
