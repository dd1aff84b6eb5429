"""The remaining jobs as functions: SAE training, feature mining, lens fitting, the judge pass, acknowledgment
annotation, the report and the study. Each calls the job function its ``memtoc`` command calls
(:mod:`memtoc.jobs`), with the command's options as keywords and its defaults; an unknown keyword is refused by
name (:class:`APIError`). No parser is built. Paths may be given as result objects (``Run``, ``Store``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.api.errors import APIError
from memtoc.api.jobs import _backend, _build, _out, _path
from memtoc.api.results import Store
from memtoc.api.signature import api_function, finalize

#: (``sae_train``, ``mine_features`` and ``lens_fit`` are made on first use: the module ``__getattr__`` below)
__all__ = ["judge", "ack_export", "ack_import", "report", "study"]


def _refuse(job: str, unknown: Mapping[str, Any]) -> None:
    if unknown:
        raise APIError(f"{job} takes no option(s) {', '.join(sorted(unknown))}; see help(memtoc.{job})")


def _csv(value: Any) -> list[str] | None:
    """A comma list given as a string or a sequence."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return [s.strip() for s in items if s.strip()] or None


def _paths(values: Any, key: str) -> list[str]:
    values = [values] if isinstance(values, (str, os.PathLike)) or hasattr(values, "path") else list(values)
    if not values:
        raise APIError(f"{key} needs at least one run directory")
    return [_path(v, key) for v in values]


@api_function("memtoc.jobs.mining:SaeTrainConfig")
def _sae_train(activations: str | Path | Store, *, layers: str | int | Sequence[int], out: str | Path | None = None,
               **options: Any) -> dict[int, Path]:
    """``memtoc sae train``: one SAE per site of ``layers`` (an int, "N-M", "stored", "paper") on the store's rows
    of ``position_kinds`` (default the full prompt sequences). Returns site -> SAE directory."""
    from memtoc.jobs.mining import SaeTrainConfig, run_sae_train

    paths = run_sae_train(_build(SaeTrainConfig, {**options, "activations": _path(activations, "activations"),
                                                  "layers": layers, "out": _out(out, "sae")}, "sae_train"))
    return {site: Path(p) for site, p in paths}


@api_function("memtoc.jobs.mining:MineFeaturesConfig")
def _mine_features(activations: str | Path | Store, *, sae: str | Mapping[int, str | Path], fit_fold: str,
                   out: str | Path | None = None, **options: Any) -> Any:
    """``memtoc mine-features``: latents ranked by mutual information with the behaviour, kept to ``budget``,
    written as a clamped SAE edit spec (``result.spec_path``). ``sae``: "15=DIR", a dict site -> path, or
    "paper" (the paper's pretrained dictionaries, ``sae_fallback`` otherwise); ``run``: a run directory or
    :class:`Run`."""
    from memtoc.api.jobs import _renamed
    from memtoc.jobs.mining import MineFeaturesConfig, run_mine_features

    _renamed("mine_features", options, position_kind="position_kinds", positions="edit_positions")
    if isinstance(sae, Mapping):
        sae = ",".join(f"{s}={_path(p, 'sae')}" for s, p in sae.items())
    if options.get("run") is not None:
        options["run"] = _path(options["run"], "run")
    return run_mine_features(_build(MineFeaturesConfig, {
        **options, "activations": _path(activations, "activations"), "sae": sae, "fit_fold": fit_fold,
        "out": _out(out, "mine")}, "mine_features"))


@api_function("memtoc.jobs.lens_fit:LensFitConfig")
def _lens_fit(*, backend: Any = None, out: str | Path | None = None, **options: Any) -> Any:
    """``memtoc lens fit``: the averaged Jacobian lens of ``backend`` (a loaded hf-family backend, or else
    ``model`` loaded on hf) into ``out`` (a .safetensors file; resumable). ``layers="default"``: the rank table's
    default band."""
    backend = _backend(backend, options)
    from memtoc.jobs.lens_fit import LensFitConfig, run_lens_fit

    return run_lens_fit(_build(LensFitConfig, {**options, "out": _out(out, "lens.safetensors")}, "lens_fit"),
                        backend=backend)


