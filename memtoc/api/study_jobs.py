"""The remaining jobs as functions: SAE training, feature mining, lens fitting, the judge pass, acknowledgment
annotation, the report and the study. Each calls the job function its ``memtoc`` command calls
(:mod:`memtoc.jobs`), with the command's options as keywords and its defaults; an unknown keyword is refused by
name (:class:`APIError`). No parser is built. Paths may be given as result objects (``Run``, ``Store``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from memtoc.api.errors import APIError
from memtoc.api.jobs import backend_arg, job_config, out_path, path_arg
from memtoc.api.results import Run, Store
from memtoc.api.signature import api_function, finalize

if TYPE_CHECKING:
    from memtoc.jobs.judge import JudgeResult

#: every name is generated on first use (the module ``__getattr__`` below): its signature is its config's
__all__ = ["sae_train", "mine_features", "lens_fit", "judge", "ack_export", "ack_import", "report",  # noqa: F822
           "study"]


def _paths(values: Any, key: str) -> list[str]:
    values = [values] if isinstance(values, (str, os.PathLike)) or hasattr(values, "path") else list(values)
    if not values:
        raise APIError(f"{key} needs at least one run directory")
    return [path_arg(v, key) for v in values]


@api_function("memtoc.jobs.mining:SaeTrainConfig")
def _sae_train(activations: str | Path | Store, *, layers: str | int | Sequence[int], out: str | Path | None = None,
               **options: Any) -> dict[int, Path]:
    """``memtoc sae train``: one SAE per site of ``layers`` (an int, "N-M", "stored", "paper") on the store's rows
    of ``position_kinds`` (default the full prompt sequences). Returns site -> SAE directory."""
    from memtoc.jobs.mining import SaeTrainConfig, run_sae_train

    paths = run_sae_train(job_config(SaeTrainConfig, {**options, "activations": path_arg(activations, "activations"),
                                                  "layers": layers, "out": out_path(out, "sae")}, "sae_train"))
    return {site: Path(p) for site, p in paths}


@api_function("memtoc.jobs.mining:MineFeaturesConfig")
def _mine_features(activations: str | Path | Store, *, sae: str | Mapping[int, str | Path], fit_fold: str,
                   out: str | Path | None = None, **options: Any) -> Any:
    """``memtoc mine-features``: latents ranked by mutual information with the behaviour, kept to ``budget``,
    written as a clamped SAE edit spec (``result.spec_path``). ``sae``: "15=DIR", a dict site -> path, or
    "paper" (the paper's pretrained dictionaries, ``sae_fallback`` otherwise); ``run``: a run directory or
    :class:`Run`."""
    from memtoc.jobs.mining import MineFeaturesConfig, run_mine_features

    if isinstance(sae, Mapping):
        sae = ",".join(f"{s}={path_arg(p, 'sae')}" for s, p in sae.items())
    if options.get("run") is not None:
        options["run"] = path_arg(options["run"], "run")
    return run_mine_features(job_config(MineFeaturesConfig, {
        **options, "activations": path_arg(activations, "activations"), "sae": sae, "fit_fold": fit_fold,
        "out": out_path(out, "mine")}, "mine_features"))


@api_function("memtoc.jobs.lens_fit:LensFitConfig")
def _lens_fit(*, backend: Any = None, out: str | Path | None = None, **options: Any) -> Any:
    """``memtoc lens fit``: the averaged Jacobian lens of ``backend`` (a loaded hf-family backend, or else
    ``model`` loaded on hf) into ``out`` (a .safetensors file; resumable). ``layers="default"``: the rank table's
    default band."""
    backend = backend_arg(backend, options)
    from memtoc.jobs.lens_fit import LensFitConfig, run_lens_fit

    return run_lens_fit(job_config(LensFitConfig, {**options, "out": out_path(out, "lens.safetensors")}, "lens_fit",
                               backend=backend),
                        backend=backend)


@api_function("memtoc.jobs.judge:JudgeConfig", exclude=("run_dir",))
def _judge(run: str | Path | Run, **options: Any) -> JudgeResult:
    """``memtoc judge``: the release's judge requests (answer extraction, acknowledgment) of a finished run into
    ``RUN/judge.jsonl`` (resumable); read them with ``mt.compare(..., score_layer="judged")`` or ``mt.study``."""
    from memtoc.jobs.judge import JudgeConfig, run_judge

    return run_judge(job_config(JudgeConfig, {**options, "run_dir": path_arg(run, "run")}, "judge"))


@api_function("memtoc.jobs.ack:AckExportConfig", exclude=("runs",))
def _ack_export(runs: str | Path | Run | Sequence[str | Path | Run], *, sheet: str | Path,
                **options: Any) -> dict[str, Any]:
    """``memtoc ack export``: a blinded, detector-stratified annotation sheet (CSV) of the arms' answers and its
    key. The ``llm`` detector reads each run's judge pass (``mt.judge`` first)."""
    from memtoc.jobs.ack import AckExportConfig, run_ack_export

    return run_ack_export(job_config(AckExportConfig, {**options, "runs": _paths(runs, "runs"), "sheet": sheet},
                                 "ack_export"))


@api_function("memtoc.jobs.ack:AckImportConfig", exclude=("key",))
def _ack_import(key: str | Path, *, labels: str | Path | Sequence[str | Path], **options: Any) -> dict[str, Any]:
    """``memtoc ack import``: one or two annotated sheets back: agreement, detector precision and recall, and the
    two-stage prevalence per arm."""
    from memtoc.jobs.ack import AckImportConfig, run_ack_import

    sheets = [labels] if isinstance(labels, (str, os.PathLike)) else list(labels)
    return run_ack_import(job_config(AckImportConfig, {**options, "key": key,
                                                   "labels": [path_arg(p, "labels") for p in sheets]}, "ack_import"))


@api_function("memtoc.jobs.report.job:ReportConfig")
def _report(target: str | Path | Any, **options: Any) -> Any:
    """``memtoc report``: one self-contained HTML page (and Markdown) for a run, sweep or experiment directory."""
    from memtoc.jobs.report.job import ReportConfig, run_report

    if options.get("out") is not None:
        options["out"] = path_arg(options["out"], "out")
    return run_report(job_config(ReportConfig, {**options, "target": path_arg(target, "target")}, "report"))


@api_function("memtoc.jobs.study.run:StudyConfig", exclude=("base", "arm"))
def _study(base: str | Path | Run | Sequence[str | Path | Run],
           arms: str | Path | Run | Sequence[str | Path | Run] = (), **options: Any) -> Any:
    """``memtoc study``: the paper's statistics over base run(s) and arms (Holm families, the criterion per
    formulation, z tests, the stability rule), read in ``score_layer`` (judged: the paper's; needs each run's judge
    pass). Returns the study; ``score_layer="both"``: a dict layer -> study (the deterministic one written to
    OUT/deterministic). ``arms``: run directories, ``Run`` objects or "LABEL=DIR"."""
    from memtoc.jobs.study.run import StudyConfig, run_study

    arm_paths = [a if isinstance(a, str) and "=" in a else path_arg(a, "arms") for a in
                 ([arms] if isinstance(arms, (str, os.PathLike)) or hasattr(arms, "path") else list(arms))]
    cfg = job_config(StudyConfig, {**options, "base": _paths(base, "base"), "arm": arm_paths}, "study")
    got = run_study(cfg).by_layer()
    return got if cfg.score_layer == "both" else got[cfg.score_layer]


#: The job functions whose signature is generated (:mod:`memtoc.api.signature`), by public name.
_GENERATED = {"judge": _judge, "ack_export": _ack_export, "ack_import": _ack_import, "study": _study,
              "report": _report, "sae_train": _sae_train, "mine_features": _mine_features, "lens_fit": _lens_fit}


def __getattr__(name: str) -> Any:
    fn = _GENERATED.get(name)
    if fn is None:
        raise AttributeError(f"module 'memtoc.api.study_jobs' has no attribute {name!r}")
    value = globals()[name] = finalize(fn, name)
    return value
