"""Conflict acknowledgment: a regex detector, CAR by arm and cell, and the human annotation round trip.

- :data:`ACK_PATTERNS` is our own regex detector (the release's is not published); it reads the *raw* reply,
  because an acknowledgment sits in the reasoning, not in the one-line FINAL answer. docs/judge.md lists it.
- :func:`car_table`: per arm and cell (arb, both_wrong, both together) of tool_wrong (near) episodes, the judged
  CAR (share of YES among episodes with a verdict: the release's CAR_judge), the regex rate and the coarse proxy.
- :func:`export_sheet` / :func:`import_labels`: a blinded, flag-stratified annotation sheet and its labels back,
  with Cohen's kappa between two annotators, the detectors' precision/recall and the two-stage prevalence. The
  sheet and key readers and the kappa serve the outcome round (outcomes.py) too.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from memtoc.core.errors import BenchmarkDataError, MemtocError
from memtoc.core.fileio import write_json_atomic, write_records_csv_atomic
from memtoc.core.vocab import CONFLICT_CONDITION
from memtoc.scoring.judge.prevalence import StratumCounts, two_stage_prevalence
from memtoc.scoring.metrics import align_rows

ACK_CELLS = ("arb", "both_wrong")

#: name -> pattern (case-insensitive). Each needs a *reference to a discrepancy*, not a mere hedge.
ACK_PATTERNS: dict[str, str] = {
    "discrepancy": r"\bdiscrepan(?:cy|cies|t)\b",
    "conflicting_sources": r"\bconflicting (?:information|sources|answers|data|results|reports)\b",
    "source_conflicts": (r"\b(?:tool|result|output|lookup|return(?:ed)? value)\b[^.\n]{0,50}"
                         r"\b(?:conflicts?|contradicts?|disagrees?|differs?|does not match|doesn't match)\b"),
    "conflicts_with_me": (r"\b(?:conflicts?|contradicts?|disagrees?|differs?|inconsistent) (?:with|from) "
                          r"(?:my|what i)\b"),
    "tool_may_be_wrong": (r"\b(?:tool|result|output|lookup)\b[^.\n]{0,40}\b(?:may|might|could|seems? to|appears? to)"
                          r" (?:be|have been) (?:wrong|incorrect|inaccurate|mistaken|outdated|stale|erroneous)\b"),
    "own_knowledge_contrast": (r"\b(?:however|but|although|though|whereas)\b[^.\n]{0,60}"
                               r"\b(?:i (?:believe|recall|remember|know)|my (?:own )?(?:knowledge|memory|"
                               r"understanding|recollection)|to my knowledge|as far as i know)\b"),
}
_ACK_RE = {k: re.compile(v, re.IGNORECASE) for k, v in ACK_PATTERNS.items()}


def regex_ack(text: str | None) -> bool:
    """True when any acknowledgment pattern fires on the text."""
    return bool(text) and any(r.search(text) for r in _ACK_RE.values())


def ack_population(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The episodes acknowledgment is measured on: tool_wrong (near), cells arb or both_wrong."""
    return [r for r in records if r.get("condition") == CONFLICT_CONDITION
            and r.get("divergence_bucket") in (None, "near") and r.get("cell") in ACK_CELLS]


def _share(k: int, n: int) -> float | None:
    """k / n, None (not NaN: the rows are written as JSON) when n = 0."""
    return k / n if n else None