def judge(run: Any, *, judge_model: str = "default", backend: str = "hf", device: str = "auto", dtype: str = "auto",
          batch_size: int | None = None, prompts: str | None = None, output: str = "judge.jsonl",
          progress: bool = True, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.9,
          max_model_len: int | None = None, **unknown: Any) -> Any:
    """``memtoc judge``: the release's judge requests (answer extraction, acknowledgment) of a finished run into
    ``RUN/judge.jsonl`` (resumable); read them with ``mt.compare(..., layer="judged")`` or ``mt.study``."""
    _refuse("judge", unknown)
    from memtoc.jobs.judge import JudgeConfig, run_judge

    return run_judge(JudgeConfig(run_dir=_path(run, "run"), judge_model=judge_model, backend=backend, device=device,
                                 dtype=dtype, batch_size=batch_size, prompts=prompts, output=output,
                                 progress=progress, tensor_parallel_size=tensor_parallel_size,
                                 gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len))


def ack_export(runs: Any, *, sheet: str | Path, key: str | Path | None = None, per_stratum: int = 20,
               detector: str = "llm", layer: str = "judged", judge_file: str = "judge.jsonl",
               allow_partial: bool = False, seed: int = 0, **unknown: Any) -> dict[str, Any]:
    """``memtoc ack export``: a blinded, detector-stratified annotation sheet (CSV) of the arms' answers and its
    key. The ``llm`` detector reads each run's judge pass (``mt.judge`` first)."""
    _refuse("ack_export", unknown)
    from memtoc.jobs.ack import run_ack_export

    return run_ack_export(_paths(runs, "runs"), os.fspath(sheet), key=None if key is None else os.fspath(key),
                          per_stratum=per_stratum, detector=detector, layer=layer, judge_file=judge_file,
                          allow_partial=allow_partial, seed=seed)


def ack_import(key: str | Path, *, labels: Any, output: str | Path | None = None, seed: int = 0,
               **unknown: Any) -> dict[str, Any]:
    """``memtoc ack import``: one or two annotated sheets back: agreement, detector precision and recall, and the
    two-stage prevalence per arm."""
    _refuse("ack_import", unknown)
    from memtoc.jobs.ack import run_ack_import

    sheets = [os.fspath(labels)] if isinstance(labels, (str, os.PathLike)) else [os.fspath(p) for p in labels]
    return run_ack_import(os.fspath(key), sheets, output=None if output is None else os.fspath(output), seed=seed)


def report(target: Any, *, out: str | Path | None = None, **unknown: Any) -> Any:
    """``memtoc report``: one self-contained HTML page (and Markdown) for a run, sweep or experiment directory."""
    _refuse("report", unknown)
    from memtoc.jobs.report.build import write_report

    return write_report(_path(target, "target"), None if out is None else os.fspath(out))


def study(base: Any, arms: Any = (), *, family: str = "arm", metrics: Any = None, holm_metrics: Any = "retention",
          model_metrics: Any = None, layer: str = "judged", judge_file: str | None = None,
          model_pairs: Sequence[str] = (), alpha: float = 0.05, n_boot: int = 1000, n_perm: int = 10000,
          seed: int = 0, out: str | Path | None = None, **unknown: Any) -> Any:
    """``memtoc study``: the paper's statistics over base run(s) and arms (Holm families, the criterion per
    formulation, z tests, the stability rule), read in ``layer`` (judged: the paper's; needs each run's judge pass).
    Returns the study; ``layer="both"``: a dict layer -> study (the deterministic one written to OUT/deterministic).
    ``arms``: run directories, ``Run`` objects or "LABEL=DIR"."""
    _refuse("study", unknown)
    from memtoc.jobs.study.run import run_study_dirs
    from memtoc.scoring.metrics import COMPARISON_METRICS

    arm_paths = [a if isinstance(a, str) and "=" in a else _path(a, "arms") for a in
                 ([arms] if isinstance(arms, (str, os.PathLike)) or hasattr(arms, "path") else list(arms))]
    got = {one: s for one, s, _, _ in run_study_dirs(
        _paths(base, "base"), arm_paths, layer=layer, judge_file=judge_file,
        out=None if out is None else os.fspath(out), family=family,
        metrics=tuple(_csv(metrics) or COMPARISON_METRICS), holm_metrics=tuple(_csv(holm_metrics) or ()),
        model_metrics=_csv(model_metrics), alpha=alpha, n_boot=n_boot, n_perm=n_perm, seed=seed,
        model_pairs=tuple(model_pairs))}
    return got if layer == "both" else got[layer]


#: The job functions whose signature is generated (:mod:`memtoc.api.signature`), by public name.
_GENERATED = {"sae_train": _sae_train, "mine_features": _mine_features, "lens_fit": _lens_fit}


def __getattr__(name: str) -> Any:
    fn = _GENERATED.get(name)
    if fn is None:
        raise AttributeError(f"module 'memtoc.api.study_jobs' has no attribute {name!r}")
    value = globals()[name] = finalize(fn, name)
    return value
