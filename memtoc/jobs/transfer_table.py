"""``memtoc transfer-table``: App. F.1's Table 6 from an untreated and a treated checkpoint's transfer runs.

Columns, each a change (arm - base) with its 95% paired bootstrap interval (B = 2,000 by default, questions as
clusters): kept memory in the value frame and in the passage frame, both read on the frames' COMMON support
(the questions present in both frames of both checkpoints, so the two frames are comparable; the paper's
185-item passage pool, 158 memory-right items on the anchor) and on the memory-right episodes (tool_wrong ∩ arb,
the ``retention`` metric under the MC matcher); abstention on the unanswerable split (passage runs); and
closed-book retention, the change in closed-book accuracy on the elicitation set, against the paper's
pre-registered +/-0.03 band.

Every join is on the transfer file's item ids (``transfer_item``, the row's ``id``), never on the row-index
question ids (``"i.0"``): two runs of differently ordered or filtered files still pair the same item. The
elicitation set is the answerable items (App. F.1: "the 981-item elicitation set"; the unanswerable split has no
gold option, so its ``memory_correct`` is None and must not count as a wrong answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt
from memtoc.core.vocab import CONFLICT_CONDITION
from memtoc.scoring.metrics import paired_metric_comparison
from memtoc.runs.runstore import RunStore
from memtoc.scoring.stats import paired_difference

#: App. F.1: "all three arms fall inside the preregistered ±0.03 band" (closed-book accuracy change)
RETENTION_BAND = 0.03


@dataclass(frozen=True)
class TransferRuns:
    base_value: str
    arm_value: str
    base_passage: str
    arm_passage: str


def _read(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    store = RunStore.read(path)
    eps = list(store.episodes.records())
    if not eps:
        raise MemtocError(f"{path}: no scored episodes")
    if not any(r.get("scorer") == "transfer_mc" for r in eps):
        raise MemtocError(f"{path}: not a transfer run (no record scored by the MC matcher; evaluate with "
                          "--benchmark transfer:FRAME[:FILE])")
    return eps, list(store.closed_book.records())


def _paired(a: Sequence[float], b: Sequence[float], clusters: Sequence[Any], n_boot: int, seed: int
            ) -> dict[str, Any]:
    res = paired_difference(list(a), list(b), list(clusters), n_boot=n_boot, n_perm=10000, seed=seed)
    return {"delta": res.delta, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value, "n": len(a),
            "value_base": sum(a) / len(a) if a else None, "value_arm": sum(b) / len(b) if b else None}


def _items(path: str, recs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Row-index question id -> (item id, split) of one run, from its scored records."""
    out: dict[str, tuple[str, str]] = {}
    for r in recs:
        if r.get("transfer_item") is None:
            raise MemtocError(f"{path}: episode {r.get('episode_id')!r} has no transfer_item (scored before item "
                              "ids were recorded); re-run the transfer evaluation")
        out[str(r["question_id"])] = (str(r["transfer_item"]), str(r.get("transfer_split") or "counterfactual"))
    return out


def _by_item(recs: Sequence[Mapping[str, Any]], common: set[str]) -> list[dict[str, Any]]:
    """The records of the common items, their question id replaced by the item id (the pairing key)."""
    return [dict(r, question_id=r["transfer_item"]) for r in recs if r["transfer_item"] in common]


def _unanswerable(recs: Sequence[Mapping[str, Any]]) -> dict[str, bool]:
    return {str(r["transfer_item"]): bool(r.get("abstain")) for r in recs
            if r.get("transfer_split") == "unanswerable" and r.get("condition") == CONFLICT_CONDITION}


def _closed_book_accuracy(cb: Sequence[Mapping[str, Any]], items: Mapping[str, tuple[str, str]]
                          ) -> dict[tuple[str, str], float]:
    """(item id, formulation) -> closed-book correctness on the answerable items (the elicitation set).

    An answerable item's abstaining or unmatched closed-book answer is wrong (0); the unanswerable split has no
    gold option and is left out rather than counted as 0."""
    out: dict[tuple[str, str], float] = {}
    for r in cb:
        qid = str(r.get("question_id") or str(r["key"]).split("|")[0])
        item = items.get(qid)
        if item is None or item[1] == "unanswerable":
            continue
        out[(item[0], str(r.get("formulation") or str(r["key"]).partition("|")[2]))] = \
            float(r.get("memory_correct") is True)
    return out


