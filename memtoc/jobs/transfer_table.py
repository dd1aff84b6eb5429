"""``memtoc transfer-table``: App. F.1's Table 6 from an untreated and a treated checkpoint's transfer runs.

Columns, each a change (arm - base) with its 95% paired bootstrap interval (questions as clusters):

- kept memory in the value and the passage frame, on the frames' COMMON support (the answerable items in both
  frames of both checkpoints; the paper's 185-item passage pool) restricted to a FIXED ANCHOR support: the items
  the untreated checkpoint answers correctly closed-book (App. F.1: "n = 158 memory-right items on the anchor").
  A checkpoint's value on an item is whether its tool_wrong answer names the gold option, so an adapter's own
  re-elicited closed book never moves the support;
- the value frame's secondary reading on the value runs' whole pool (the paper's 279 items), same anchor;
- abstention on the unanswerable split (passage runs);
- closed-book retention on the ELICITATION SET (App. F.1's 981 items) against the pre-registered +/-0.03 band:
  the set is ``--elicitation FILE`` (its answerable rows) or the elicitation runs' own file; the answers come from
  ``--base-elicitation``/``--arm-elicitation`` runs or, without them, the frame runs. An item of the set without a
  closed-book answer is refused, never silently dropped.

Every join is on the transfer file's item ids (``transfer_item``), never on row-index question ids, so runs of
differently ordered or filtered files still pair the same item.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt
from memtoc.jobs import TableDocument
from memtoc.core.vocab import CONFLICT_CONDITION
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
    #: evaluate runs on the elicitation file (their closed book covers the set); None: the frame runs
    base_elicitation: str | None = None
    arm_elicitation: str | None = None


def _read(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A transfer run's scored episodes and closed-book records (refused when it is not a transfer run)."""
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


