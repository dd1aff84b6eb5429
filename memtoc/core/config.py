"""Frozen config pieces that every job composes, and :func:`composed`, which gives a job flat access to them.

A job's config (``EvaluationConfig``, ``ExtractConfig``, ``SweepConfig``, ``CrossfitConfig``, the code-executor
configs) is a handful of pieces — what model (:class:`~memtoc.core.runtime.ModelSpec`), which episodes
(:class:`EpisodeSelection`), how they are prompted and edited (:class:`Intervention`), how answers are generated
(:class:`~memtoc.core.runtime.GenerationConfig`), where results go (:class:`JobSettings`) — plus the few fields
only that job has. Each option is one field of one piece, so a job that runs another job hands its pieces over
(``EvaluationConfig(selection=cfg.selection, ...)``) instead of copying fields one by one, and the CLI options
are generated from the pieces (:mod:`memtoc.core.options`).

``@composed`` keeps the flat spelling everyone already uses: ``EvaluationConfig(model="x", limit=4)`` routes
``model`` into the ``ModelSpec`` and ``limit`` into the ``EpisodeSelection``; ``cfg.limit`` reads it back, and
``cfg.flat()`` is the flat record that run directories store (``run.json``'s ``config``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from memtoc.core.runtime import GenerationConfig, ModelSpec
from memtoc.core.options import option, register_piece
from memtoc.core.values import ConfigError
from memtoc.core.vocab import CODEEXEC_CONDITIONS

__all__ = ["ModelSpec", "GenerationConfig", "EpisodeSelection", "Intervention", "JobSettings", "SweepSettings",
           "ExecutorSettings", "ScoreLayer", "CaptureSettings", "CodeexecTask", "ConfigError", "composed"]

register_piece(ModelSpec, GenerationConfig)


@dataclass(frozen=True)
class EpisodeSelection:
    """Which MemToC episodes a job runs: benchmark, formulations x conditions of a question set's first N.

    ``formulations`` and ``question_set`` are None (not given) only in a job whose protocol fills them
    (``EvaluationConfig``, ``CrossfitConfig``): the job resolves them to the protocol's value, else these defaults.
    """

    benchmark: str = field(default="demo", metadata=option("benchmark"))
    formulations: str | None = field(default="reference", metadata=option("formulations"))
    conditions: str = field(default="all", metadata=option("conditions"))
    question_set: str | None = field(default="all", metadata=option("question_set"))
    limit: int | None = field(default=None, metadata=option("limit"))


@dataclass(frozen=True)
class Intervention:
    """How the episodes are prompted (closed-book mode, frame, prompt intervention) and edited (an edit spec)."""

    closed_book: str | None = field(default="forced", metadata=option("closed_book"))   # None: as formulations
    prompt_intervention: str = field(default="none", metadata=option("prompt_intervention"))
    frame: str = field(default="auto", metadata=option("frame"))
    edit: str | None = field(default=None, metadata=option("edit"))


@dataclass(frozen=True)
class JobSettings:
    """Where a job writes, its statistics seed and bootstrap size, and whether it shows progress."""

    out: str = field(default="runs/demo", metadata=option("out"))
    seed: int = field(default=0, metadata=option("seed"))
    n_boot: int = field(default=1000, metadata=option("n_boot"))
    progress: bool = field(default=True, metadata=option("progress"))

    def __post_init__(self) -> None:
        from memtoc.core.checks import check_n_boot

        check_n_boot(self.n_boot)          # refused before the job runs, not when its summary is made


@dataclass(frozen=True)
class SweepSettings:
    """The strengths of an edit sweep, the behaviour it steers toward, and its outputs."""

    strengths: str = field(default="0,1,2,4,8,12", metadata=option("strengths"))
    direction: str | None = field(default="memory", metadata=option("direction"))
    dev_per_direction: int = field(default=40, metadata=option("dev_per_direction"))   # the paper's dev sets
    #: the labelling run whose outcomes pick the dev sets (App. C: the strength-0 baseline is then measured)
    dev_labels: str | None = field(default=None, metadata=option("dev_labels"))
    n_perm: int = 10000
    plot: bool = field(default=True, metadata=option("plot"))


@dataclass(frozen=True)
class ExecutorSettings:
    """Where the tasks of a multi-arm job run (:mod:`memtoc.jobs.executor`): in this process, or one Ray task per
    arm or shard, with the resources each reserves. A setting of how the job runs, not of what it computes: it is
    no part of a run's identity (a sweep started locally resumes on Ray and back)."""

    executor: str = field(default="local", metadata=option("executor"))
    address: str | None = field(default=None, metadata=option("address"))
    cpus_per_arm: float = field(default=1.0, metadata=option("cpus_per_arm"))
    gpus_per_arm: float = field(default=0.0, metadata=option("gpus_per_arm"))
    max_retries: int = field(default=3, metadata=option("max_retries"))


@dataclass(frozen=True)
class ScoreLayer:
    """Which labels a table reads: the deterministic scorer's, or the judged layer (``judge_file`` in each run)."""

    score_layer: str = field(default="deterministic", metadata=option("score_layer"))
    judge_file: str = field(default="judge.jsonl", metadata=option("judge_file"))