def car_table(arms: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> list[dict[str, Any]]:
    """One row per arm x cell (+ 'arb+both_wrong'); records are judged-layer records (with ``ack_judge``)."""
    rows = []
    for arm, records in arms:
        pop = ack_population(records)
        for cell in (*ACK_CELLS, "arb+both_wrong"):
            recs = [r for r in pop if cell == "arb+both_wrong" or r["cell"] == cell]
            verdicts = [r.get("ack_judge") for r in recs if r.get("ack_judge") is not None]
            yes = sum(bool(v) for v in verdicts)
            rx = sum(regex_ack(r.get("response")) for r in recs)
            proxy = sum(bool(r.get("ack_proxy")) for r in recs)
            rows.append({"arm": arm, "cell": cell, "n": len(recs), "n_verdict": len(verdicts), "judge_yes": yes,
                         "car_judge": _share(yes, len(verdicts)), "regex_yes": rx,
                         "car_regex": _share(rx, len(recs)), "car_proxy": _share(proxy, len(recs))})
    return rows


def format_car_table(rows: Sequence[Mapping[str, Any]]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    head = ["arm", "cell", "n", "verdicts", "CAR judge", "CAR regex", "CAR proxy"]
    body = [[r["arm"], r["cell"], str(r["n"]), str(r["n_verdict"]), f"{pct(r['car_judge'])} ({r['judge_yes']})",
             f"{pct(r['car_regex'])} ({r['regex_yes']})", pct(r["car_proxy"])] for r in rows]
    return ("Conflict acknowledgment on tool_wrong (near) episodes; CAR judge = YES share among episodes with a "
            "judge verdict\n" + align_rows([head, *body]))


# ---------------------------------------------------------------------------------------------------------
# annotation round trip

LABEL_COLUMN = "ack"
#: what an annotator may write in the ``ack`` column
ACK_LABELS = {**dict.fromkeys(("yes", "y", "1", "true"), True), **dict.fromkeys(("no", "n", "0", "false"), False)}


def _flag(rec: Mapping[str, Any], detector: str) -> bool | None:
    if detector == "llm":
        v = rec.get("ack_judge")
        return None if v is None else bool(v)
    return regex_ack(rec.get("response"))


def export_sheet(arms: Sequence[tuple[str, str, Sequence[Mapping[str, Any]]]], *, sheet: str | Path,
                 key: str | Path, per_stratum: int = 20, detector: str = "llm", seed: int = 0) -> dict[str, Any]:
    """Write a blinded annotation sheet and its key.

    ``arms``: (arm label, run directory, judged records). Strata = arm x screening-detector flag; up to
    ``per_stratum`` random answers from each. The sheet holds an opaque item id, the question, the tool value and
    the raw reply, plus an empty ``ack`` column, in random order: no arm, cell, condition or detector verdict.
    The key (JSON) maps item ids back and carries each arm's screening counts for the prevalence estimate.
    """
    if detector not in ("llm", "regex"):
        raise MemtocError(f"unknown --detector {detector!r}; choose llm or regex")
    from memtoc.core.checks import check_positive

    check_positive(per_stratum, "--per-stratum")
    check_distinct_runs([run_dir for _arm, run_dir, _recs in arms])
    rng = np.random.default_rng(seed)
    items, screen = [], {}
    for arm, run_dir, records in arms:
        pop = [r for r in ack_population(records) if _flag(r, detector) is not None]
        flags = [bool(_flag(r, detector)) for r in pop]
        screen[arm] = {"n": len(pop), "k": sum(flags)}
        for flag in (True, False):
            stratum = [r for r, f in zip(pop, flags) if f == flag]
            take = rng.permutation(len(stratum))[:per_stratum]
            for i in sorted(int(t) for t in take):
                r = stratum[i]
                items.append({"arm": arm, "run": str(run_dir), "episode_id": r["episode_id"], "cell": r["cell"],
                              "screen_flag": flag, "llm_flag": _flag(r, "llm"), "regex_flag": _flag(r, "regex"),
                              "question": r.get("question", ""), "tool_value": r.get("tool_value"),
                              "response": r.get("response", "")})
    if not items:
        raise MemtocError("nothing to annotate: no tool_wrong arb/both_wrong episodes with a detector verdict")
    key_items, rows = blinded(items, rng, "A", ("arm", "run", "episode_id", "cell", "screen_flag", "llm_flag",
                                                "regex_flag"), ("question", "tool_value", "response"), LABEL_COLUMN)
    write_records_csv_atomic(sheet, rows)
    write_json_atomic(key, {"schema": "memtoc-ack-key-v1", "detector": detector, "per_stratum": per_stratum,
                            "seed": seed, "screen": screen, "items": key_items})
    return {"n_items": len(rows), "screen": screen}


def blinded(items: Sequence[Mapping[str, Any]], rng: np.random.Generator, prefix: str, key_fields: Sequence[str],
            sheet_fields: Sequence[str], label: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The items in random order under opaque random ids: (id -> its key fields, the sheet's rows with an empty
    ``label`` column), so a sheet shows nothing an annotator could read the stratum from."""
    order = rng.permutation(len(items))
    ids = rng.choice(16 ** 6, size=len(items), replace=False)
    key_items, rows = {}, []
    for pos, idx in enumerate(order):
        it, item_id = items[int(idx)], f"{prefix}{int(ids[pos]):06x}"
        key_items[item_id] = {k: it[k] for k in key_fields}
        rows.append({"item_id": item_id, **{k: it[k] for k in sheet_fields}, label: ""})
    return key_items, rows


def read_labels(path: str | Path, known: Mapping[str, Any]) -> dict[str, bool]:
    """item_id -> yes/no label from an annotated acknowledgment sheet (see :func:`read_sheet_labels`)."""
    return read_sheet_labels(path, known, LABEL_COLUMN, ACK_LABELS, "yes/no")


def read_sheet_labels(path: str | Path, known: Mapping[str, Any], column: str, vocab: Mapping[str, Any],
                      expected: str) -> dict[str, Any]:
    """item_id -> ``vocab[label]`` from an annotated sheet of either round; blank labels are skipped, anything
    else unreadable (unknown or repeated item, a label outside ``vocab``: "is not ``expected``") is refused."""
    path = Path(path)
    if not path.exists():
        raise BenchmarkDataError("annotation sheet not found", path=path)
    out: dict[str, Any] = {}
    first: dict[str, int] = {}
    try:
        # utf-8-sig: Excel saves "CSV UTF-8" with a byte-order mark, which would glue itself to 'item_id'
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh)
            for col in ("item_id", column):
                if col not in (reader.fieldnames or []):
                    raise BenchmarkDataError("missing column (is this the annotated CSV sheet?)", path=path,
                                             field=col)
            for row_no, row in enumerate(reader, start=2):
                item, raw = (row.get("item_id") or "").strip(), (row.get(column) or "").strip().lower()
                if item not in known:
                    raise BenchmarkDataError(f"unknown item id {item!r}", path=path, row=row_no, field="item_id")
                if item in first:
                    raise BenchmarkDataError(f"item {item!r} appears twice (first on row {first[item]}); one "
                                             "label per item", path=path, row=row_no, field="item_id")
                first[item] = row_no
                if not raw:
                    continue
                if raw not in vocab:
                    raise BenchmarkDataError(f"label {raw!r} is not {expected}", path=path, row=row_no,
                                             field=column)
                out[item] = vocab[raw]
    except (UnicodeDecodeError, csv.Error) as exc:
        raise BenchmarkDataError(f"not a UTF-8 CSV annotation sheet ({type(exc).__name__})", path=path) from None
    return out


def check_label_sheets(label_paths: Sequence[str | Path]) -> None:
    """One or two sheets, two distinct files: the same sheet twice would agree with itself."""
    if not 1 <= len(label_paths) <= 2:
        raise MemtocError("give one or two annotated sheets (--labels)")
    if len(label_paths) == 2 and Path(label_paths[0]).resolve() == Path(label_paths[1]).resolve():
        raise MemtocError(f"--labels {label_paths[1]} is given twice; two annotators need two sheets")


def read_annotation_key(key_path: str | Path, export_cmd: str, schema: str | None = None
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the key, its items) of an annotation round; a sheet given as the key, or any other file that is not the
    JSON ``export_cmd`` wrote (of ``schema`` when given), is refused in one line."""
    kp = Path(key_path)
    if not kp.exists():
        raise BenchmarkDataError("annotation key not found", path=kp)
    try:
        key = json.loads(kp.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchmarkDataError(f"not an annotation key (JSON written by `{export_cmd}`: {type(exc).__name__}); "
                                 "the key is the .key.json file, the sheet goes to --labels", path=kp) from None
    items = key.get("items") if isinstance(key, dict) else None
    if not isinstance(items, dict):
        raise BenchmarkDataError("not an annotation key", path=kp, field="items")
    if schema is not None and key.get("schema") != schema:
        raise BenchmarkDataError(f"not a key written by `{export_cmd}` (schema {key.get('schema')!r})", path=kp,
                                 field="schema")
    return key, items


def check_distinct_runs(runs: Sequence[str | Path]) -> None:
    """A run given twice would enter the table or the sheet twice (duplicate items): refused."""
    import os

    seen: dict[str, str] = {}
    for r in runs:
        real = os.path.realpath(str(r))
        if real in seen:
            raise MemtocError(f"the run {r} is given twice (also as {seen[real]}); give each run once")
        seen[real] = str(r)


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two nominal label lists (booleans are two classes); None when chance agreement is 1
    (both lists one and the same class: undefined)."""
    if len(a) != len(b) or not a:
        raise MemtocError("cohen_kappa needs two label lists of the same non-zero length")
    n, ca, cb = len(a), Counter(a), Counter(b)
    chance = sum(ca[c] * cb[c] for c in ca)     # an integer, n * n exactly when pe = 1
    if chance == n * n:
        return None
    po, pe = sum(x == y for x, y in zip(a, b)) / n, chance / (n * n)
    return (po - pe) / (1 - pe)


def annotator_consensus(labels: Sequence[Mapping[str, Any]], kappa: Any
                        ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One sheet: (None, its labels). Two: the annotators' agreement on the items both labelled (n, raw share,
    ``kappa``) and those of them labelled alike, the consensus the detectors or the scorer are read against."""
    if len(labels) == 1:
        return None, dict(labels[0])
    both = sorted(set(labels[0]) & set(labels[1]))
    if not both:
        raise MemtocError("the two sheets share no labelled item")
    a, b = [labels[0][i] for i in both], [labels[1][i] for i in both]
    agreement = {"n": len(both), "raw": sum(x == y for x, y in zip(a, b)) / len(both), "cohen_kappa": kappa(a, b)}
    return agreement, {i: labels[0][i] for i in both if labels[0][i] == labels[1][i]}


def import_labels(key_path: str | Path, label_paths: Sequence[str | Path], *, alpha: float = 0.05,
                  seed: int = 0) -> dict[str, Any]:
    """Labels back: agreement, detector precision/recall and per-arm two-stage prevalence."""
    check_label_sheets(label_paths)
    key, items = read_annotation_key(key_path, "memtoc ack export", "memtoc-ack-key-v1")
    labels = [read_labels(p, items) for p in label_paths]
    out: dict[str, Any] = {"n_items": len(items), "n_labelled": [len(x) for x in labels]}
    agreement, consensus = annotator_consensus(labels, cohen_kappa)
    if agreement is not None:
        out["agreement"] = agreement
        out["n_disagreements_excluded"] = agreement["n"] - len(consensus)
    out["n_consensus"] = len(consensus)
    out["n_positive"] = sum(consensus.values())
    dets = {}
    for det in ("llm", "regex"):
        s = dict.fromkeys(("tp", "fp", "fn", "tn"), 0)
        for i, y in consensus.items():
            f = items[i].get(f"{det}_flag")
            if f is None:
                continue
            s["tp"] += f and y
            s["fp"] += f and not y
            s["fn"] += (not f) and y
            s["tn"] += (not f) and not y
        dets[det] = {**s, "precision": _share(s["tp"], s["tp"] + s["fp"]),
                     "recall": _share(s["tp"], s["tp"] + s["fn"])}
    out["detectors_on_sample"] = dets
    # two-stage: precision / miss rate of the screening detector from the whole labelled sample, flag rate per arm
    vf = [y for i, y in consensus.items() if items[i]["screen_flag"]]
    vu = [y for i, y in consensus.items() if not items[i]["screen_flag"]]
    prev = {}
    screen_total = StratumCounts(0, 0)
    for arm, c in key.get("screen", {}).items():
        sc = StratumCounts(int(c["k"]), int(c["n"]))
        screen_total = StratumCounts(screen_total.k + sc.k, screen_total.n + sc.n)
        if sc.n:
            prev[arm] = _safe_prevalence(sc, vf, vu, alpha, seed)
    if screen_total.n:
        prev["all arms"] = _safe_prevalence(screen_total, vf, vu, alpha, seed)
    out["screen_detector"] = key.get("detector")
    out["two_stage_prevalence"] = prev
    return out


def _safe_prevalence(sc: StratumCounts, vf: list[bool], vu: list[bool], alpha: float, seed: int) -> dict[str, Any]:
    try:
        return two_stage_prevalence(sc, StratumCounts(sum(vf), len(vf)), StratumCounts(sum(vu), len(vu)),
                                    alpha=alpha, seed=seed).to_dict()
    except MemtocError as exc:
        return {"error": str(exc)}
