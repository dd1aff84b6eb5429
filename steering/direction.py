"""Mean-difference directions from stored activations (methods.md section 3.2) -> a direction edit spec.

For sites ``s`` and a contrast ``A:B`` (two conditions, or two filters on the store's index columns; a side may
pool values, ``condition=P1|P2``): over the training split's rows of one ``position_kind``, grouped by
(question_id, formulation) with rows on both sides, the direction ``d`` is the mean over groups of
``mu_A - mu_B``; ``unit = d / ||d||`` and ``scale`` is the projection gap of the paired rows on ``unit`` (or its
absolute value, ``absolute_scale``).

A positive strength pushes the residual stream from B toward A. The spec says so in the contrast's own terms
(``"contrast": {"toward": A, "from": B}``) and which behaviour that is (``toward``: memory or tool, given by the
user or derived from the sides by :func:`derive_toward`; else null, and a sweep asks for it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from activations.store import open_store
from steering.kinds.direction import DirectionEdit, save_direction_edit
from steering.spec import DIRECTIONS, POSITIONS, EditSpecError


@dataclass(frozen=True)
class Side:
    """One side of a contrast: index column -> accepted value."""

    label: str
    filters: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str) -> "Side":
        """``tool_wrong`` (a condition) or ``col=value[,col=value...]``; ``value`` may list alternatives
        separated by ``|`` (any of them matches).

        E.g. ``condition=tool_wrong,outcome=kept_memory``; ``condition=P1|P2`` (the code executor's corrupted
        returns, pooled).
        """
        text = text.strip()
        if not text:
            raise EditSpecError("empty side in --contrast", field="contrast")
        filters = []
        for item in text.split(","):
            item = item.strip()
            if "=" in item:
                col, val = item.split("=", 1)
                filters.append((col.strip(), val.strip()))
            else:
                filters.append(("condition", item))
        return cls(label=text, filters=tuple(filters))

    def mask(self, index: Mapping[str, np.ndarray]) -> np.ndarray:
        n = len(index["row"])
        m = np.ones(n, dtype=bool)
        for col, val in self.filters:
            if col not in index:
                raise EditSpecError(f"the activation store has no index column {col!r} (columns: "
                                    f"{', '.join(index)})", field="contrast")
            arr = index[col]
            alternatives = [v.strip() for v in val.split("|")]
            if arr.dtype == object:
                _refuse_absent(col, alternatives, arr)
                m &= np.isin(arr, alternatives)
            else:
                try:
                    m &= np.isin(arr, [type(arr[0].item() if n else 0)(v) for v in alternatives])
                except (TypeError, ValueError):
                    raise EditSpecError(f"value {val!r} does not fit column {col!r}", field="contrast") from None
        return m


def _refuse_absent(col: str, values: list[str], column: np.ndarray) -> None:
    """A contrast value no stored row has is a typo or the wrong store: one line naming it, with the closest
    stored value (``tool_rigth``: did you mean ``tool_right``?) and every value the store holds."""
    import difflib

    from memtoc.bench.conditions import condition_names, recorded_conditions

    held = sorted(set(column.tolist()), key=str)
    known = {*condition_names(), *recorded_conditions()} if col == "condition" else set()
    for v in values:
        if v not in held and v not in known:        # a real condition the store lacks: the group count says so
            what = "condition" if col == "condition" else f"value of {col!r}"
            near = difflib.get_close_matches(v, [str(h) for h in held], n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise EditSpecError(f"unknown {what} {v!r} in --contrast: no stored row has it (the store holds "
                                f"{', '.join(map(str, held[:12]))}{', ...' if len(held) > 12 else ''}){hint}",
                                field="contrast")


def parse_contrast(text: str) -> tuple[Side, Side]:
    parts = text.split(":")
    if len(parts) != 2:
        raise EditSpecError(f"--contrast must be A:B (e.g. tool_wrong:tool_right), got {text!r}", field="contrast")
    return Side.parse(parts[0]), Side.parse(parts[1])


#: the source that is right in each MemToC condition that sets memory against the tool (the others: none)
RIGHT_SOURCE = {"tool_right": "tool", "tool_wrong": "memory", "tool_wrong_far": "memory"}
#: the behaviour each outcome label records
OUTCOME_BEHAVIOUR = {"kept_memory": "memory", "followed_tool": "tool"}


def side_behaviour(side: Side) -> tuple[str | None, str]:
    """(memory | tool | None, why) of one side: its outcome filter (what the model did) first, else its condition
    (which source is right there)."""
    values = dict(side.filters)
    outcome = values.get("outcome")
    if outcome in OUTCOME_BEHAVIOUR:
        return OUTCOME_BEHAVIOUR[outcome], f"outcome {outcome}"
    condition = values.get("condition")
    if condition in RIGHT_SOURCE:
        right = RIGHT_SOURCE[condition]
        return right, f"{condition}: {'the tool' if right == 'tool' else 'memory'} is the right source"
    return None, "no memory/tool side"


def derive_toward(contrast: str) -> tuple[str | None, str]:
    """(behaviour, basis) a positive strength of ``contrast``'s direction pushes toward, from its sides: side A's
    behaviour when the two sides have different ones (``tool_wrong:tool_right``: memory, the state in which memory
    is right; ``outcome=followed_tool:outcome=kept_memory``: tool), else None."""
    a, b = parse_contrast(contrast)
    (ta, why_a), (tb, why_b) = side_behaviour(a), side_behaviour(b)
    basis = f"side A {a.label} ({why_a}) over side B {b.label} ({why_b})"
    if ta is not None and tb is not None and ta != tb:
        return ta, f"derived from the contrast: {basis}"
    return None, f"not derivable from the contrast ({basis}); give --toward memory|tool"


def read_question_split(path: str | Path) -> set[str]:
    """Training question ids: a JSON list, a JSON object with ``train`` (list), or one id per line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise EditSpecError(f"cannot read the question split: {exc}", path=p, field="split_questions") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, Mapping):
        doc = doc.get("train")
        if not isinstance(doc, list):
            raise EditSpecError("a JSON split file needs a 'train' list of question ids", path=p, field="train")
    if isinstance(doc, list):
        ids = {str(x) for x in doc}
    else:
        ids = {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}
    if not ids:
        raise EditSpecError("no question id in the split file", path=p, field="split_questions")
    return ids