@dataclass(frozen=True)
class CaptureSettings:
    """What an activation capture stores: sites, token positions and the storage dtype."""

    layers: str = field(default="all", metadata=option("layers"))      # all | last | N | N-M (0 = embedding output)
    position_kinds: str = field(default="last_input", metadata=option("position_kinds"))
    store_dtype: str = field(default="auto", metadata=option("store_dtype"))  # auto = the model's dtype (lossless)


@dataclass(frozen=True)
class CodeexecTask:
    """Which code-executor trials a job runs: the family's own conditions, split, policy and repetitions.

    ``split`` and ``repetitions`` are None (not given) only in ``CodeexecRunConfig``, whose run protocol fills them
    (:func:`memtoc.tasks.codeexec.run.resolve_run_protocol`: the protocol's value, else these defaults).
    """

    conditions: tuple[str, ...] = field(default=CODEEXEC_CONDITIONS, metadata=option("codeexec_conditions"))
    policy: str = field(default="Plain", metadata=option("policy"))
    split: str | None = field(default="heldout", metadata=option("split"))
    limit: int | None = field(default=None, metadata=option("limit"))
    repetitions: int | None = field(default=1, metadata=option("repetitions"))
    bootstrap_seed: int = field(default=0, metadata=option("bootstrap_seed"))


# ---------------------------------------------------------------------------------------------------------
# composition


def _piece_fields(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            out[f.name] = t
    return out


def composed(*, nested: Sequence[str] = (), closed: Sequence[str] = (), unrecorded: Sequence[str] = (),
             aliases: Mapping[str, str] | None = None) -> Callable[[type], type]:
    """Class decorator for a job config (a dataclass) made of pieces: flat keywords and attributes reach them.

    Pieces are the dataclass-typed fields; those named in ``nested`` stay whole in :meth:`flat` (e.g. ``agent``,
    recorded by its own ``to_dict``); those named in ``closed`` are neither routed nor flattened (a sub-config
    with its own vocabulary, e.g. the cross-fit's ``train``). A field name may appear in one piece only (or as
    the job's own field); ``unrecorded`` pieces are routed but left out of :meth:`flat` (settings of how a job
    runs, such as its executor, that no record or identity may depend on); ``aliases`` maps an old keyword to a
    field (``eval_batch_size`` -> ``batch_size``).
    """

    def wrap(cls: type) -> type:
        pieces = {k: v for k, v in _piece_fields(cls).items() if k not in closed}
        own = {f.name for f in dataclasses.fields(cls)}
        routes: dict[str, str] = {}
        for pname, ptype in pieces.items():
            for f in dataclasses.fields(ptype):
                if f.name in routes or f.name in own:
                    raise TypeError(f"{cls.__name__}: field {f.name!r} is defined twice "
                                    f"({routes.get(f.name, cls.__name__)} and {pname})")
                routes[f.name] = pname
        alias = dict(aliases or {})
        init = cls.__init__

        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            for old, new in alias.items():
                if old in kw:
                    kw[new] = kw.pop(old)
            routed: dict[str, dict[str, Any]] = {}
            for k in [k for k in kw if k in routes]:
                routed.setdefault(routes[k], {})[k] = kw.pop(k)
            for pname, values in routed.items():
                base = kw.get(pname)
                if base is None:
                    f = next(f for f in dataclasses.fields(cls) if f.name == pname)
                    base = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                kw[pname] = dataclasses.replace(base, **values)
            init(self, *args, **kw)

        __init__.__doc__ = init.__doc__
        cls.__init__ = __init__  # type: ignore[method-assign]
        for leaf, pname in routes.items():
            setattr(cls, leaf, _delegate(pname, leaf))
        for old, new in alias.items():
            setattr(cls, old, _delegate(routes[new], new))
        cls.__composed_routes__ = dict(routes)  # type: ignore[attr-defined]

        def flat(self: Any) -> dict[str, Any]:
            """The config as one flat record: the pieces' fields in place, nested pieces by their ``to_dict``."""
            out: dict[str, Any] = {}
            for f in dataclasses.fields(self):
                if f.name in unrecorded:
                    continue
                v = getattr(self, f.name)
                if f.name in pieces and f.name not in nested:
                    out.update(dataclasses.asdict(v))
                elif dataclasses.is_dataclass(v):
                    out[f.name] = v.to_dict() if hasattr(v, "to_dict") else dataclasses.asdict(v)
                else:
                    out[f.name] = v
            return out

        cls.flat = flat  # type: ignore[attr-defined]
        return cls

    return wrap


def _delegate(piece: str, name: str) -> property:
    def get(self: Any) -> Any:
        return getattr(getattr(self, piece), name)

    def set_(self: Any, value: Any) -> None:
        object.__setattr__(self, piece, dataclasses.replace(getattr(self, piece), **{name: value}))

    return property(get, set_, doc=f"``{piece}.{name}``")
