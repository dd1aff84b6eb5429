"""Frozen config pieces that job configs are made of, and :func:`flat_record`, the flat record of a config.

A job config is a plain dataclass of a few pieces (model, episodes, intervention, generation, settings) plus the
fields only that job has, so a job that runs another hands its pieces over instead of copying fields. Python names
the piece (``cfg.selection.limit``); the command line, the API and recipes use the flat option names, which
:func:`memtoc.core.values.build_config` routes into the pieces. :func:`flat_record` is ``run.json``'s ``config``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from memtoc.core.runtime import GenerationConfig, ModelSpec
from memtoc.core.options import here, opt, option, piece_type
from memtoc.core.values import Changes, ConfigError, field_path, nested, replace_nested
from memtoc.core import vocab

__all__ = ["MODEL_AS_GIVEN", "ModelSpec", "GenerationConfig", "EpisodeSelection", "Intervention", "JobSettings",
           "SweepSettings", "ExecutorSettings", "SWEEP_HERE", "ScoreLayer", "CaptureSettings", "CodeexecTask",
           "ConfigError", "flat_record", "field_path", "field_value", "with_fields"]

#: the model options a job that hooks the model as loaded does not take (in its config's ``NOT_TAKEN``): no chat
#: override, adapter, vLLM sizing or endpoint (an endpoint cannot be hooked)
MODEL_AS_GIVEN = ("chat_template", "adapter", "tensor_parallel_size", "pipeline_parallel_size",
                  "gpu_memory_utilization", "max_model_len", "base_url", "concurrency", "request_timeout",
                  "request_retries")


@dataclass(frozen=True)
class EpisodeSelection:
    """Which MemToC episodes a job runs: benchmark, formulations x conditions of a question set's first N.

    ``formulations`` and ``question_set`` are None (not given) only in a job whose protocol fills them
    (``EvaluationConfig``, ``CrossfitConfig``, ``EpisodesConfig``): the job resolves them to the protocol's value,
    else these defaults.
    """

    benchmark: str = field(default="demo", metadata=option("benchmark"))
    formulations: str | None = field(default="reference", metadata=option("formulations"))
    conditions: str = field(default="all", metadata=option("conditions"))
    question_set: str | None = field(default="all", metadata=opt(" | ".join(vocab.QUESTION_SETS)))
    limit: int | None = field(default=None, metadata=option("limit"))


@dataclass(frozen=True)
class Intervention:
    """How the episodes are prompted (closed-book mode, frame, prompt intervention) and edited (an edit spec)."""

    closed_book: str | None = field(default="forced", metadata=opt(   # None: as formulations
        "closed-book prompt that defines each question's memory (forced = the paper's primary)",
        choices=vocab.CLOSED_BOOK_MODES))
    prompt_intervention: str = field(default="none", metadata=opt(
        "prompt arm: a sentence inserted before the FINAL instruction (none = the standard prompt), or "
        "no-protocol-sentence (the protocol sentence removed; paper section 5.3)", choices=vocab.PROMPT_ARMS))
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

    strengths: str = field(default="0,1,2,4,8,12", metadata=opt("comma list; 0 (the baseline) is always run"))
    direction: str | None = field(default="memory", metadata=opt(
        "steer toward memory or toward the tool (direction edits: the strength's sign; sae_clamp: swaps the "
        "remove/add roles when the spec steers the other way); default: memory, or with memtoc codeexec sweep the "
        "edit's own 'toward' (strength = spec strength)", choices=("memory", "tool")))
    dev_per_direction: int = field(default=40, metadata=opt(     # the paper's dev sets
        "per-direction flip denominators: at most N episodes that followed the tool (toward memory) and N that kept "
        "memory (toward tool), seeded; 0 = all (paper: 40)", low=0))
    dev_labels: str | None = field(default=None, metadata=opt(
        "the labelling run (evaluate directory) whose outcomes pick the per-direction dev sets, as the paper did "
        "(App. C): the strength-0 rate on them is then measured and the flip is treated - baseline; without it the "
        "dev sets are picked by strength 0 itself (baseline 0 by construction)", metavar="RUN_DIR"))
    n_perm: int = 10000
    plot: bool = field(default=True, metadata=opt("do not draw sweep.png"))


#: what the sweep jobs' options are to them (in their configs' ``OPTIONS_HERE``)
SWEEP_HERE: dict[str, Any] = {"edit": here("edit spec (memtoc direction / mine-features output)", required=True),
                              "out": here("sweep directory: one run directory per strength + sweep.*", required=True)}


@dataclass(frozen=True)
class ExecutorSettings:
    """Where the tasks of a multi-arm job run (:mod:`memtoc.jobs.executor`): in this process, or one Ray task per
    arm or shard, with the resources each reserves. A setting of how the job runs, not of what it computes: it is
    no part of a run's identity (a sweep started locally resumes on Ray and back)."""

    executor: str = field(default="local", metadata=opt(
        "local (in this process, one task after another) or ray (one Ray task per arm or shard; pip install "
        "'memtoc-toolkit[ray]')"))
    address: str | None = field(default=None, metadata=opt(
        "ray: the cluster to join (ray start --head prints it; default $RAY_ADDRESS, else a new local instance)"))
    cpus_per_arm: float = field(default=1.0, metadata=opt("ray: CPUs reserved per task", low=0))
    gpus_per_arm: float = field(default=0.0, metadata=opt("ray: GPUs reserved per task (fractions share a GPU)",
                                                          low=0))
    max_retries: int = field(default=3, metadata=opt(
        "ray: re-runs of a task whose worker died or that raised; it resumes from what it wrote", low=0))


