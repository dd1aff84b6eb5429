"""The four jobs (and the commands around them) as functions, one per ``memtoc`` command.

Each function takes the command's options as keywords (``--question-set`` is ``question_set``), fills the rest
with the command's own defaults (:mod:`memtoc.api._args`) and calls the function the command calls
(``memtoc.tasks.memtoc.evaluate.evaluate``, ``activations.extract.extract``,
``memtoc.cli.probes.probe_from_args``, ...), so a
notebook and ``memtoc COMMAND`` write the same files and records. What differs:

- ``out`` may be left out: results then go to a fresh temporary directory (``result.path`` says where);
- ``edit`` may be an edit object (``function_edit``, ``vector_edit``, ``Direction.edit``) as well as a spec path;
- ``backend`` may be a loaded backend (:func:`load_backend`), so a notebook loads the model once.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from memtoc.api._args import APIError, command_args
from memtoc.api.results import Comparison, Direction, Episodes, ProbeResult, RankTable, Run, Store, Sweep


def _log(s: str) -> None:
    print(s, file=sys.stderr)


def _out(out: Any, name: str) -> str:
    """``out``, or a new path inside a fresh temporary directory."""
    if out is not None:
        return str(out)
    return str(Path(tempfile.mkdtemp(prefix="memtoc-")) / name)


def _edit(edit: Any) -> tuple[Any, str | None]:
    """(edit object, spec path): exactly one is set when there is an edit."""
    if edit is None:
        return None, None
    if isinstance(edit, (str, Path)):
        return None, str(edit)
    if isinstance(edit, Direction):
        return None, str(edit.path)
    from steering.edits import Edit

    if isinstance(edit, Edit):
        return edit, None
    if callable(edit):
        raise APIError("a callable edit needs its sites: pass memtoc.function_edit(fn, layers=...)")
    raise APIError(f"edit must be a spec path, an edit object or a Direction, got {type(edit).__name__}")


def _path(x: Any) -> str:
    """A path argument that may also be a result object (Run, Store, Direction)."""
    return str(getattr(x, "path", x))


def load_benchmark(name: str = "demo") -> Any:
    """The benchmark ``--benchmark`` names (``demo``, ``full`` or a directory): questions, folds, frame."""
    from memtoc.bench.benchmark import load_benchmark as load

    return load(name)


def load_episodes(**options: Any) -> Episodes:
    """``memtoc episodes``: the built episodes with their exact prompt strings (``formulation``, ``conditions``,
    ``question_set``, ``limit``, ``frame``, ...)."""
    from memtoc.cli.commands import episodes_from_args

    eps, frame = episodes_from_args(command_args("episodes", {"output": "-", **options}))
    return Episodes(list(eps), frame)


def load_backend(model: str = "default", **options: Any) -> Any:
    """The backend ``memtoc evaluate --model MODEL`` loads (``backend``, ``device``, ``dtype``, ``adapter``, ...),
    from the one factory (``memtoc.backends.factory.load_backend``)."""
    from memtoc.backends.factory import load_backend as load
    from memtoc.tasks.memtoc.evaluate import EvaluationConfig
    from memtoc.core.options import config_from_args

    allowed = ("backend", "device", "dtype", "adapter", "tensor_parallel_size", "gpu_memory_utilization",
               "max_model_len")
    bad = sorted(k for k in options if k not in allowed)
    if bad:
        raise APIError(f"load_backend takes no option(s) {', '.join(bad)}; it takes model, {', '.join(allowed)}")
    cfg = config_from_args(EvaluationConfig, command_args("evaluate", {"model": model, "out": "-", **options}))
    return load(cfg.model_spec)


def evaluate(*, edit: Any = None, backend: Any = None, out: str | Path | None = None,
             log: Callable[[str], None] = _log, **options: Any) -> Run:
    """``memtoc evaluate``: run (or resume) the benchmark into ``out`` and return the :class:`Run`.

    ``edit``: a spec path, an edit object or a :class:`Direction`; ``backend``: a loaded backend (otherwise the
    model of ``model`` is loaded). Options: ``model``, ``benchmark``, ``formulations``, ``conditions``,
    ``question_set``, ``limit``, ``batch_size``, ``max_new_tokens``, ``adapter``, ``seed``, ...
    """
    from memtoc.tasks.memtoc.evaluate import EvaluationConfig, evaluate as run
    from memtoc.core.options import config_from_args

    obj, path = _edit(edit)
    cfg = config_from_args(EvaluationConfig, command_args("evaluate", {**options, "out": _out(out, "run"),
                                                                       "edit": path}))
    result = run(cfg, backend=backend, edit=obj, log=log)
    return Run(Path(cfg.out), result)


def extract(*, backend: Any = None, out: str | Path | None = None, **options: Any) -> Store:
    """``memtoc extract``: capture residual-stream activations into an HDF5 store and return it opened.

    Options: ``model``, ``benchmark``, ``conditions``, ``limit``, ``layers`` ("all", "3,5", [3, 5]),
    ``positions`` ("last_input,tool_span"), ``run`` (a run directory or :class:`Run` whose labels are joined), ...
    """
    from activations.extract import ExtractConfig, extract as run
    from memtoc.core.options import config_from_args

    if options.get("run") is not None:
        options["run"] = _path(options["run"])
    cfg = config_from_args(ExtractConfig, command_args("extract", {**options, "out": _out(out, "acts.h5")}))
    result = run(cfg, backend=backend)
    return Store(result.path, result)


def probe(activations: Any, *, label: str, out: str | Path | None = None, **options: Any) -> ProbeResult:
    """``memtoc probe``: grouped cross-validated linear probes, AUROC per stored site.

    ``activations``: a store path or :class:`Store`. Options: ``positive``, ``negative``, ``groups``,
    ``position_kind``, ``reduce``, ``run``, ``layers``, ``C``, ``folds``, ``seed``, ``n_boot``, ...
    """
    from memtoc.cli.probes import probe_from_args

    if options.get("run") is not None:
        options["run"] = _path(options["run"])
    report, files = probe_from_args(command_args("probe", {**options, "activations": _path(activations),
                                                           "label": label, "out": _out(out, "probe")}))
    return ProbeResult(report, files)


def direction(activations: Any, *, contrast: str, fold: str | None = None, split_questions: str | None = None,
              all_questions: bool = False, out: str | Path | None = None, **options: Any) -> Direction:
    """``memtoc direction``: a mean-difference direction edit from stored activations.

    Exactly one training split: ``fold`` ("A"), ``split_questions`` (a file) or ``all_questions=True``.
    Options: ``layers``, ``position_kind``, ``strength``, ``positions``, ``toward``, ``name``, ...
    """
    from memtoc.cli.steering import direction_from_args

    if sum(x is not None and x is not False for x in (fold, split_questions, all_questions or None)) != 1:
        raise APIError("direction needs exactly one of fold=, split_questions=, all_questions=True")
    ns = command_args("direction", {**options, "activations": _path(activations), "contrast": contrast,
                                    "fold": fold, "split_questions": split_questions, "all_questions": all_questions,
                                    "out": _out(out, "direction.json")})
    result, path = direction_from_args(ns)
    return Direction(result, Path(path))


def sweep(edit: Any, *, strengths: Any, backend: Any = None, out: str | Path | None = None,
          log: Callable[[str], None] = _log, **options: Any) -> Sweep:
    """``memtoc sweep``: evaluate ``edit`` at every strength (0 added as the baseline).

    ``strengths``: "0,2,4" or [0, 2, 4]. Options: ``direction`` (memory | tool), ``model``, ``conditions``,
    ``question_set``, ``limit``, ``max_new_tokens``, ``plot``, ``family``, ...
    """
    from memtoc.cli.steering import sweep_config_from_args
    from memtoc.tasks.memtoc.sweep import run_sweep

    obj, path = _edit(edit)
    ns = command_args("sweep", {**options, "edit": path or "-", "strengths": strengths,
                                "out": _out(out, "sweep")})
    cfg = sweep_config_from_args(ns)
    if obj is not None:
        from dataclasses import replace

        cfg = replace(cfg, intervention=replace(cfg.intervention, edit=None))
    return Sweep(run_sweep(cfg, backend=backend, edit=obj, log=log, task=ns.family))


def rank_table(run: Any, *, backend: Any = None, out: str | Path | None = None, **options: Any) -> RankTable:
    """``memtoc rank-table``: rank of the memory answer's first token at the last input position, per lens.

    ``run``: a run directory or :class:`Run`. Options: ``model``, ``lens`` ("logit", ["jacobian=lens.safetensors"]),
    ``lens_file``, ``layers``, ``condition``, ``cell``, ``answer``, ``top_k``, ``batch_size``, ...
    """
    from memtoc.cli.probes import rank_table_from_args

    table, files = rank_table_from_args(command_args("rank-table", {**options, "run": _path(run),
                                                                    "out": _out(out, "rank")}), backend=backend)
    return RankTable(table, files)


def compare(run_a: Any, run_b: Any, **options: Any) -> Comparison:
    """``memtoc compare``: paired comparison of run b against run a on common support, with the criterion.

    ``run_a``/``run_b``: run directories or :class:`Run` objects. Options: ``seed``, ``layer``, ``judge_file``,
    ``output`` (also write the comparison as JSON).
    """
    from memtoc.cli.commands import compare_from_args

    ns = command_args("compare", {**options, "run_a": _path(run_a), "run_b": _path(run_b)})
    comp = compare_from_args(ns)
    if ns.output:                            # as the command: also write the comparison as JSON
        from memtoc.core.fileio import write_json_atomic

        write_json_atomic(ns.output, comp.to_dict())
    return Comparison(comp)
