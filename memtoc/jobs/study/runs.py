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
from memtoc.runs.runstore import RunStore

BASE_LABEL = "base"


@dataclass(frozen=True)
class StudyRun:
    """One run directory read for a study. ``model`` is the model identity its ``run.json`` records."""

    label: str
    model: str
    path: Path
    records: tuple[dict[str, Any], ...]

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


def model_display_name(model: str) -> str:
    return str(model).rstrip("/").replace("\\", "/").split("/")[-1] or str(model)


def run_model_identity(info: dict[str, Any], path: Path) -> str:
    """The model a run was made with: ``identity.model``, else ``config.model``, else ``provenance.model``."""
    for block in ("identity", "config", "provenance"):
        value = (info.get(block) or {}).get("model")
        if value:
            return str(value)
    raise RunStoreError(f"{path / 'run.json'}: no model identity (field 'identity.model'); cannot place the "
                        "run in a study")


def load_run(spec: str | Path, *, default_label: str | None = None) -> StudyRun:
    """Read a run given as ``PATH`` or ``LABEL=PATH``. The label defaults to the directory name."""
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
    records = tuple(store.episodes.records())
    if not records:
        raise RunStoreError(f"{path}: the run has no scored episodes (episodes.jsonl is empty or missing)")
    return StudyRun(label=label or path.resolve().name, model=run_model_identity(info, path), path=path,
                    records=records)


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
        c = Contrast(model=a.model, arm=a.label, base_run=base, arm_run=a)
        if c.name in seen:
            raise RunStoreError(f"two arms named {c.name!r}; label them apart with LABEL=PATH")
        seen.add(c.name)
        out.append(c)
    return out