@dataclass(frozen=True)
class ScoreLayer:
    """Which labels a table reads: the deterministic scorer's, or the judged layer (``judge_file`` in each run)."""

    score_layer: str = field(default="deterministic", metadata=opt(
        "deterministic scorer labels, or the judged layer (needs judge.jsonl beside the run)",
        choices=("deterministic", "judged")))
    judge_file: str = field(default="judge.jsonl", metadata=opt("judge records file inside the run directory"))


@dataclass(frozen=True)
class CaptureSettings:
    """What an activation capture stores: sites, token positions and the storage dtype."""

    layers: str = field(default="all", metadata=opt(
        "sites to store: all | last | N | N-M, comma separated; site 0 = embedding output, site s = output of block "
        "s-1 (output_hidden_states numbering, pre final norm)"))
    position_kinds: str = field(default="last_input", metadata=opt())
    store_dtype: str = field(default="auto", metadata=opt(
        "auto (the model's dtype, lossless) | float32 | float16 | bfloat16 (stored as raw uint16 bits)"))


@dataclass(frozen=True)
class CodeexecTask:
    """Which code-executor trials a job runs: the family's own conditions, split, policy and repetitions.

    ``split`` and ``repetitions`` are None (not given) only in ``CodeexecRunConfig``, whose run protocol fills them
    (:func:`memtoc.tasks.codeexec.run.resolve_run_protocol`: the protocol's value, else these defaults).
    """

    conditions: tuple[str, ...] = field(default=vocab.CODEEXEC_CONDITIONS, metadata=opt(
        f"comma list of {','.join(vocab.CODEEXEC_CONDITIONS)}, or all", name="codeexec_conditions",
        flag="--conditions"))
    policy: str = field(default="Plain", metadata=opt("system-prompt policy of the agent",
                                                      choices=vocab.CODEEXEC_POLICIES))
    split: str | None = field(default="heldout", metadata=opt("problem split", choices=vocab.CODEEXEC_SPLIT_CHOICES))
    limit: int | None = field(default=None, metadata=option("limit", help="first N problems of the split"))
    repetitions: int | None = field(default=1, metadata=option("repetitions"))
    bootstrap_seed: int = field(default=0, metadata=opt("seed of the bootstrap intervals", low=0))


# ---------------------------------------------------------------------------------------------------------
# the flat record


def flat_record(cfg: Any) -> dict[str, Any]:
    """``cfg`` as the one flat record run directories store (``run.json``'s ``config``) and run identities hash.

    The fields of each piece (a field typed as a dataclass) appear in place, in field order; a piece the config
    names in ``RECORD_NESTED`` stays whole under its own name (by its ``to_dict``, e.g. ``agent``), one named in
    ``RECORD_OMIT`` is left out (settings of how a job runs, such as its executor, that no record or identity may
    depend on); any other field appears as it is (a dataclass value by its ``to_dict`` or as a dict).
    """
    nested = getattr(cfg, "RECORD_NESTED", ())
    omit = getattr(cfg, "RECORD_OMIT", ())
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if f.name in omit:
            continue
        v = getattr(cfg, f.name)
        if f.name not in nested and piece_type(type(cfg), f) is not None:
            items = dataclasses.asdict(v)
        elif dataclasses.is_dataclass(v):
            items = {f.name: v.to_dict() if hasattr(v, "to_dict") else dataclasses.asdict(v)}
        else:
            items = {f.name: v}
        for k, x in items.items():
            if k in out:        # one name, two meanings: the record (and the flat option names) would be ambiguous
                raise TypeError(f"{type(cfg).__name__}: field {k!r} is defined twice (again in {f.name})")
            out[k] = x
    return out


# ---------------------------------------------------------------------------------------------------------
# fields by name, for code that handles any config (pre-load checks, protocol values, what a step wrote)


_MISSING: Any = object()


def field_value(cfg: Any, name: str, default: Any = _MISSING) -> Any:
    """The value of field ``name`` of ``cfg``, its own or a piece's (``field_value(cfg, "limit")`` reads
    ``cfg.selection.limit``); ``default`` where ``cfg`` has no such field (else AttributeError)."""
    path = field_path(type(cfg), name)
    if path is None:
        if default is _MISSING:
            raise AttributeError(f"{type(cfg).__name__} has no field {name!r}")
        return default
    value = cfg
    for part in path:
        value = getattr(value, part)
    return value


def with_fields(cfg: Any, values: Mapping[str, Any]) -> Any:
    """A copy of ``cfg`` with fields set by name, its own or a piece's (each piece changed by
    ``dataclasses.replace``). A shallow copy: the config's other attributes (such as the code executor's
    ``protocol_filled``) stay, and its ``__post_init__`` does not run again."""
    import copy

    out = copy.copy(cfg)
    for name, change in nested(type(cfg), values).items():
        new = replace_nested(getattr(cfg, name), change) if isinstance(change, Changes) else change
        object.__setattr__(out, name, new)
    return out
