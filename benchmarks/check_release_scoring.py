"""Re-score the MemToC release's own scored episodes with our scorer and compare, decision by decision.

    .venv/bin/python benchmarks/check_release_scoring.py --release-dir /tmp/memtoc_release \
        --shared ../shared/memtoc --out /tmp/memtoc_release/check_report.json

The release (``ArceniyVarlamov/memtoc``, ``results/scored_episodes/<model>_<formulation>.json``) ships, for every
episode, the extracted answer span, the closed-book span (``parametric_span``) and the decisions taken on them,
but not the raw generations. For every record this script feeds the released extracted span (as the response)
and the released closed-book span (as the memory answer) to our offline re-scorer
(:func:`memtoc.bench.offline.score_record`). The tool value, gold and question come from our benchmark
(``load_benchmark(--shared)`` + ``build_episodes``, joined on ``episode_id``). It then compares the fields
``extracted`` (identity or re-extraction of the span), ``mem_absent``, ``memory_correct``, ``cell``,
``followed_tool``, ``kept_memory``, ``final_correct``, ``outcome``, ``neither_subtype``, ``abstain`` and
``ack_proxy``. Agreement is reported per file, per model and overall, with up to ``--max-examples`` example
disagreements per field, inputs included.

The released records are the JUDGED channel: ``arm_metrics.json`` names ``results/scored_episodes`` as its
``judged`` source, and ``meta.n_outcome_corrected`` counts episodes whose outcome the judge pass changed. Per
``scoring.md`` (judged channel, ``apply_judge.py``) the judge only *extracts*: for an episode the deterministic
scorer labelled ``neither``/``other``, its extraction (kept in the record as ``judge_extract``; first line, quotes
and asterisks stripped, ignored when empty or longer than 12 words) either starts with ``ABSTAIN`` (-> subtype
abstain, abstain True) or replaces the span for ``followed_tool``/``kept_memory``/``outcome`` (recomputed with
``match``; ``final_correct`` is not). ``extracted`` keeps the scorer's span. This script models that pass on top of
our decisions ("our judged view"); a disagreement between the release and our deterministic decision is counted
as ``judge`` (explained) when the release equals our judged view of that record, otherwise ``unexplained``.

Metrics: on every complete file (all questions x 5 conditions) the metrics are recomputed with our
:func:`memtoc.scoring.metrics.metric_table` from the RELEASED decisions, from OUR deterministic decisions and from OUR
judged view, and compared with ``arm_metrics.json`` (``det`` and ``judged`` channels, canonical arms
``canonical_pv<k>``); the expected pairs are release/judged, ours/det and ours_judged/judged:
retention (keep_strict), keep_flag, CRA_arb, correct-tool following (tool_gold_follow), incorrect-tool following
(prior_bw), no-conflict accuracy (nc_CRA), tool-error abstention (te_abstain), n_arb and n_bw. Values agree
when they are equal after rounding to the summary's 4 decimals.

Release files are looked up under ``--release-dir`` in ``scored_episodes/``, ``results/scored_episodes/`` or the
folder itself; ``arm_metrics.json`` in ``summaries/``, ``results/summaries/`` or the folder itself.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import Episode, build_episodes
from memtoc.scoring.metrics import metric_table
from memtoc.bench.offline import score_record
from memtoc.core.vocab import CONDITIONS
from memtoc.scoring import is_trivial_hop, match
from memtoc.core.vocab import FORMULATIONS

PV = {"reference": 0, "paraphrase_a": 1, "paraphrase_b": 2}
FIELDS = ("extracted", "mem_absent", "memory_correct", "cell", "followed_tool", "kept_memory", "final_correct",
          "outcome", "neither_subtype", "abstain", "ack_proxy")
#: file-name model -> the model key of arm_metrics.json (the base model has no row there)
MODEL_KEYS = {"llama-3.1-8b-instruct": "llamai", "qwen2.5-7b-instruct": "qwen", "gemma-2-9b-it": "gemma",
              "mistral-7b-instruct-v0.3": "mistral", "llama-3.1-8b": "base"}
#: our metric name -> arm_metrics.json key
METRIC_KEYS = {"retention": "keep_strict", "keep_flag": "keep_flag", "cra_arb": "CRA_arb",
               "correct_tool_following": "tool_gold_follow", "incorrect_tool_following": "prior_bw",
               "no_conflict_accuracy": "nc_CRA", "tool_error_abstention": "te_abstain"}
#: counts of arm_metrics.json -> the metric whose n they are
COUNT_KEYS = {"n_arb": "retention", "n_bw": "incorrect_tool_following"}
MISSING = object()


# ---------------------------------------------------------------------------------------------------------
# loading

@dataclass
class ReleaseFile:
    model: str
    formulation: str
    path: Path
    meta: dict
    records: list[dict]

    @property
    def label(self) -> str:
        return f"{self.model}_{self.formulation}"


def _split_name(stem: str) -> tuple[str, str] | None:
    for f in FORMULATIONS:
        if stem.endswith("_" + f):
            return stem[: -len(f) - 1], f
    return None


def find_release_files(release_dir: Path) -> list[ReleaseFile]:
    """Every ``<model>_<formulation>.json`` with a ``scored`` list under the release folder."""
    out = []
    seen = set()
    for folder in (release_dir / "scored_episodes", release_dir / "results" / "scored_episodes", release_dir):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            parts = _split_name(path.stem)
            if parts is None or parts in seen:
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("scored"), list):
                continue
            seen.add(parts)
            out.append(ReleaseFile(parts[0], parts[1], path, data.get("meta") or {}, data["scored"]))
    out.sort(key=lambda r: (r.model, PV[r.formulation]))
    return out


def find_arm_metrics(release_dir: Path) -> dict | None:
    for p in (release_dir / "summaries" / "arm_metrics.json",
              release_dir / "results" / "summaries" / "arm_metrics.json", release_dir / "arm_metrics.json"):
        if p.is_file():
            return json.loads(p.read_text(encoding="utf-8"))
    return None


def episode_index(shared: Path) -> dict[str, Episode]:
    """episode_id -> our episode (every question of the benchmark, 3 formulations x 5 conditions)."""
    bench = load_benchmark(shared)
    eps = build_episodes(bench.questions, formulations=FORMULATIONS, conditions=CONDITIONS)
    return {e.episode_id: e for e in eps}


# ---------------------------------------------------------------------------------------------------------
# re-scoring

def _det_outcome(ft: bool, km: bool) -> str:
    return "both" if ft and km else "followed_tool" if ft else "kept_memory" if km else "neither"


def rescore(rec: Mapping[str, Any], ep: Episode) -> dict[str, Any]:
    """Our decisions for one released record: its extracted span as the response, its closed-book span as memory."""
    q = ep.question
    inp = {"question": q.question, "gold_answer": q.gold_answer, "condition": ep.condition,
           "response": rec.get("extracted") or "", "tool_value": ep.tool_value,
           "memory_answer": rec.get("parametric_span"), "aliases": list(q.aliases),
           "qkey": q.id, "formulation": ep.formulation}
    return score_record(inp)


JUDGE_FIELDS = ("followed_tool", "kept_memory", "outcome", "neither_subtype", "abstain", "ack_proxy")


def parse_judge_extract(text: Any) -> str | None:
    """The judge's extraction as apply_judge.py reads it: first line, quotes/asterisks stripped; None if unusable."""
    if not isinstance(text, str):
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = lines[0].strip().strip('"\'*`').strip()
    if not line or len(line.split()) > 12:
        return None
    return line


