"""The remaining jobs as functions: SAE training, feature mining, lens fit, judge, acknowledgment sheets, report,
study. Each builds its command's namespace from keywords (:func:`memtoc.api._args.command_args`, the command's own
defaults) and runs the command's own handler, so it writes what ``memtoc COMMAND`` writes; it returns a
:class:`JobOutput` naming the files. ``out`` may be left out (a fresh temporary directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from memtoc.api._args import _actions, _subparser, command_args
from memtoc.api.jobs import _out, _path


@dataclass
class JobOutput:
    """Where a job wrote: ``path`` (its output directory or file) and the files found there."""

    path: Path
    files: list[Path] = field(default_factory=list)

    def __fspath__(self) -> str:
        return str(self.path)


def _run(words: Sequence[str], options: dict[str, Any], positional: dict[str, Any] | None = None) -> None:
    acts = _actions(tuple(words))
    options = {k: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and k in acts
               and acts[k].type is None else v for k, v in options.items()}   # layers=2 is --layers 2
    ns = command_args(tuple(words), {**options, **{k: "-" for k in positional or ()}})
    for k, v in (positional or {}).items():             # positionals keep their Python shape (lists stay lists)
        setattr(ns, k, v)
    func = _subparser(tuple(words))._defaults["func"]
    func(ns)


def _output(path: str | Path) -> JobOutput:
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else ([p] if p.exists() else [])
    return JobOutput(p, files)


def sae_train(activations: Any, *, layers: Any, out: str | Path | None = None, **options: Any) -> JobOutput:
    """``memtoc sae train``: sparse autoencoders (sae-lens) on stored activations, one per site.

    Options: ``position_kinds`` (default all stored rows), ``conditions``, ``d_sae``, ``architecture``, ``k``,
    ``steps``, ``batch_size``, ``lr``, ``seed``, ...
    """
    out = _out(out, "sae")
    _run(("sae", "train"), {**options, "activations": _path(activations), "layers": layers, "out": out})
    return _output(out)


def mine_features(activations: Any, *, sae: str, fit_fold: str, run: Any = None, out: str | Path | None = None,
                  **options: Any) -> JobOutput:
    """``memtoc mine-features``: SAE features that separate following the tool from keeping memory; writes
    ``features.md`` / ``.json`` and an ``sae_clamp`` edit spec. ``sae``: ``"15=sae/"`` (site=dictionary)."""
    out = _out(out, "mine")
    _run(("mine-features",), {**options, "activations": _path(activations), "sae": sae, "fit_fold": fit_fold,
                              "run": None if run is None else _path(run), "out": out})
    return _output(out)


def lens_fit(*, out: str | Path | None = None, **options: Any) -> JobOutput:
    """``memtoc lens fit``: the averaged Jacobian lens (``model``, ``corpus``, ``layers``, ``limit``, ...)."""
    out = _out(out, "lens.safetensors")
    _run(("lens", "fit"), {**options, "out": out})
    return _output(out)


def judge(run: Any, **options: Any) -> JobOutput:
    """``memtoc judge``: the judged layer of a finished run (``judge_model``, ``backend``, ``output``, ...);
    returns the judge records file."""
    _run(("judge",), options, {"run_dir": _path(run)})
    name = options.get("output") or "judge.jsonl"
    return _output(Path(_path(run)) / name if not Path(name).is_absolute() else name)


def ack_export(runs: Any, *, sheet: str | Path | None = None, **options: Any) -> JobOutput:
    """``memtoc ack export``: the blinded acknowledgment sheet of one run or several (``detector``,
    ``per_stratum``, ``layer``, ``seed``, ...). With ``detector="llm"`` the runs need ``judge`` first."""
    runs = [_path(r) for r in (runs if isinstance(runs, (list, tuple)) else [runs])]
    sheet = str(sheet) if sheet is not None else _out(None, "ack.csv")
    _run(("ack", "export"), {**options, "sheet": sheet}, {"runs": runs})
    return _output(Path(sheet).parent)


def ack_import(key: str | Path, labels: str | Path, **options: Any) -> JobOutput:
    """``memtoc ack import``: the filled sheet against its key (``output`` to write the result as JSON)."""
    _run(("ack", "import"), options, {"key": str(key), "labels": str(labels)})
    return _output(options["output"]) if options.get("output") else JobOutput(Path(str(labels)))


def report(target: Any, *, out: str | Path | None = None) -> JobOutput:
    """``memtoc report``: one self-contained HTML page and Markdown for a run or experiment directory."""
    from memtoc.jobs.report.build import write_report

    res = write_report(_path(target), None if out is None else str(out))
    return JobOutput(Path(res.html).parent, [Path(res.html), Path(res.markdown)])


def study(base: Any, *, arms: Sequence[Any] = (), out: str | Path | None = None, **options: Any) -> JobOutput:
    """``memtoc study``: the paper's statistics over a base run and arms (``family``, ``metrics``, ``alpha``, ...)."""
    bases = [_path(b) for b in (base if isinstance(base, (list, tuple)) else [base])]
    out = _out(out, "study")
    _run(("study",), {**options, "out": out, "base": bases, "arm": [_path(a) for a in arms] or None})
    return _output(out)


__all__ = ["JobOutput", "sae_train", "mine_features", "lens_fit", "judge", "ack_export", "ack_import", "report",
           "study"]