def fold_questions(benchmark: str, fold: str) -> set[str]:
    from memtoc.bench.benchmark import load_benchmark

    name = fold[len("fold-"):] if fold.startswith("fold-") else fold
    return {q.id for q in load_benchmark(benchmark).fold(name)}


def group_means(x: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """float64 ``[n_groups, d]``: the mean of the rows of ``x`` in each group (rows mapped to groups by ``groups``)."""
    sums = np.zeros((n_groups, x.shape[1]), dtype=np.float64)
    np.add.at(sums, groups, x)
    return sums / np.bincount(groups, minlength=n_groups)[:, None]


@dataclass
class DirectionFit:
    """The fitted direction of one site and what it was fitted on."""

    site: int
    unit: np.ndarray            # float32 [d]
    scale: float                # projection gap mean_A(u.x) - mean_B(u.x)
    norm: float                 # ||d|| (mean of within-question differences)
    n_groups: int
    n_rows_a: int
    n_rows_b: int


@dataclass
class DirectionResult:
    fits: dict[int, DirectionFit]
    source: dict[str, Any] = field(default_factory=dict)


def estimate_directions(store_path: str | Path, *, contrast: str, layers: Sequence[int] | None,
                        position_kind: str = "last_input", train_questions: set[str] | None,
                        min_groups: int = 1, absolute_scale: bool = False) -> DirectionResult:
    """Fit one unit direction and projection gap per site (see the module docstring).

    ``absolute_scale``: the scale is ``|gap|`` (the overreliance paper's "absolute difference in mean
    projection"), so a positive strength always moves along ``unit``, from B toward A.
    """
    a_side, b_side = parse_contrast(contrast)
    with open_store(store_path) as store:
        stored = store.layers
        sites = list(stored) if layers is None else [int(s) for s in layers]
        missing = [s for s in sites if s not in stored]
        if missing:
            raise EditSpecError(f"site(s) {missing} are not in {store_path} (stored: {stored})", field="layers")
        idx = store.index
        base = idx["position_kind"] == position_kind
        if not base.any():
            kinds = sorted(set(idx["position_kind"].tolist()))
            raise EditSpecError(f"no rows of position kind {position_kind!r} in {store_path} (has {kinds})",
                                field="position_kind")
        if train_questions is not None:
            base &= np.isin(idx["question_id"], sorted(train_questions))
            if not base.any():
                raise EditSpecError("no stored question is in the training split", field="split")
        ma, mb = base & a_side.mask(idx), base & b_side.mask(idx)
        if (ma & mb).any():
            raise EditSpecError(f"rows match both sides of the contrast {contrast!r}", field="contrast")
        key = np.asarray([f"{q}\x1f{f}" for q, f in zip(idx["question_id"], idx["formulation"])], dtype=object)
        ka, kb = set(key[ma].tolist()), set(key[mb].tolist())
        groups = sorted(ka & kb)
        if len(groups) < max(1, min_groups):
            raise EditSpecError(f"{len(groups)} (question, formulation) groups have rows on both sides of "
                                f"{contrast!r} ({int(ma.sum())} rows of {a_side.label}, {int(mb.sum())} of "
                                f"{b_side.label}); need at least {max(1, min_groups)}", field="contrast")
        gid = {g: i for i, g in enumerate(groups)}
        rows_a = np.flatnonzero(ma & np.isin(key, groups))
        rows_b = np.flatnonzero(mb & np.isin(key, groups))
        ga = np.asarray([gid[k] for k in key[rows_a]])
        gb = np.asarray([gid[k] for k in key[rows_b]])
        fits = {}
        for s in sites:
            xa = store.read(s, rows_a).astype(np.float64)
            xb = store.read(s, rows_b).astype(np.float64)
            G = len(groups)
            d = (group_means(xa, ga, G) - group_means(xb, gb, G)).mean(axis=0)
            norm = float(np.linalg.norm(d))
            if not np.isfinite(norm) or norm == 0.0:
                raise EditSpecError(f"site {s}: the mean difference is zero; no direction", field="layers")
            unit = d / norm
            scale = float((xa @ unit).mean() - (xb @ unit).mean())
            if absolute_scale:
                scale = abs(scale)
            fits[s] = DirectionFit(site=s, unit=unit.astype(np.float32), scale=scale, norm=norm, n_groups=G,
                                   n_rows_a=int(rows_a.size), n_rows_b=int(rows_b.size))
        attrs = store.attrs
    from memtoc.core.fileio import sha256_file

    source = {
        "method": "mean of within-question (question_id, formulation) differences of group means; unit vector; "
                  "scale = pooled projection gap mean_A(u.x) - mean_B(u.x)",
        "activations": str(store_path), "activations_sha256": sha256_file(store_path),
        "activations_identity_sha256": attrs.get("identity_sha256"), "model": attrs.get("model_id"),
        "scale": "|projection gap|" if absolute_scale else "projection gap",
        "contrast": contrast, "side_a": a_side.label, "side_b": b_side.label, "position_kind": position_kind,
        "n_groups": {str(s): f.n_groups for s, f in fits.items()},
        "n_rows": {str(s): [f.n_rows_a, f.n_rows_b] for s, f in fits.items()},
        "mean_difference_norm": {str(s): f.norm for s, f in fits.items()},
        "n_train_questions": None if train_questions is None else len(train_questions),
        "train_questions_sha256": None if train_questions is None else hashlib.sha256(
            "\n".join(sorted(train_questions)).encode()).hexdigest(),
    }
    return DirectionResult(fits=fits, source=source)


def random_control(result: DirectionResult, seed: int) -> DirectionResult:
    """A norm-matched random control: the same scales, random unit directions (seeded)."""
    g = np.random.default_rng(seed)
    fits = {}
    for s, f in result.fits.items():
        v = g.standard_normal(f.unit.shape[0])
        fits[s] = DirectionFit(site=s, unit=(v / np.linalg.norm(v)).astype(np.float32), scale=f.scale, norm=f.norm,
                               n_groups=f.n_groups, n_rows_a=f.n_rows_a, n_rows_b=f.n_rows_b)
    return DirectionResult(fits=fits, source={**result.source, "random_control_seed": seed,
                                              "method": "random unit directions (control), scales of the fitted "
                                                        "directions"})


def direction_edit(result: DirectionResult, *, name: str, positions: str = "last_input", strength: float = 1.0,
                   toward: str | None = "memory", toward_basis: str | None = None,
                   apply_to_closed_book: bool = False) -> DirectionEdit:
    """The edit of ``result``; the spec records the contrast's sides (``contrast``: what the vector points toward
    and from), the behaviour a positive strength pushes toward (``toward``, None when unknown) and its basis."""
    if positions not in POSITIONS:
        raise EditSpecError(f"positions must be one of {', '.join(POSITIONS)}", field="positions")
    if toward is not None and toward not in DIRECTIONS:
        raise EditSpecError(f"toward must be one of {', '.join(DIRECTIONS)}", field="toward")
    sites = sorted(result.fits)
    extra: dict[str, Any] = {}
    if result.source.get("side_a") is not None:
        extra["contrast"] = {"toward": result.source["side_a"], "from": result.source["side_b"]}
    if toward_basis is not None:
        extra["toward_basis"] = toward_basis
    return DirectionEdit.build(name=name, layers=sites,
                               vectors={s: torch.from_numpy(result.fits[s].unit) for s in sites},
                               scale={s: result.fits[s].scale for s in sites}, positions=positions,
                               strength=strength, toward=toward, apply_to_closed_book=apply_to_closed_book,
                               source=result.source, **extra)


def write_direction(out: str | Path, result: DirectionResult, **kwargs: Any) -> Path:
    """Spec at ``out`` plus the vectors file ``<stem>.safetensors`` beside it."""
    edit = direction_edit(result, **kwargs)
    return save_direction_edit(out, edit)