def judged_view(rec: Mapping[str, Any], ours: Mapping[str, Any], ep: Episode) -> dict[str, Any] | None:
    """Our decisions after the release's judge outcome-fix, or None when the fix does not apply to this record."""
    if ours.get("outcome") != "neither" or ours.get("neither_subtype") != "other":
        return None
    line = parse_judge_extract(rec.get("judge_extract"))
    if line is None:
        return None
    j = dict(ours)
    if line.upper().startswith("ABSTAIN"):
        j.update(neither_subtype="abstain", abstain=True)
        return j
    mem = ours.get("memory_span")
    ft = ep.tool_value is not None and match(line, str(ep.tool_value))
    km = bool(mem) and not ours.get("mem_absent") and match(line, mem)
    out = _det_outcome(ft, km)
    j.update(followed_tool=ft, kept_memory=km, outcome=out, ack_proxy=ft and km,
             neither_subtype="other" if out == "neither" else None)
    return j


def _norm(v: Any) -> Any:
    return v


@dataclass
class FieldTally:
    n: int = 0
    agree: int = 0
    judge: int = 0           # disagreements explained by the judge pass (release == our judged view)

    @property
    def disagree(self) -> int:
        return self.n - self.agree

    def to_dict(self) -> dict:
        return {"n": self.n, "agree": self.agree, "disagree": self.disagree,
                "disagree_judge_corrected": self.judge, "disagree_unexplained": self.disagree - self.judge,
                "rate": (self.agree / self.n) if self.n else None}