def _tool_wrong_correct(recs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """(item id, formulation) -> whether the tool_wrong answer names the gold option (answerable items)."""
    return {(str(r["transfer_item"]), str(r.get("formulation") or "reference")): float(bool(r.get("final_correct")))
            for r in recs if r.get("condition") == CONFLICT_CONDITION and r.get("transfer_split") != "unanswerable"}


def _frame(base: Sequence[Mapping[str, Any]], arm: Sequence[Mapping[str, Any]], items: set[str],
           anchor: Mapping[tuple[str, str], bool], n_boot: int, seed: int) -> dict[str, Any]:
    """Kept memory (answer names the gold option) on ``items`` where the anchor's closed book is right."""
    vb, va = _tool_wrong_correct(base), _tool_wrong_correct(arm)
    keys = sorted(k for k in set(vb) & set(va) if k[0] in items and anchor.get(k, False))
    if not keys:
        return {"delta": None, "n": 0, "note": "no anchor memory-right item on this support"}
    return _paired([vb[k] for k in keys], [va[k] for k in keys], [k[0] for k in keys], n_boot, seed)


def _elicitation_ids(path: str) -> set[str]:
    from memtoc.bench.transfer import load_transfer

    return {it.id for it in load_transfer(path) if not it.unanswerable}


def _closed_book(paths_recs: Sequence[tuple[str, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]]
                 ) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for path, eps, cb in paths_recs:
        for k, v in _closed_book_accuracy(cb, _items(path, eps)).items():
            out.setdefault(k, v)
    return out


def transfer_table(runs: TransferRuns, *, n_boot: int = 2000, seed: int = 0, band: float = RETENTION_BAND,
                   elicitation: str | None = None) -> dict[str, Any]:
    """The columns of Table 6 (module docstring) for one arm. ``elicitation``: the transfer file whose answerable
    rows are the elicitation set of the retention column."""
    bv, bv_cb = _read(runs.base_value)
    av, av_cb = _read(runs.arm_value)
    bp, bp_cb = _read(runs.base_passage)
    ap, ap_cb = _read(runs.arm_passage)
    answerable = lambda recs: {r["transfer_item"] for r in recs  # noqa: E731
                               if r.get("transfer_split") != "unanswerable"}
    common = answerable(bv) & answerable(av) & answerable(bp) & answerable(ap)
    # the closed-book answers: the elicitation runs when given, else the frame runs (both frames' items)
    cb_b = _closed_book([(runs.base_elicitation, *_read(runs.base_elicitation))] if runs.base_elicitation else
                        [(runs.base_passage, bp, bp_cb), (runs.base_value, bv, bv_cb)])
    cb_a = _closed_book([(runs.arm_elicitation, *_read(runs.arm_elicitation))] if runs.arm_elicitation else
                        [(runs.arm_passage, ap, ap_cb), (runs.arm_value, av, av_cb)])
    anchor = {k: v == 1.0 for k, v in cb_b.items()}      # the base's memory-right units
    out: dict[str, Any] = {"n_common_questions": len(common), "n_boot": n_boot, "seed": seed,
                           "support": "anchor", "n_anchor_memory_right": sum(anchor.values())}
    out["value_frame"] = _frame(bv, av, common, anchor, n_boot, seed)
    out["passage_frame"] = _frame(bp, ap, common, anchor, n_boot, seed)
    wide = answerable(bv) & answerable(av)
    out["value_frame_wide"] = dict(_frame(bv, av, wide, anchor, n_boot, seed), n_pool=len(wide))
    ub, ua = _unanswerable(bp), _unanswerable(ap)
    qs = sorted(set(ub) & set(ua))
    out["abstention"] = (_paired([float(ub[q]) for q in qs], [float(ua[q]) for q in qs], qs, n_boot, seed)
                         if qs else {"delta": None, "n": 0, "note": "no unanswerable rows in the transfer file"})
    # closed-book retention on the elicitation set, paired by item id
    if elicitation:
        wanted, named_by = _elicitation_ids(elicitation), f"file {elicitation}"
    elif runs.base_elicitation:
        wanted = {k[0] for k in cb_b}
        named_by = f"the items of {runs.base_elicitation}"
    else:
        wanted = {k[0] for k in cb_b} & {k[0] for k in cb_a}
        named_by = "the frame runs' items (no elicitation set named)"
    for who, cb, path in (("base", cb_b, runs.base_elicitation or runs.base_passage),
                          ("arm", cb_a, runs.arm_elicitation or runs.arm_passage)):
        missing = sorted(wanted - {k[0] for k in cb})
        if missing:
            raise MemtocError(f"{path}: the {who} checkpoint has no closed-book answer for {len(missing)} of the "
                              f"{len(wanted)} items of the elicitation set ({named_by}), e.g. {missing[0]!r}; "
                              f"evaluate the elicitation file and give it as --{who}-elicitation")
    keys = sorted(k for k in set(cb_b) & set(cb_a) if k[0] in wanted)
    ret = _paired([cb_b[k] for k in keys], [cb_a[k] for k in keys], [k[0] for k in keys], n_boot, seed)
    ret["band"] = band
    ret["within_band"] = None if ret["delta"] is None else abs(ret["delta"]) <= band + 1e-12
    ret["elicitation_set"] = named_by
    ret["n_items"] = len(wanted)
    out["retention"] = ret
    return out


def format_markdown(table: Mapping[str, Any], label: str = "arm") -> str:
    def cell(d: Mapping[str, Any]) -> str:
        if d.get("delta") is None:
            return "–"
        return f"{d['delta']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (n {d['n']})"

    ret = table["retention"]
    wide = table.get("value_frame_wide") or {}
    band = f"{'inside' if ret['within_band'] else 'OUTSIDE'} ±{ret['band']:.2f}" if ret["within_band"] is not None \
        else "n/a"
    return "\n".join([
        "# Out-of-distribution transfer (App. F.1, Table 6)", "",
        f"Changes against the untreated checkpoint, paired bootstrap B = {table['n_boot']}; both frames on the "
        f"common support of {table['n_common_questions']} questions, on the anchor's fixed memory-right set "
        f"({table['n_anchor_memory_right']} items right closed-book; MC matcher). Retention: closed-book accuracy "
        f"on the elicitation set ({ret['elicitation_set']}, {ret['n_items']} items).", "",
        "| arm | value frame | passage frame | abstention (unanswerable) | retention (closed book) |",
        "|---|---|---|---|---|",
        f"| {label} | {cell(table['value_frame'])} | {cell(table['passage_frame'])} | {cell(table['abstention'])} | "
        f"{cell(ret)} {band} |", "",
        f"Secondary reading, value frame on its whole pool ({wide.get('n_pool', 0)} items, the paper's 279): "
        f"{cell(wide)}", ""])


def _run_dir(name: str) -> dict[str, Any]:
    return opt(f"{name.replace('_', ' ')} transfer run directory", required=True, path=True)


@dataclass
class TransferTableConfig:
    """``memtoc transfer-table``: App. F.1 Table 6 from the arm's and the base's transfer runs."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"base_value": "input-run", "arm_value": "input-run",
        "base_passage": "input-run", "arm_passage": "input-run", "base_elicitation": "input-run",
        "arm_elicitation": "input-run", "elicitation": "input-path", "out": "output-dir"}

    base_value: str = field(default="", metadata=_run_dir("base_value"))
    arm_value: str = field(default="", metadata=_run_dir("arm_value"))
    base_passage: str = field(default="", metadata=_run_dir("base_passage"))
    arm_passage: str = field(default="", metadata=_run_dir("arm_passage"))
    base_elicitation: str | None = field(default=None, metadata=opt(
        "base evaluate run on the elicitation file (its closed book is the retention column's and fixes the anchor "
        "support); default: the frame runs", path=True))
    arm_elicitation: str | None = field(default=None, metadata=opt(
        "arm evaluate run on the elicitation file; default: the frame runs", path=True))
    elicitation: str | None = field(default=None, metadata=opt(
        "transfer JSONL naming the elicitation set (its answerable rows; the paper's 981); default: the base "
        "elicitation run's items, else the frame runs' items", path=True))
    label: str = field(default="arm", metadata=opt("the arm's name in the table"))
    band: float = field(default=RETENTION_BAND, metadata=opt("closed-book retention band (paper ±0.03)",
                                                                           low=0, above=True))
    n_boot: int = field(default=2000, metadata=opt("paired bootstrap draws (paper B = 2,000)", low=1))
    seed: int = field(default=0, metadata=opt("seed of the paired bootstrap", low=0))
    out: str | None = field(default=None, metadata=opt("directory for transfer_table.{json,md}", path=True))


def run_transfer_table(cfg: TransferTableConfig) -> TableDocument:
    """The table (and its Markdown), written as ``transfer_table.{json,md}`` under ``cfg.out`` when given."""
    table = transfer_table(TransferRuns(cfg.base_value, cfg.arm_value, cfg.base_passage, cfg.arm_passage,
                                        cfg.base_elicitation, cfg.arm_elicitation),
                           n_boot=cfg.n_boot, seed=cfg.seed, band=cfg.band, elicitation=cfg.elicitation)
    doc = TableDocument(table, format_markdown(table, cfg.label))
    if cfg.out:
        doc.write(cfg.out, "transfer_table")
    return doc
