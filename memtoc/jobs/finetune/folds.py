"""Cross-fitting by chain: train on one fold, evaluate on the other, then the reverse.

Every evaluated question is answered by an adapter that never saw it, nor any question of the same ToolHop
chain (``instance_id``): hops of one chain share entities, so a chain split across train and evaluation would
leak answers. The folds come from the benchmark (``Benchmark.folds``: the release's ``crossfit_folds.json``,
or the demo set's own ``folds.json``); this module never invents a split, it only checks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from memtoc.bench.benchmark import Benchmark
from memtoc.core.errors import MemtocError
from memtoc.bench.questions import Question


@dataclass(frozen=True)
class FoldSplit:
    """One direction of the fold pair: an adapter trained on ``train_fold`` answers ``eval_fold``."""

    train_fold: str
    eval_fold: str
    train: tuple[Question, ...]
    eval: tuple[Question, ...]

    @property
    def name(self) -> str:
        return f"train{self.train_fold}-eval{self.eval_fold}"

    @property
    def train_ids(self) -> list[str]:
        return [q.id for q in self.train]

    @property
    def eval_ids(self) -> list[str]:
        return [q.id for q in self.eval]


def _preview(ids: Sequence[object], n: int = 8) -> str:
    ids = sorted({str(i) for i in ids})
    return ", ".join(ids[:n]) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")


def assert_disjoint(train: Sequence[Question], evaluated: Sequence[Question], *, what: str = "split") -> None:
    """Raise :class:`MemtocError` naming the ids when a question or a chain is on both sides."""
    q_overlap = {q.id for q in train} & {q.id for q in evaluated}
    if q_overlap:
        raise MemtocError(f"{what}: {len(q_overlap)} question(s) both trained on and evaluated: {_preview(q_overlap)}")
    c_overlap = {q.instance_id for q in train} & {q.instance_id for q in evaluated}
    if c_overlap:
        raise MemtocError(f"{what}: {len(c_overlap)} chain(s) (instance_id) on both the training and the "
                          f"evaluation side: {_preview(c_overlap)}")


def crossfit_splits(bench: Benchmark, questions: Sequence[Question]) -> list[FoldSplit]:
    """The two directions (A->B and B->A) over ``questions``, checked for zero question and chain overlap.

    The benchmark must have exactly two folds, both non-empty among ``questions``; the check runs here, at
    build time, before any model is loaded.
    """
    if bench.folds is None:
        raise MemtocError(f"benchmark {bench.name!r} has no cross-fitting folds (crossfit_folds.json)")
    missing = [q.id for q in questions if q.id not in bench.folds]
    if missing:
        raise MemtocError(f"{len(missing)} question(s) have no fold: {_preview(missing)}")
    names = sorted(set(bench.folds.values()))
    if len(names) != 2:
        raise MemtocError(f"cross-fitting needs exactly two folds, the benchmark has {len(names)}: {names}")
    by_fold = {n: tuple(q for q in questions if bench.folds[q.id] == n) for n in names}
    empty = [n for n in names if not by_fold[n]]
    if empty:
        raise MemtocError(f"fold(s) {', '.join(empty)} have no questions among the {len(questions)} selected; "
                          "raise --limit")
    a, b = names
    splits = [FoldSplit(a, b, by_fold[a], by_fold[b]), FoldSplit(b, a, by_fold[b], by_fold[a])]
    for s in splits:
        assert_disjoint(s.train, s.eval, what=f"cross-fitting split {s.name}")
    return splits
