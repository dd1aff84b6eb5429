"""The study job over run directories (``memtoc study``, ``mt.study``): load the base and arm runs in a scoring
layer, compute the study, write its files. ``layer="both"`` runs the judged study into ``out`` and the
deterministic one into ``out/deterministic``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt, option
from memtoc.jobs.study.analysis import MODEL_METRICS
from memtoc.scoring.metrics import COMPARISON_METRICS

__all__ = ["StudyConfig", "StudyLayer", "StudyResult", "experiment_runs", "run_study", "run_study_dirs"]


class StudyInputError(MemtocError):
    """The runs of a study cannot be gathered as given (no base run, an experiment without a study step)."""



@dataclass
class StudyConfig:
    """``memtoc study``: the paper's statistics over base runs and arms (and models)."""
    #: (the arms are LABEL=DIR or DIR: their directories are inputs too, by :meth:`contract_inputs`)
    PATH_ROLES: ClassVar[dict[str, str]] = {"base": "input-run", "out": "output-dir"}

    def contract_inputs(self) -> list[str]:
        """The arms' run directories (LABEL=DIR or DIR): no output may lie on, inside or around them. (An
        ``--experiment`` directory is not one: its runs lie inside it, and a study may be written beside them.)"""
        return [a.split("=", 1)[1] if "=" in a and not Path(a).exists() else a for a in self.arm]

    base: tuple[str, ...] = field(default=(), metadata=opt(
        "base run directory of one model (repeat once per model; the model is read from run.json); or give "
        "--experiment", repeat=True))
    experiment: tuple[str, ...] = field(default=(), metadata=opt(
        "a run-experiment output directory (repeat, e.g. one per model): its study step's base and arm runs join "
        "this study, so the per-model recipes of a family combine into one study that computes it whole",
        repeat=True))
    partial_family: tuple[str, ...] = field(default=(), metadata=opt(
        "a declared Holm family this study may compute with members missing (repeat): without it a declared "
        "family with fewer members than the paper's is refused", repeat=True))
    arm: tuple[str, ...] = field(default=(), metadata=opt(
        "arm run directory, or LABEL=DIR (repeat); compared with the base run of the same model", repeat=True))
    holm_family: str = field(default="arm", metadata=opt(
        "Holm family: arm (one per arm label, across models), model (one per model), model×arm (alias model-arm: "
        "all contrasts), none, or written out as NAME=model/arm,model/arm;NAME2=... or @family.json"))
    metrics: tuple[str, ...] = field(default=COMPARISON_METRICS, metadata=opt("paired metrics (comma list)"))
    holm_metrics: tuple[str, ...] = field(default=("retention",), metadata=opt(
        "metrics Holm-adjusted inside the families"))
    model_metrics: tuple[str, ...] = field(default=MODEL_METRICS, metadata=opt(
        "metrics of the cross-model z tests and the stability rule"))
    score_layer: str = field(default="judged", metadata=opt(
        "scoring layer: judged (the paper's, App. B; needs judge.jsonl beside every run, from `memtoc judge RUN`), "
        "deterministic (the scorer's labels), or both (judged to --out, deterministic to OUT/deterministic)",
        choices=("judged", "deterministic", "both")))
    judge_file: str | None = field(default=None, metadata=opt(
        "judge records file inside each run directory (default judge.jsonl)"))
    model_pair: tuple[str, ...] = field(default=(), metadata=opt(
        "A:B (two base runs, each by model name, model identity or run directory): a paired cross-model contrast "
        "on common support, e.g. the pre-registered "
        "base vs instruction-tuned pair Llama-3.1-8B:Llama-3.1-8B-Instruct (repeat; Holm over the pairs)",
        repeat=True))
    alpha: float = field(default=0.05, metadata=opt("significance level of the Holm-corrected tests"))
    n_boot: int = field(default=1000, metadata=option("n_boot"))
    n_perm: int = field(default=10000, metadata=opt("sign-flip permutations for the p-values", low=1, high=10_000_000))
    seed: int = field(default=0, metadata=opt("seed of the bootstrap and the permutations"))
    out: str | None = field(default=None, metadata=opt("directory for study.md, study.json and one CSV per table",
                                                       path=True))


@dataclass
class StudyLayer:
    """The study of one scoring layer and where it was written (``out`` None: not written)."""

    layer: str
    study: Any
    out: str | None
    paths: list[Path]


@dataclass
class StudyResult:
    """One :class:`StudyLayer` per layer asked for (``both``: judged, then deterministic)."""

    layers: list[StudyLayer]

    def by_layer(self) -> dict[str, Any]:
        return {one.layer: one.study for one in self.layers}


