"""The jobs as functions: each builds the job's typed config from keywords and calls the job (:mod:`memtoc.jobs`).

``memtoc COMMAND`` builds the same config from its options and calls the same ``run_<job>``, so a notebook, a
recipe and the command line write the same files and records. Every function's signature lists its options
with the config's own defaults (``inspect.signature(mt.evaluate)``); an unknown keyword or a value of the
wrong type is refused with one line naming the keyword (:class:`APIError`). What differs from the command line:

- ``out`` may be left out: results then go to a fresh temporary directory (``result.path`` says where);
- ``edit`` may be an edit object (``function_edit``, ``vector_edit``, ``Direction.edit``) as well as a spec path;
- ``backend`` may be a loaded backend (:func:`load_backend`), so a notebook loads the model once.

No parser is built and nothing of the command line is imported: ``mt.compare`` loads neither torch nor h5py.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from memtoc.api.errors import APIError
from memtoc.api.results import Comparison, Direction, Episodes, ProbeResult, RankTable, Run, Store, Sweep
from memtoc.api.signature import api_function, finalize

if TYPE_CHECKING:                                   # (annotations only: the API stays light to import)
    from memtoc.backends.base import TextBackend
    from steering.edits import Edit


def _log(s: str) -> None:
    print(s, file=sys.stderr)


def out_path(out: Any, name: str) -> str:
    """``out``, or a new path inside a fresh temporary directory that is removed when the interpreter exits (a call
    without ``out=`` leaves nothing behind; give ``out=`` to keep the files)."""
    if out is None:
        tmp = tempfile.mkdtemp(prefix="memtoc-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        return str(Path(tmp) / name)
    if not isinstance(out, (str, os.PathLike)):
        raise APIError(f"out must be a path (str or pathlib.Path), got {type(out).__name__} {out!r}")
    return os.fspath(out)


def resolve_edit(edit: Any) -> tuple[Any, str | None]:
    """(edit object, spec path) of what a caller passed as ``edit``: exactly one is set when there is an edit."""
    if edit is None:
        return None, None
    if isinstance(edit, (str, os.PathLike)):
        return None, os.fspath(edit)
    if isinstance(edit, Direction):
        return None, str(edit.path)
    from steering.edits import Edit

    if isinstance(edit, Edit):
        return edit, None
    if callable(edit):
        raise APIError("a callable edit needs its sites: pass memtoc.function_edit(fn, layers=...)")
    raise APIError(f"edit must be a spec path, an edit object or a Direction, got {type(edit).__name__}")


def path_arg(x: Any, key: str) -> str:
    """A path argument that may also be a result object (Run, Store, Direction)."""
    x = getattr(x, "path", x)
    if not isinstance(x, (str, os.PathLike)):
        raise APIError(f"{key} must be a path (or a Run / Store), got {type(x).__name__} {x!r}")
    return os.fspath(x)


def job_config(cls: type, values: Mapping[str, Any], job: str, *, backend: Any = None) -> Any:
    """The job's config from keywords, checked as the command line checks it before anything loads or is written
    (:func:`memtoc.jobs.registry.check_config`: the path contract with its inputs' existence and kind, and the
    checks that need only the model's shape; ``backend``: the loaded backend given, whose model those read instead).
    A config error becomes an :class:`APIError` naming the keyword; the others keep their one-line type."""
    from memtoc.core.values import ConfigError, build_config
    from memtoc.jobs.registry import check_config

    try:
        cfg = build_config(cls, values, where=f"{job}: ")
    except ConfigError as exc:
        raise APIError(str(exc).replace(f"{job}: unknown option(s)", f"{job} takes no option(s)")) from None
    check_config(cfg, loaded=backend is not None)
    return cfg


def backend_arg(backend: Any, options: dict[str, Any]) -> Any:
    """``backend=``: a loaded backend (:func:`load_backend`), or the runtime's name (``"hf"``, ``"vllm"``)."""
    if isinstance(backend, str):
        from memtoc.core.backend_kinds import BACKEND_NAMES

        if backend not in BACKEND_NAMES:
            raise APIError(f"backend must be a loaded backend (mt.load_backend(...)) or one of "
                           f"{', '.join(BACKEND_NAMES)}; got {backend!r} (the model is model=)")
        options["backend"] = backend
        return None
    return backend


def _family_config(command: str, family: str) -> type:
    """The config of ``command`` for a benchmark family: its own job's (``codeexec sweep``) or the MemToC one."""
    import memtoc.jobs.catalog  # noqa: F401 - the job table
    from memtoc.jobs.registry import JOBS

    name = command if family == "memtoc" else f"{family} {command}"
    if name not in JOBS:
        families = ["memtoc"] + [n.split()[0] for n in JOBS if n.endswith(f" {command}")]
        raise APIError(f"{command}: family must be {', '.join(families[:-1])} or {families[-1]}, got {family!r}")
    return JOBS[name].config_class()


def load_benchmark(name: str = "demo") -> Any:
    """The benchmark ``--benchmark`` names (``demo``, ``full`` or a directory): questions, folds, frame."""
    from memtoc.bench.benchmark import load_benchmark as load

    if not isinstance(name, (str, os.PathLike)):
        raise APIError(f"load_benchmark: name must be 'demo', 'full' or a path, got {type(name).__name__} {name!r}")
    return load(os.fspath(name))


@api_function("memtoc.jobs.episodes:EpisodesConfig", exclude=("out",))
def _load_episodes(**options: Any) -> Episodes:
    """``memtoc episodes``: the built episodes with their exact prompt strings (``formulations``, ``conditions``,
    ``question_set``, ``limit``, ``frame``, ``protocol``, ...)."""
    from memtoc.jobs.episodes import EpisodesConfig, run_episodes

    if "out" in options:
        raise APIError("load_episodes takes no option(s) out: it returns the episodes (memtoc episodes writes them)")
    res = run_episodes(job_config(EpisodesConfig, options, "load_episodes"))
    return Episodes(res.episodes, res.frame)


@api_function("memtoc.core.config:ModelSpec")
def _load_backend(model: str = "default", **options: Any) -> Any:
    """The backend ``memtoc evaluate --model MODEL`` loads (``backend``, ``device``, ``dtype``, ``adapter``, ...),
    from the one factory (``memtoc.backends.factory.load_backend``)."""
    from memtoc.backends.factory import load_backend as load
    from memtoc.core.config import ModelSpec       # (importing the config pieces registers ModelSpec's options)

    return load(job_config(ModelSpec, {"model": model, **options}, "load_backend"))


@api_function("memtoc.jobs.evaluate:EvaluationConfig")
def _evaluate(*, edit: str | Path | Edit | Direction | None = None, backend: str | TextBackend | None = None,
              out: str | Path | None = None,
              log: Callable[[str], None] = _log, family: str = "memtoc", **options: Any) -> Run:
    """``memtoc evaluate``: run (or resume) the benchmark into ``out`` and return the :class:`Run`.

    ``edit``: a spec path, an edit object or a :class:`Direction`; ``backend``: a loaded backend (otherwise the
    model of ``model`` is loaded). The options are the command's (the signature lists them); a protocol
    (``protocol="paper"``) fills only the options not given here. ``family``: ``"memtoc"``, ``"codeexec"``
    (``memtoc codeexec evaluate``) or ``"agent"`` (``memtoc agent evaluate``), whose configs then take their own
    options (``split``, ``policy``, ``first_call``, ...; ``protocols``, ``slice``, ...); every family's run is a
    :class:`Run` over the same result type.
    """
    backend = backend_arg(backend, options)
    from memtoc.jobs.evaluate import run_evaluate

    cls = _family_config("evaluate", family)
    obj, path = resolve_edit(edit)
    values = {**options, "out": out_path(out, "run")}
    if path is not None and family == "memtoc":
        values["edit"] = path                      # recorded in the config, as --edit is
    elif path is not None:
        from steering import load_edit as load     # the other families take the edit object (as their commands)

        obj = load(path)
    cfg = job_config(cls, values, "evaluate", backend=backend)
    return Run(Path(cfg.job.out), run_evaluate(cfg, backend=backend, edit=obj, log=log))


@api_function("memtoc.jobs.extract:ExtractConfig")
def _extract(*, backend: str | TextBackend | None = None, out: str | Path | None = None, **options: Any) -> Store:
    """``memtoc extract``: capture residual-stream activations into an HDF5 store and return it opened.

    ``layers`` ("all", "3,5", [3, 5]), ``position_kinds`` ("last_input,tool_span"), ``run`` (a run directory or
    :class:`Run` whose labels are joined), ...
    """
    backend = backend_arg(backend, options)
    from memtoc.jobs.extract import ExtractConfig, run_extract

    if options.get("run") is not None:
        options["run"] = path_arg(options["run"], "run")
    cfg = job_config(ExtractConfig, {**options, "out": out_path(out, "acts.h5")}, "extract", backend=backend)
    result = run_extract(cfg, backend=backend)
    return Store(result.path, result)


@api_function("memtoc.jobs.probe:ProbeConfig")
def _probe(activations: str | Path | Store, *, label: str, out: str | Path | None = None,
           **options: Any) -> ProbeResult:
    """``memtoc probe``: grouped cross-validated linear probes, AUROC per stored site.

    ``activations``: a store path or :class:`Store`; ``run``: a run directory or :class:`Run`.
    """
    from memtoc.jobs.probe import ProbeConfig, run_probe

    if options.get("run") is not None:
        options["run"] = path_arg(options["run"], "run")
    res = run_probe(job_config(ProbeConfig, {**options, "activations": path_arg(activations, "activations"),
                                         "label": label, "out": out_path(out, "probe")}, "probe"))
    return ProbeResult(res.report, res.files)


@api_function("memtoc.jobs.direction:DirectionConfig")
def _direction(activations: str | Path | Store, *, contrast: str, out: str | Path | None = None,
               **options: Any) -> Direction:
    """``memtoc direction``: a mean-difference direction edit from stored activations.

    Exactly one training split: ``fold`` ("A"), ``split_questions`` (a file) or ``all_questions=True``.
    """
    from memtoc.jobs.direction import DirectionConfig, run_direction

    cfg = job_config(DirectionConfig, {**options, "activations": path_arg(activations, "activations"),
                                   "contrast": contrast, "out": out_path(out, "direction.json")}, "direction")
    res = run_direction(cfg)
    return Direction(res.result, res.path)


@api_function("memtoc.tasks.memtoc.sweep:SweepConfig")
def _sweep(edit: str | Path | Direction | Any, *, strengths: str | Sequence[float],
           backend: str | TextBackend | None = None,
           out: str | Path | None = None, log: Callable[[str], None] = _log, family: str = "memtoc",
           **options: Any) -> Sweep:
    """``memtoc sweep``: evaluate ``edit`` at every strength (0 added as the baseline).

    ``strengths``: "0,2,4" or [0, 2, 4]; ``family``: "memtoc" or "codeexec" (the code-executor sweep, whose
    config then takes its own options: ``split``, ``policy``, ``first_call``, ...). ``executor="ray"`` runs the
    strengths as Ray tasks, as ``memtoc sweep --executor ray`` does (the edit then as a spec path or
    :class:`Direction`, the model by name).
    """
    backend = backend_arg(backend, options)
    from memtoc.jobs.sweep import run_sweep

    cls = _family_config("sweep", family)
    obj, path = resolve_edit(edit)
    values = {**options, "strengths": strengths, "out": out_path(out, "sweep")}
    if path is not None:
        values["edit"] = path
    cfg = job_config(cls, values, "sweep", backend=backend)
    return Sweep(run_sweep(cfg, backend=backend, edit=obj, log=log))


@api_function("memtoc.jobs.rank_table:RankTableJobConfig")
def _rank_table(run: str | Path | Run, *, backend: TextBackend | None = None, out: str | Path | None = None,
                **options: Any) -> RankTable:
    """``memtoc rank-table``: rank of the memory answer's first token at the last input position, per lens.

    ``run``: a run directory or :class:`Run`; ``lens``: "logit" or ["jacobian=lens.safetensors"]; ``backend``:
    a loaded backend of ``model``, or the runtime to load it on.
    """
    backend = backend_arg(backend, options)
    from memtoc.jobs.rank_table import RankTableJobConfig, run_rank_table

    values = {**options, "run": path_arg(run, "run"), "out": out_path(out, "rank")}
    cfg = job_config(RankTableJobConfig, values, "rank_table", backend=backend)
    res = run_rank_table(cfg, backend=backend)
    return RankTable(res.table, res.files)


@api_function("memtoc.jobs.compare:CompareConfig")
def _compare(run_a: str | Path | Run, run_b: str | Path | Run, **options: Any) -> Comparison:
    """``memtoc compare``: paired comparison of run b against run a on common support, with the criterion.

    ``run_a``/``run_b``: run directories or :class:`Run` objects; ``out``: also write the comparison as JSON;
    ``score_layer="judged"``: read both runs in the judged layer (``allow_partial``: accept a partial judge pass).
    """
    from memtoc.jobs.compare import CompareConfig, run_compare

    cfg = job_config(CompareConfig, {**options, "run_a": path_arg(run_a, "run_a"), "run_b": path_arg(run_b, "run_b")},
                 "compare")
    return Comparison(run_compare(cfg))


@api_function("memtoc.jobs.patch:PatchConfig")
def _patch(run: str | Path | Run, *, backend: TextBackend | None = None, out: str | Path | None = None,
           **options: Any) -> Any:
    """``memtoc patch``: activation patching of a clean/corrupt condition pair over a run's questions.

    ``run``: a run directory or :class:`Run` (its closed-book answers are the memory answers); ``backend``: a
    loaded backend of the run's model. Returns the job result: ``.to_pandas()`` is the hook point x role table,
    ``.pairs`` the per-pair effects, ``.files`` the files written (``patch.png``: the heat map).
    """
    from memtoc.jobs.patch import PatchConfig, run_patch

    cfg = job_config(PatchConfig, {**options, "run": path_arg(run, "run"), "out": out_path(out, "patch")}, "patch",
                 backend=backend)
    return run_patch(cfg, backend=backend)


@api_function("memtoc.jobs.features:FeaturesConfig")
def _features(mining: str | Path, *, out: str | Path | None = None, **options: Any) -> Any:
    """``memtoc features``: the dashboard page of a mining run's latents (``.files["html"]``, ``.views``)."""
    from memtoc.jobs.features import FeaturesConfig, run_features

    return run_features(job_config(FeaturesConfig, {**options, "mining": path_arg(mining, "mining"),
                                                "out": out_path(out, "features")}, "features"))


@api_function("memtoc.jobs.serve:ServeConfig")
def _serve(*, backend: str | TextBackend | None = None, wait: bool = True, log: Callable[[str], None] = _log,
           **options: Any) -> Any:
    """``memtoc serve``: answer steered / edited generation requests over HTTP (``POST /v1/generate``).

    ``backend``: a loaded backend (otherwise ``model`` is loaded on the named runtime); ``edits``: the edit spec
    paths requests may name. ``wait=True`` serves until interrupted, as the command does, and returns what the
    engine did; ``wait=False`` returns the running :class:`memtoc.jobs.serve.Server` at once (``.url``,
    ``.close()``; a context manager), its model calls in a thread of their own.
    """
    backend = backend_arg(backend, options)
    from memtoc.jobs.serve import ServeConfig, run_serve, start_server

    if isinstance(options.get("edits"), (str, Path)):
        options["edits"] = (options["edits"],)
    cfg = job_config(ServeConfig, options, "serve")
    if wait:
        return run_serve(cfg, backend=backend, log=log)
    return start_server(cfg, backend=backend, log=log).start_engine()


#: The job functions whose signature is generated (:mod:`memtoc.api.signature`), by public name.
_GENERATED = {"probe": _probe, "evaluate": _evaluate, "extract": _extract, "compare": _compare, "patch": _patch,
              "features": _features, "load_episodes": _load_episodes, "load_backend": _load_backend,
              "direction": _direction, "sweep": _sweep, "rank_table": _rank_table, "serve": _serve}


def __getattr__(name: str) -> Any:
    fn = _GENERATED.get(name)
    if fn is None:
        raise AttributeError(f"module 'memtoc.api.jobs' has no attribute {name!r}")
    value = globals()[name] = finalize(fn, name)
    return value
