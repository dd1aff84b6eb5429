"""The runs of a study: each carries its model identity (from ``run.json``) and is paired with its base.

A study has one base run per model (the untreated checkpoint under the standard prompt) and any number of
arm runs. An arm is compared with the base run of the SAME model, because only there are the cells shared
(the same closed-book answers) and the contrast question-paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from memtoc.core.errors import RunStoreError
from memtoc.scoring.judge.layer import layer_records
from memtoc.scoring.judge.store import JUDGE_FILE, check_same_judge
from memtoc.runs.runstore import RunStore

BASE_LABEL = "base"


@dataclass(frozen=True)
class StudyRun:
    """One run directory read for a study. ``model`` is the model identity its ``run.json`` records."""

    label: str
    model: str
    path: Path
    records: tuple[dict[str, Any], ...]
    layer: str = "deterministic"            # the scoring layer the records are in (memtoc.scoring.judge.layer)
    judge: dict[str, Any] | None = None     # the judge identity (judged layer only)
    #: the scorer's own records, kept beside judged ones: the paper reads tool-error abstention and no-conflict
    #: accuracy from the deterministic scorer even in its judged tables (App. B, "Metric conventions")
    scorer_records: tuple[dict[str, Any], ...] | None = None

    def records_for(self, metric: str) -> tuple[dict[str, Any], ...]:
        """The records a metric is read from: the scorer's for :func:`is_scorer_metric`, else this layer's."""
        if self.scorer_records is not None and is_scorer_metric(metric):
            return self.scorer_records
        return self.records

    @property
    def model_name(self) -> str:
        """A short display name: the last path component of the model identity."""
        return model_display_name(self.model)


@dataclass(frozen=True)
class Contrast:
    """Arm vs the base run of the same model. ``name`` is ``<model name>/<arm label>``."""

    model: str
    arm: str
    base_run: StudyRun
    arm_run: StudyRun

    @property
    def name(self) -> str:
        return f"{self.base_run.model_name}/{self.arm}"


#: metric-name prefixes the paper reads from the deterministic scorer in every layer (App. B)
SCORER_METRIC_PREFIXES = ("tool_error_", "no_conflict_accuracy")


def is_scorer_metric(metric: str) -> bool:
    """Tool-error abstention (every payload, fall-back, both-wrong abstention) and no-conflict accuracy."""
    return metric.startswith(SCORER_METRIC_PREFIXES)


def model_display_name(model: str) -> str:
    return str(model).rstrip("/").replace("\\", "/").split("/")[-1] or str(model)


def run_model_identity(info: dict[str, Any], path: Path, why: str = "; cannot place the run in a study") -> str:
    """The model a run was made with: ``identity.model``, else ``config.model``, else ``provenance.model``
    (``why``: the end of the error when it has none)."""
    for block in ("identity", "config", "provenance"):
        value = (info.get(block) or {}).get("model")
        if value:
            return str(value)
    raise RunStoreError(f"{path / 'run.json'}: no model identity (field 'identity.model'){why}")


def load_run(spec: str | Path, *, default_label: str | None = None, layer: str = "deterministic",
             judge_file: str | None = None) -> StudyRun:
    """Read a run given as ``PATH`` or ``LABEL=PATH``, in a scoring layer. The label defaults to the directory name.

    ``layer="judged"`` applies the judge records beside the run (``judge.jsonl``; paper App. B reads retention,
    the two tool-following rates and case accuracy from that layer); a run without them is refused.
    """
    text = str(spec)
    label = default_label
    if "=" in text and not Path(text).exists():
        label, text = text.split("=", 1)
        label = label.strip()
        if not label:
            raise RunStoreError(f"{spec!r}: empty arm label before '='")
    path = Path(text)
    store = RunStore.read(path)
    info = store.run_info()
    records = list(store.episodes.records())
    if not records:
        raise RunStoreError(f"{path}: the run has no scored episodes (episodes.jsonl is empty or missing)")
    jf = judge_file or JUDGE_FILE
    if layer == "judged" and not (path / jf).is_file():
        raise RunStoreError(f"{path / jf}: no judge records for the judged layer; run `memtoc judge {path}` "
                            "first, or read the deterministic layer with --score-layer deterministic")
    lr = layer_records(records, layer, run_dir=path, judge_file=jf)
    return StudyRun(label=label or path.resolve().name, model=run_model_identity(info, path), path=path,
                    records=tuple(lr.records), layer=lr.layer, judge=lr.judge,
                    scorer_records=tuple(records) if lr.layer == "judged" else None)


def pair_contrasts(bases: Sequence[StudyRun], arms: Sequence[StudyRun]) -> list[Contrast]:
    """One contrast per arm, against the base run of its model. Refuses ambiguous or unmatched runs."""
    by_model: dict[str, StudyRun] = {}
    for b in bases:
        if b.model in by_model:
            raise RunStoreError(f"two base runs for model {b.model!r}: {by_model[b.model].path} and {b.path}; "
                                "give one base run per model")
        by_model[b.model] = b
    names = {model_display_name(m) for m in by_model}
    if len(names) != len(by_model):
        raise RunStoreError("two base runs' models share a display name: " + ", ".join(sorted(by_model)))
    out: list[Contrast] = []
    seen: set[str] = set()
    for a in arms:
        base = by_model.get(a.model)
        if base is None:
            raise RunStoreError(f"{a.path}: no base run of its model {a.model!r} (field 'identity.model'); base "
                                f"models: {', '.join(sorted(by_model)) or 'none'}")
        if a.label == BASE_LABEL:
            raise RunStoreError(f"{a.path}: the arm label {BASE_LABEL!r} is reserved for the base runs")
        if a.layer != base.layer:
            raise RunStoreError(f"{a.path}: read in the {a.layer} layer but its base {base.path} in the "
                                f"{base.layer} layer")
        if a.layer == "judged":
            check_same_judge(base.judge, a.judge, what_a=str(base.path), what_b=str(a.path))
        c = Contrast(model=a.model, arm=a.label, base_run=base, arm_run=a)
        if c.name in seen:
            raise RunStoreError(f"two arms named {c.name!r}; label them apart with LABEL=PATH")
        seen.add(c.name)
        out.append(c)
    return out