def transfer_table(runs: TransferRuns, *, n_boot: int = 2000, seed: int = 0, band: float = RETENTION_BAND
                   ) -> dict[str, Any]:
    """The four columns of Table 6 (module docstring) for one arm."""
    bv, bv_cb = _read(runs.base_value)
    av, _ = _read(runs.arm_value)
    bp, bp_cb = _read(runs.base_passage)
    ap, ap_cb = _read(runs.arm_passage)
    items = {p: _items(p, recs) for p, recs in ((runs.base_value, bv), (runs.arm_value, av),
                                                 (runs.base_passage, bp), (runs.arm_passage, ap))}
    answerable = lambda recs: {r["transfer_item"] for r in recs  # noqa: E731
                               if r.get("transfer_split") != "unanswerable"}
    common = answerable(bv) & answerable(av) & answerable(bp) & answerable(ap)
    out: dict[str, Any] = {"n_common_questions": len(common), "n_boot": n_boot, "seed": seed}
    for frame, base, arm in (("value", bv, av), ("passage", bp, ap)):
        sel_b, sel_a = _by_item(base, common), _by_item(arm, common)
        (comp,) = paired_metric_comparison(sel_b, sel_a, ["retention"], holm_family=[], n_boot=n_boot, seed=seed)
        r = comp.result
        out[f"{frame}_frame"] = {"delta": r.delta, "ci_low": r.ci_low, "ci_high": r.ci_high, "p": r.p_value,
                                 "n": comp.n_common, "value_base": comp.value_a, "value_arm": comp.value_b}
    ub, ua = _unanswerable(bp), _unanswerable(ap)
    qs = sorted(set(ub) & set(ua))
    out["abstention"] = (_paired([float(ub[q]) for q in qs], [float(ua[q]) for q in qs], qs, n_boot, seed)
                         if qs else {"delta": None, "n": 0, "note": "no unanswerable rows in the transfer file"})
    # closed-book retention on the elicitation set: the answerable items' closed-book answers, paired by item id
    # (the passage runs hold every item; the unanswerable ones have no gold and are left out)
    cb_b = _closed_book_accuracy(bp_cb, items[runs.base_passage]) or \
        _closed_book_accuracy(bv_cb, items[runs.base_value])
    cb_a = _closed_book_accuracy(ap_cb, items[runs.arm_passage])
    keys = sorted(set(cb_b) & set(cb_a))
    ret = _paired([cb_b[k] for k in keys], [cb_a[k] for k in keys], [k[0] for k in keys], n_boot, seed)
    ret["band"] = band
    ret["within_band"] = None if ret["delta"] is None else abs(ret["delta"]) <= band + 1e-12
    out["retention"] = ret
    return out


def format_markdown(table: Mapping[str, Any], label: str = "arm") -> str:
    def cell(d: Mapping[str, Any]) -> str:
        if d.get("delta") is None:
            return "–"
        return f"{d['delta']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (n {d['n']})"

    ret = table["retention"]
    band = f"{'inside' if ret['within_band'] else 'OUTSIDE'} ±{ret['band']:.2f}" if ret["within_band"] is not None \
        else "n/a"
    return "\n".join([
        "# Out-of-distribution transfer (App. F.1, Table 6)", "",
        f"Changes against the untreated checkpoint, paired bootstrap B = {table['n_boot']}; both frames on the "
        f"common support of {table['n_common_questions']} questions, memory-right episodes (MC matcher).", "",
        "| arm | value frame | passage frame | abstention (unanswerable) | retention (closed book) |",
        "|---|---|---|---|---|",
        f"| {label} | {cell(table['value_frame'])} | {cell(table['passage_frame'])} | {cell(table['abstention'])} | "
        f"{cell(ret)} {band} |", ""])


def _run_dir(name: str) -> dict[str, Any]:
    return opt(f"{name.replace('_', ' ')} transfer run directory", required=True, path=True)


@dataclass
class TransferTableConfig:
    """``memtoc transfer-table``: App. F.1 Table 6 from the arm's and the base's transfer runs."""
    #: what each path is to this job (memtoc.core.paths: checked before anything loads or is written)
    PATH_ROLES: ClassVar[dict[str, str]] = {"base_value": "input-run", "arm_value": "input-run",
        "base_passage": "input-run", "arm_passage": "input-run", "out": "output-dir"}

    base_value: str = field(default="", metadata=_run_dir("base_value"))
    arm_value: str = field(default="", metadata=_run_dir("arm_value"))
    base_passage: str = field(default="", metadata=_run_dir("base_passage"))
    arm_passage: str = field(default="", metadata=_run_dir("arm_passage"))
    label: str = field(default="arm", metadata=opt("the arm's name in the table"))
    band: float = field(default=RETENTION_BAND, metadata=opt("closed-book retention band (paper ±0.03)"))
    n_boot: int = field(default=2000, metadata=opt("paired bootstrap draws (paper B = 2,000)"))
    seed: int = field(default=0, metadata=opt("seed of the paired bootstrap"))
    out: str | None = field(default=None, metadata=opt("directory for transfer_table.{json,md}", path=True))


@dataclass
class TransferTableResult:
    table: dict[str, Any]
    markdown: str


def run_transfer_table(cfg: TransferTableConfig) -> TransferTableResult:
    """The table (and its Markdown), written as ``transfer_table.{json,md}`` under ``cfg.out`` when given."""
    from memtoc.core.fileio import write_json_atomic, write_text_atomic
    from memtoc.core.fileio import json_ready

    table = transfer_table(TransferRuns(cfg.base_value, cfg.arm_value, cfg.base_passage, cfg.arm_passage),
                           n_boot=cfg.n_boot, seed=cfg.seed, band=cfg.band)
    md = format_markdown(table, cfg.label)
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "transfer_table.json", json_ready(table))
        write_text_atomic(out / "transfer_table.md", md)
    return TransferTableResult(table, md)
