"""The scorer-versus-human outcome validation round (paper §4 / App. B "Measurement validation": blinded human
labels on a stratified sample of 167 responses; the deterministic scorer reaches kappa 0.806, recall 1.00 for
tool following, 0.939 for retention and 0.706 for abstention) -- the outcome twin of the acknowledgment round.

Classes (the scorer's response classes): ``followed_tool``, ``kept_memory``, ``both``, ``abstain`` and
``other`` (``neither`` split by its subtype). :func:`export_outcome_sheet` writes a blinded sheet stratified by
the scorer's class (no class, arm or cell on the sheet) and its key; :func:`import_outcome_labels` reads one or
two annotated sheets back and gives Cohen's kappa between the scorer and the human consensus (and between the
annotators), the per-class recall (of each human class, the share the scorer put there) and the confusion table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from memtoc.core.errors import MemtocError
from memtoc.core.fileio import write_json_atomic, write_records_csv_atomic
from memtoc.scoring.judge.ack import (annotator_consensus, blinded, check_label_sheets, cohen_kappa,
                                      read_annotation_key, read_sheet_labels)

OUTCOME_CLASSES = ("followed_tool", "kept_memory", "both", "abstain", "other")
LABEL_COLUMN = "outcome"
#: the episodes the round samples: tool-conditioned ones with a closed-book answer and a tool value
_CONDITIONS = ("tool_wrong", "tool_right")


def scorer_class(rec: Mapping[str, Any]) -> str:
    """The scorer's class of one record (``neither`` by its subtype)."""
    out = rec.get("outcome")
    if out == "neither":
        return "abstain" if rec.get("neither_subtype") == "abstain" or rec.get("abstain") else "other"
    if out not in OUTCOME_CLASSES:
        raise MemtocError(f"episode {rec.get('episode_id')}: unknown outcome {out!r}")
    return str(out)


def export_outcome_sheet(arms: Sequence[tuple[str, str, Sequence[Mapping[str, Any]]]], *, sheet: str | Path,
                         key: str | Path, per_stratum: int = 35, seed: int = 0) -> dict[str, Any]:
    """A blinded sheet: up to ``per_stratum`` random tool_wrong / tool_right answers per scorer class (pooled over
    the arms), with the question, the closed-book answer, the tool value and the reply, and an empty
    ``outcome`` column for one of :data:`OUTCOME_CLASSES`; the key maps the opaque item ids back."""
    rng = np.random.default_rng(seed)
    pool = [(arm, run, r) for arm, run, recs in arms for r in recs if r.get("condition") in _CONDITIONS
            and r.get("tool_value") is not None and not r.get("mem_absent")]
    items = []
    counts = {}
    for cls in OUTCOME_CLASSES:
        stratum = [x for x in pool if scorer_class(x[2]) == cls]
        counts[cls] = len(stratum)
        for i in sorted(int(t) for t in rng.permutation(len(stratum))[:per_stratum]):
            arm, run, r = stratum[i]
            items.append({"arm": arm, "run": str(run), "episode_id": r["episode_id"], "scorer_class": cls,
                          "question": r.get("question", ""), "closed_book_answer": r.get("memory_span", ""),
                          "tool_value": r.get("tool_value"), "response": r.get("response", "")})
    if not items:
        raise MemtocError("nothing to annotate: no tool_wrong / tool_right episode with memory and a tool value")
    key_items, rows = blinded(items, rng, "O", ("arm", "run", "episode_id", "scorer_class"),
                              ("question", "closed_book_answer", "tool_value", "response"), LABEL_COLUMN)
    write_records_csv_atomic(sheet, rows)
    write_json_atomic(key, {"schema": "memtoc-outcome-key-v1", "classes": list(OUTCOME_CLASSES),
                            "per_stratum": per_stratum, "seed": seed, "population": counts, "items": key_items})
    return {"n_items": len(rows), "population": counts}


def read_outcome_labels(path: str | Path, known: Mapping[str, Any]) -> dict[str, str]:
    """item_id -> class from an annotated outcome sheet (see :func:`read_sheet_labels`)."""
    return read_sheet_labels(path, known, LABEL_COLUMN, {c: c for c in OUTCOME_CLASSES},
                             f"one of {', '.join(OUTCOME_CLASSES)}")


def import_outcome_labels(key_path: str | Path, label_paths: Sequence[str | Path]) -> dict[str, Any]:
    """Labels back: scorer-vs-human kappa, per-class recall and the confusion table (human rows, scorer columns);
    with two sheets the annotators' kappa too, and the scorer is read against their agreed items."""
    check_label_sheets(label_paths)
    _key, items = read_annotation_key(key_path, "memtoc outcome-round export", "memtoc-outcome-key-v1")
    labels = [read_outcome_labels(p, items) for p in label_paths]
    out: dict[str, Any] = {"n_items": len(items), "n_labelled": [len(x) for x in labels]}
    annotators, human = annotator_consensus(labels, cohen_kappa)
    if annotators is not None:
        out["annotators"] = annotators
        out["n_disagreements_excluded"] = annotators["n"] - len(human)
    ids = sorted(human)
    if not ids:
        raise MemtocError("no labelled item to score the scorer on")
    h = [human[i] for i in ids]
    s = [items[i]["scorer_class"] for i in ids]
    out["n"] = len(ids)
    out["agreement"] = sum(x == y for x, y in zip(h, s)) / len(ids)
    out["cohen_kappa"] = cohen_kappa(h, s)
    out["recall"] = {c: (sum(1 for x, y in zip(h, s) if x == c and y == c) / h.count(c)) if h.count(c) else None
                     for c in OUTCOME_CLASSES}
    out["confusion"] = {c: {d: sum(1 for x, y in zip(h, s) if x == c and y == d) for d in OUTCOME_CLASSES}
                        for c in OUTCOME_CLASSES}
    return out