@dataclass
class Comparison:
    per_file: dict[str, dict[str, FieldTally]] = field(default_factory=dict)
    per_model: dict[str, dict[str, FieldTally]] = field(default_factory=dict)
    overall: dict[str, FieldTally] = field(default_factory=lambda: {f: FieldTally() for f in FIELDS})
    examples: dict[str, list[dict]] = field(default_factory=lambda: {f: [] for f in FIELDS})
    unmatched: list[str] = field(default_factory=list)
    n_records: Counter = field(default_factory=Counter)
    n_judge_marked: Counter = field(default_factory=Counter)   # records the judge fix applies to (ours)
    n_judge_extract: Counter = field(default_factory=Counter)  # records carrying a judge_extract
    ours: dict[str, list[dict]] = field(default_factory=dict)  # file label -> our deterministic decisions
    ours_judged: dict[str, list[dict]] = field(default_factory=dict)  # file label -> our judged view


def compare(files: Iterable[ReleaseFile], episodes: Mapping[str, Episode], *, max_examples: int = 10) -> Comparison:
    cmp = Comparison()
    for rf in files:
        tf = cmp.per_file.setdefault(rf.label, {f: FieldTally() for f in FIELDS})
        tm = cmp.per_model.setdefault(rf.model, {f: FieldTally() for f in FIELDS})
        ours_list = cmp.ours.setdefault(rf.label, [])
        judged_list = cmp.ours_judged.setdefault(rf.label, [])
        for rec in rf.records:
            ep = episodes.get(rec.get("episode_id"))
            if ep is None or ep.formulation != rf.formulation:
                cmp.unmatched.append(f"{rf.label}:{rec.get('episode_id')}")
                continue
            ours = rescore(rec, ep)
            jv = judged_view(rec, ours, ep)
            ours_list.append({**ours, "episode_id": rec["episode_id"], "question_id": ep.question.id})
            judged_list.append({**(jv or ours), "episode_id": rec["episode_id"], "question_id": ep.question.id})
            cmp.n_records[rf.model] += 1
            cmp.n_judge_marked[rf.label] += jv is not None
            cmp.n_judge_extract[rf.label] += "judge_extract" in rec
            for f in FIELDS:
                rel = rec.get(f, MISSING)
                if rel is MISSING:
                    continue
                ok = _norm(rel) == _norm(ours.get(f))
                judge = (not ok) and jv is not None and f in JUDGE_FIELDS and _norm(rel) == _norm(jv.get(f))
                for t in (tf[f], tm[f], cmp.overall[f]):
                    t.n += 1
                    t.agree += ok
                    t.judge += judge
                if not ok and len(cmp.examples[f]) < max_examples:
                    cmp.examples[f].append({
                        "file": rf.label, "episode_id": rec["episode_id"], "condition": ep.condition,
                        "question": ep.question.question, "gold": ep.question.gold_answer,
                        "tool_value": ep.tool_value, "extracted": rec.get("extracted"),
                        "parametric_span": rec.get("parametric_span"), "judge_extract": rec.get("judge_extract"),
                        "release": rel, "ours": ours.get(f), "ours_judged": None if jv is None else jv.get(f),
                        "explained_by_judge": judge,
                        "release_decisions": {k: rec.get(k) for k in FIELDS if k in rec and k != "extracted"},
                        "our_decisions": {k: ours.get(k) for k in FIELDS if k != "extracted"},
                    })
    return cmp


# ---------------------------------------------------------------------------------------------------------
# metrics

def metric_records(rf: ReleaseFile, episodes: Mapping[str, Episode], source: Iterable[Mapping[str, Any]]) -> list[dict]:
    out = []
    for rec in source:
        ep = episodes.get(rec.get("episode_id"))
        if ep is None:
            continue
        out.append({"question_id": ep.question.id, "formulation": rf.formulation, "condition": ep.condition,
                    "divergence_bucket": rec.get("divergence_bucket", ep.divergence_bucket),
                    "cell": rec.get("cell"), "outcome": rec.get("outcome"),
                    "followed_tool": rec.get("followed_tool"), "kept_memory": rec.get("kept_memory"),
                    "final_correct": rec.get("final_correct"), "abstain": rec.get("abstain"),
                    "ack_proxy": rec.get("ack_proxy"),
                    "trivial_hop": is_trivial_hop(ep.question.gold_answer, ep.question.question)})
    return out