def _experiment_path(exp: Path, given: str) -> str:
    """A run path an experiment's study step names, found under the experiment directory ``exp`` (the step
    recorded it relative to where run-experiment was started): an absolute path that exists as given, else its
    longest tail that is a run under ``exp``, else the path as given when that is a run."""
    label, sep, path = given.partition("=") if "=" in given and not Path(given).exists() else ("", "", given)
    p = Path(path)
    if not p.exists() or not p.is_absolute():
        parts = p.parts
        for k in range(len(parts)):
            cand = exp.joinpath(*parts[k:])
            if (cand / "run.json").is_file():
                p = cand
                break
    if not (p / "run.json").is_file():
        raise StudyInputError(f"{exp / 'experiment.json'}: the study step's run {path!r} is not found under {exp}")
    return f"{label}={p}" if sep else str(p)


def experiment_runs(exp_dir: str) -> tuple[list[str], list[str]]:
    """The base and arm runs (``LABEL=DIR``) of the study steps of one run-experiment output directory."""
    import json

    exp = Path(exp_dir)
    state_path = exp / "experiment.json"
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StudyInputError(f"{state_path}: not found; --experiment takes a run-experiment output directory") \
            from None
    except json.JSONDecodeError as exc:
        raise StudyInputError(f"{state_path}: invalid JSON ({exc.msg})") from None
    bases: list[str] = []
    arms: list[str] = []
    steps = [s for s in state.get("steps", []) if s.get("command") == "study" and s.get("argv")]
    if not steps:
        raise StudyInputError(f"{state_path}: no study step was run in this experiment")
    for st in steps:
        argv = list(st["argv"])
        for flag, into in (("--base", bases), ("--arm", arms)):
            into += [_experiment_path(exp, argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == flag]
    return bases, arms


def run_study(cfg: StudyConfig) -> StudyResult:
    """The study of ``cfg`` in each layer it asks for, written under ``cfg.out`` when given."""
    bases, arms = list(cfg.base), list(cfg.arm)
    for exp in cfg.experiment:
        b, a = experiment_runs(exp)
        bases += [x for x in b if x not in bases]
        arms += [x for x in a if x not in arms]
    if not bases:
        raise StudyInputError("give the base runs (--base DIR, one per model) or --experiment DIR")
    if cfg.out and cfg.experiment:          # the experiments' runs are known only now: the output stays out of them
        out = Path(cfg.out).resolve()
        for run in (x.split("=", 1)[1] if "=" in x and not Path(x).exists() else x for x in (*bases, *arms)):
            r = Path(run).resolve()
            if out == r or r in out.parents:
                raise StudyInputError(f"--out {cfg.out}: lies in the input run {run}; write the study elsewhere")
    return StudyResult([StudyLayer(*one) for one in run_study_dirs(
        bases, arms, layer=cfg.score_layer, judge_file=cfg.judge_file, out=cfg.out, family=cfg.holm_family,
        metrics=tuple(cfg.metrics) or COMPARISON_METRICS, holm_metrics=tuple(cfg.holm_metrics),
        model_metrics=tuple(cfg.model_metrics) or None, alpha=cfg.alpha, n_boot=cfg.n_boot, n_perm=cfg.n_perm,
        seed=cfg.seed, model_pairs=tuple(cfg.model_pair), partial_families=tuple(cfg.partial_family))])


def run_study_dirs(base: Sequence[str | Path], arms: Sequence[str | Path] = (), *, layer: str = "judged",
                   judge_file: str | None = None, out: str | Path | None = None,
                   model_metrics: Sequence[str] | None = None, **settings: Any
                   ) -> Iterator[tuple[str, Any, str | None, list[Path]]]:
    """``(layer, study, out, written paths)`` per layer; ``settings``: :class:`StudySettings` fields."""
    from memtoc.jobs.study.analysis import StudySettings, run_study as study_of
    from memtoc.jobs.study.output import write_study
    from memtoc.jobs.study.runs import BASE_LABEL, load_run

    layers = ("judged", "deterministic") if layer == "both" else (layer,)
    for i, one in enumerate(layers):
        where = str(out) if out and i == 0 else (f"{out}/{one}" if out else None)
        cfg = StudySettings(layer=one, model_metrics=tuple(model_metrics or MODEL_METRICS), **settings)
        kw = {"layer": one, "judge_file": judge_file}
        bases = [dataclasses.replace(load_run(str(p), **kw), label=BASE_LABEL) for p in base]
        study = study_of(bases, [load_run(str(p), **kw) for p in arms], cfg)
        yield one, study, where, (write_study(study, where) if where else [])