def is_complete(rf: ReleaseFile, n_questions: int | None = None) -> bool:
    """All 5 conditions present for every question in the file, and (if given) the expected question count."""
    by_q = defaultdict(set)
    for r in rf.records:
        eid = str(r.get("episode_id", ""))
        by_q[eid.rsplit("-", 2)[0]].add(r.get("condition"))
    if not by_q or any(len(c) != len(CONDITIONS) for c in by_q.values()):
        return False
    declared = (rf.meta.get("transcription") or {}).get("complete")
    if declared is False:
        return False
    return n_questions is None or len(by_q) == n_questions


def _r4(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x + 0.0, 4)


EXPECTED_CHANNEL = {"release": "judged", "ours": "det", "ours_judged": "judged"}


def metric_comparison(files: list[ReleaseFile], episodes: Mapping[str, Episode], ours: Mapping[str, list[dict]],
                      arm: dict | None, n_questions: int | None,
                      ours_judged: Mapping[str, list[dict]] | None = None) -> list[dict]:
    rows = []
    for rf in files:
        if not is_complete(rf, n_questions):
            continue
        key = MODEL_KEYS.get(rf.model)
        arm_name = f"canonical_pv{PV[rf.formulation]}"
        ref = {ch: ((arm or {}).get(ch, {}).get(key, {}) or {}).get(arm_name) for ch in ("det", "judged")}
        sources = [("release", rf.records), ("ours", ours.get(rf.label, []))]
        if ours_judged is not None:
            sources.append(("ours_judged", ours_judged.get(rf.label, [])))
        for source_name, source in sources:
            tbl = metric_table(metric_records(rf, episodes, source), metrics=list(METRIC_KEYS), n_boot=10)
            vals = {}
            for m, k in METRIC_KEYS.items():
                c = tbl[m].per_formulation[rf.formulation]
                vals[k] = {"value": c.value, "k": c.k, "n": c.n}
            for nk, m in COUNT_KEYS.items():
                vals[nk] = {"value": tbl[m].per_formulation[rf.formulation].n}
            for ch in ("det", "judged"):
                r = ref[ch]
                if r is None:
                    continue
                for k, v in vals.items():
                    if k not in r:
                        continue
                    mine = v["value"] if k in COUNT_KEYS else _r4(v["value"])
                    rows.append({"file": rf.label, "model_key": key, "arm": arm_name, "decisions": source_name,
                                 "channel": ch, "expected": EXPECTED_CHANNEL[source_name] == ch, "metric": k,
                                 "ours_value": mine, "k": v.get("k"), "n": v.get("n"),
                                 "release_value": r[k], "match": mine == r[k]})
            if ref["det"] is None and ref["judged"] is None:
                for k, v in vals.items():
                    rows.append({"file": rf.label, "model_key": key, "arm": arm_name, "decisions": source_name,
                                 "channel": None, "expected": False, "metric": k,
                                 "ours_value": v["value"] if k in COUNT_KEYS else _r4(v["value"]),
                                 "k": v.get("k"), "n": v.get("n"), "release_value": None, "match": None})
    return rows


# ---------------------------------------------------------------------------------------------------------
# report

def _pct(t: FieldTally) -> str:
    return "-" if not t.n else f"{100 * t.agree / t.n:.2f}% ({t.agree}/{t.n}"\
        + (f"; {t.disagree - t.judge} unexplained, {t.judge} judge" if t.disagree else "") + ")"


def _table(rows: list[list[str]]) -> str:
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(x) for c, x in zip(r, w)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * x for x in w))
    return "\n".join(lines)


def build_report(files: list[ReleaseFile], cmp: Comparison, metrics: list[dict]) -> tuple[str, dict]:
    lines = ["MemToC release scoring check: our scorer re-applied to the released extracted spans", ""]
    lines.append("files:")
    for rf in files:
        tr = rf.meta.get("transcription") or {}
        extra = f" (transcribed pages {len(tr.get('pages_done', []))}, complete={tr.get('complete')})" if tr else ""
        lines.append(f"  {rf.label}: {len(rf.records)} records, meta.n_outcome_corrected="
                     f"{rf.meta.get('n_outcome_corrected')}, "
                     f"records with judge_extract={cmp.n_judge_extract[rf.label]}, "
                     f"judge fix applies={cmp.n_judge_marked[rf.label]}"
                     f"{extra}")
    if cmp.unmatched:
        lines.append(f"records with no matching episode in our benchmark: {len(cmp.unmatched)} "
                     f"(first: {', '.join(cmp.unmatched[:5])})")
    lines.append("")
    lines.append("agreement of our deterministic decisions with the release, per field (agree/n; disagreements split "
                 "into 'judge' = the release equals our judged view, and 'unexplained'):")
    head = ["field", *[m for m in cmp.per_model], "overall"]
    rows = [head]
    for f in FIELDS:
        rows.append([f, *[_pct(cmp.per_model[m][f]) for m in cmp.per_model], _pct(cmp.overall[f])])
    lines.append(_table(rows))
    lines.append("")
    lines.append("records per model: " + ", ".join(f"{m} {n}" for m, n in cmp.n_records.items())
                 + f"; total {sum(cmp.n_records.values())}")
    lines.append("")
    for f in FIELDS:
        if not cmp.examples[f]:
            continue
        lines.append(f"example disagreements on {f} ({cmp.overall[f].disagree} in all):")
        for ex in cmp.examples[f]:
            lines.append(f"  {ex['file']} {ex['episode_id']}: release={ex['release']!r} ours={ex['ours']!r} "
                         f"ours_judged={ex['ours_judged']!r} explained_by_judge={ex['explained_by_judge']}")
            lines.append(f"    extracted={ex['extracted']!r} judge_extract={ex['judge_extract']!r} "
                         f"parametric={ex['parametric_span']!r} tool={ex['tool_value']!r} gold={ex['gold']!r}")
        lines.append("")
    if metrics:
        lines.append("metrics (4 dp) recomputed with metric_table from the released decisions / our deterministic "
                     "decisions / our judged view, vs arm_metrics.json canonical arms (expected pairs: release~judged, "
                     "ours~det, ours_judged~judged):")
        rows = [["file", "decisions", "channel", "metric", "ours", "k/n", "arm_metrics", "match"]]
        for r in metrics:
            if not r["expected"] and r["channel"] is not None:
                continue
            rows.append([r["file"], r["decisions"], str(r["channel"]), r["metric"], str(r["ours_value"]),
                         "" if r.get("k") is None else f"{r['k']}/{r['n']}", str(r["release_value"]),
                         {True: "ok", False: "MISMATCH", None: "-"}[r["match"]]])
        lines.append(_table(rows))
        exp = [r for r in metrics if r["expected"]]
        mism = [r for r in exp if r["match"] is False]
        cross = [r for r in metrics if r["channel"] is not None and not r["expected"]]
        lines.append(f"mismatches on the expected pairs: {len(mism)} of {len(exp)} "
                     f"(cross pairs, informative only: {sum(r['match'] for r in cross)}/{len(cross)} equal)")
    else:
        lines.append("metrics: no complete file (all questions x 5 conditions) to recompute them on")
    report = {
        "files": [{"file": rf.label, "model": rf.model, "formulation": rf.formulation, "path": str(rf.path),
                   "n_records": len(rf.records), "meta": rf.meta,
                   "n_judge_fix_applies": cmp.n_judge_marked[rf.label],
                   "n_judge_extract": cmp.n_judge_extract[rf.label]} for rf in files],
        "fields": list(FIELDS),
        "agreement": {"overall": {f: t.to_dict() for f, t in cmp.overall.items()},
                      "per_model": {m: {f: t.to_dict() for f, t in d.items()} for m, d in cmp.per_model.items()},
                      "per_file": {m: {f: t.to_dict() for f, t in d.items()} for m, d in cmp.per_file.items()}},
        "records_per_model": dict(cmp.n_records),
        "unmatched": cmp.unmatched,
        "examples": cmp.examples,
        "metrics": metrics,
    }
    return "\n".join(lines), report


def run(release_dir: Path, shared: Path, *, max_examples: int = 10) -> tuple[str, dict, Comparison]:
    files = find_release_files(release_dir)
    if not files:
        raise SystemExit(f"no <model>_<formulation>.json scored-episode files under {release_dir}")
    episodes = episode_index(shared)
    bench = load_benchmark(shared)
    n_q = len(bench.analysis_set()) if bench.analysis_exclude_qkeys is not None else None
    cmp = compare(files, episodes, max_examples=max_examples)
    metrics = metric_comparison(files, episodes, cmp.ours, find_arm_metrics(release_dir), n_q, cmp.ours_judged)
    text, report = build_report(files, cmp, metrics)
    return text, report, cmp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release-dir", type=Path, default=Path("/tmp/memtoc_release"),
                    help="folder with the release's scored_episodes/*.json and summaries/arm_metrics.json")
    ap.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "memtoc",
                    help="the MemToC mapping folder (mapping_575.jsonl + repair overlays)")
    ap.add_argument("--out", "--output", dest="output", type=Path, help="write the full comparison as JSON here")
    ap.add_argument("--max-examples", type=int, default=10, help="example disagreements kept per field")
    args = ap.parse_args(argv)
    text, report, _ = run(args.release_dir, args.shared, max_examples=args.max_examples)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
