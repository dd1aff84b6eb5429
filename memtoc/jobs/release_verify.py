"""``memtoc verify-release PATH``: re-derive the paper's table columns from a MemToC release checkout.

The release ships ``results/scored_episodes/<model>_<formulation>.json`` (a ``scored`` list of per-episode decisions
and the file's ``aggregate_v1`` block) and ``results/summaries/arm_metrics.json`` (``<channel>.<model
key>.canonical_pv<k>``; channel ``judged`` by default, because the scored files are the judged layer).

For every model x formulation the columns of the paper's Tables 1 and 4 (Ret., Tool, Wrong, Err.) are recomputed
from the released decisions with the project's own metric definitions and put beside every stored value; a
difference above the stored rounding (4 decimals) is flagged. A file with fewer records than its ``aggregate_v1``
counts (a sample) is marked ``partial file`` instead. Per model the pooled value is the unweighted mean of the
three formulations (the paper's pooling).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from memtoc.core.errors import BenchmarkDataError, MemtocError
from memtoc.core.options import opt
from memtoc.scoring.metrics import FORMULATIONS, metric_units
from memtoc.core.vocab import ALL_CONDITIONS, CELLS, OUTCOMES

#: the paper's columns: label -> (our metric, arm_metrics.json field, aggregate_v1 path or None)
COLUMNS: dict[str, tuple[str, str, tuple[str, ...] | None]] = {
    "Ret.": ("retention", "keep_strict", None),  # aggregate_v1 has only the kept_memory flag (counts 'both')
    "Tool": ("correct_tool_following", "tool_gold_follow", ("tool_right", "cells", "tool_gold", "followed_tool")),
    "Wrong": ("incorrect_tool_following", "prior_bw", ("tool_wrong", "cells", "both_wrong", "followed_tool")),
    "Err.": ("tool_error_abstention", "te_abstain", ("tool_error", "abstain_rate")),
}
#: release file-name model -> model key of the summaries (README: base, llamai, gemma, qwen, mistral)
MODEL_KEYS = {"llama-3.1-8b-instruct": "llamai", "qwen2.5-7b-instruct": "qwen", "gemma-2-9b-it": "gemma",
              "mistral-7b-instruct-v0.3": "mistral", "llama-3.1-8b": "base"}
PV = {f: i for i, f in enumerate(FORMULATIONS)}
TOLERANCE = 0.5e-4 + 1e-9  # stored summaries are rounded to 4 decimals


class ReleaseLayoutError(MemtocError):
    """A release checkout without the expected files."""


@dataclass(frozen=True)
class ScoredFile:
    model: str
    formulation: str
    path: Path
    records: list[dict[str, Any]]
    aggregate: dict[str, Any]


def _split_name(stem: str) -> tuple[str, str] | None:
    for f in FORMULATIONS:
        if stem.endswith("_" + f):
            return stem[: -len(f) - 1], f
    return None


#: exit status of ``memtoc verify-release``: every stored value matched / differences flagged / could not verify
#: (a file that cannot be read or holds unusable records, or no stored value to compare with at all)
EXIT_OK, EXIT_DIFFERENCES, EXIT_UNVERIFIED = 0, 1, 2
#: fields of a released record the columns read: each must be a JSON boolean ("False" as a string is truthy)
BOOL_FIELDS = ("followed_tool", "kept_memory", "abstain", "final_correct", "ack_proxy", "mem_absent",
               "memory_correct", "tool_correct")


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"invalid JSON ({exc.msg}, line {exc.lineno})", path=path) from None
    except UnicodeDecodeError:
        raise BenchmarkDataError("not a UTF-8 JSON file (binary?)", path=path) from None


def scored_dir(root: Path) -> Path:
    for cand in (root / "results" / "scored_episodes", root / "scored_episodes", root):
        if cand.is_dir() and any(_split_name(p.stem) for p in cand.glob("*.json")):
            return cand
    raise ReleaseLayoutError(f"{root}: no results/scored_episodes/<model>_<formulation>.json files")


def load_scored_files(root: str | Path) -> list[ScoredFile]:
    root = Path(root)
    if not root.is_dir():
        raise ReleaseLayoutError(f"{root}: not a directory")
    folder = scored_dir(root)
    out = []
    for path in sorted(folder.glob("*.json")):
        parts = _split_name(path.stem)
        if parts is None:
            continue
        data = _load_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("scored"), list):
            raise BenchmarkDataError("expected an object with a 'scored' list of episode records", path=path,
                                     field="scored")
        agg = data.get("aggregate_v1")
        if agg is not None and not isinstance(agg, dict):
            raise BenchmarkDataError(f"expected an object of per-condition counts, got {type(agg).__name__}",
                                     path=path, field="aggregate_v1")
        out.append(ScoredFile(parts[0], parts[1], path, data["scored"], agg or {}))
    out.sort(key=lambda f: (f.model, PV[f.formulation]))
    return out


def skipped_files(root: str | Path) -> list[str]:
    """Files of the scored folder that are not ``<model>_<formulation>.json`` (reported, never read silently)."""
    folder = scored_dir(Path(root))
    return sorted(p.name for p in folder.glob("*.json") if p.is_file() and not _split_name(p.stem))


def find_arm_metrics(root: str | Path) -> tuple[Path, dict] | None:
    root = Path(root)
    for p in (root / "results" / "summaries" / "arm_metrics.json", root / "summaries" / "arm_metrics.json",
              root / "arm_metrics.json"):
        if p.is_file():
            data = _load_json(p)
            if not isinstance(data, dict):
                raise BenchmarkDataError(f"expected an object <channel>.<model key>.canonical_pv<k>, got "
                                         f"{type(data).__name__}", path=p)
            return p, data
    return None


def metric_records(sf: ScoredFile) -> list[dict[str, Any]]:
    """The released decisions in the form :mod:`memtoc.scoring.metrics` reads (question id from the episode id)."""
    out = []
    for row, rec in enumerate(sf.records, start=1):
        if not isinstance(rec, dict):
            raise BenchmarkDataError("expected an episode record object", path=sf.path, row=row)
        eid = rec.get("episode_id")
        if not isinstance(eid, str) or eid.count("-") < 2:
            raise BenchmarkDataError(f"bad episode id {eid!r}", path=sf.path, row=row, field="episode_id")
        for key in ("condition", "cell", "outcome", "followed_tool", "abstain"):
            if key not in rec:
                raise BenchmarkDataError("missing", path=sf.path, row=row, field=key)
        for key, known in (("condition", ALL_CONDITIONS), ("cell", (*CELLS, None)), ("outcome", OUTCOMES)):
            if rec[key] not in known:
                raise BenchmarkDataError(f"unknown {key} {rec[key]!r}; known: {', '.join(map(str, known))}",
                                         path=sf.path, row=row, field=key)
        for key in BOOL_FIELDS:
            if key in rec and rec[key] is not None and not isinstance(rec[key], bool):
                raise BenchmarkDataError(f"{rec[key]!r} is not true/false (a JSON boolean)", path=sf.path, row=row,
                                         field=key)
        out.append({**rec, "question_id": eid.rsplit("-", 2)[0], "formulation": sf.formulation})
    return out


def _counts(records: Sequence[Mapping[str, Any]], metric: str, path: Path) -> tuple[int, int]:
    try:
        units = metric_units(records, metric)
    except MemtocError as exc:
        raise BenchmarkDataError(str(exc), path=path) from None
    return sum(bool(v) for v in units.values()), len(units)


def _dig(obj: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _flag(ours: float | None, stored: Any) -> str:
    if stored is None or not isinstance(stored, (int, float)):
        return "-"
    if ours is None:
        return "DIFF"
    return "ok" if abs(ours - float(stored)) <= TOLERANCE else "DIFF"


def verify_release(root: str | Path, *, channel: str = "judged") -> dict[str, Any]:
    """Recompute Ret., Tool, Wrong, Err. per model x formulation and compare with every stored value."""
    files = load_scored_files(root)
    found = find_arm_metrics(root)
    arm_path, arm = (found if found else (None, None))
    rows: list[dict[str, Any]] = []
    for sf in files:
        recs = metric_records(sf)
        expected = sum(int(v.get("n") or 0) for v in sf.aggregate.values() if isinstance(v, dict))
        partial = bool(expected) and expected != len(recs)
        key = MODEL_KEYS.get(sf.model, sf.model)
        stored_arm = _dig(arm, (channel, key, f"canonical_pv{PV[sf.formulation]}")) if arm else None
        for label, (metric, arm_field, agg_path) in COLUMNS.items():
            k, n = _counts(recs, metric, sf.path)
            ours = k / n if n else None
            v_agg = _dig(sf.aggregate, agg_path) if agg_path else None
            v_arm = _dig(stored_arm, (arm_field,)) if stored_arm else None
            flags = [_flag(ours, v_agg), _flag(ours, v_arm)]
            rows.append({"model": sf.model, "model_key": key, "formulation": sf.formulation, "column": label,
                         "metric": metric, "k": k, "n": n, "ours": ours, "stored_aggregate_v1": v_agg,
                         f"stored_arm_metrics_{channel}": v_arm,
                         "status": ("partial file" if partial else "DIFF") if "DIFF" in flags
                         else ("ok" if "ok" in flags else "no stored value"),
                         "n_records": len(recs), "n_records_expected": expected or None, "file": str(sf.path)})
    pooled = []
    for model in dict.fromkeys(sf.model for sf in files):
        for label in COLUMNS:
            mine = [r for r in rows if r["model"] == model and r["column"] == label]
            vals = [r["ours"] for r in mine if r["ours"] is not None]
            stored = [r[f"stored_arm_metrics_{channel}"] for r in mine]
            full = (len(mine) == len(FORMULATIONS) and all(isinstance(s, (int, float)) for s in stored)
                    and not any(r["status"] == "partial file" for r in mine))
            p_ours = sum(vals) / len(vals) if vals else None
            p_stored = sum(stored) / len(stored) if full else None
            pooled.append({"model": model, "column": label, "formulations": len(mine), "ours_pooled": p_ours,
                           f"stored_pooled_{channel}": p_stored,
                           "status": _flag(p_ours, p_stored) if p_stored is not None else "no stored value"})
    n_compared = sum(r["status"] in ("ok", "DIFF") for r in rows)
    return {"release": str(root), "scored_dir": str(scored_dir(Path(root))), "skipped_files": skipped_files(root),
            "n_compared": n_compared,
            "arm_metrics": str(arm_path) if arm_path else None, "channel": channel, "tolerance": TOLERANCE,
            "rows": rows, "pooled": pooled, "n_differences": sum(r["status"] == "DIFF" for r in rows)
            + sum(p["status"] == "DIFF" for p in pooled)}


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * float(v):.2f}"


def format_report(rep: dict[str, Any]) -> str:
    ch = rep["channel"]
    head = ["model", "formulation", "column", "ours % (k/n)", "aggregate_v1 %", f"arm_metrics.{ch} %", "status"]
    rows = [head] + [[r["model"], r["formulation"], r["column"], f"{_pct(r['ours'])} ({r['k']}/{r['n']})",
                      _pct(r["stored_aggregate_v1"]), _pct(r[f"stored_arm_metrics_{ch}"]), r["status"]]
                     for r in rep["rows"]]
    prow = [["model", "column", "ours pooled %", f"stored pooled {ch} %", "status"]] + [
        [p["model"], p["column"], _pct(p["ours_pooled"]), _pct(p[f"stored_pooled_{ch}"]), p["status"]]
        for p in rep["pooled"]]

    def table(rs: list[list[str]]) -> str:
        w = [max(len(r[i]) for r in rs) for i in range(len(rs[0]))]
        lines = ["  ".join(c.ljust(x) for c, x in zip(r, w)).rstrip() for r in rs]
        lines.insert(1, "  ".join("-" * x for x in w))
        return "\n".join(lines)

    summary = (f"{rep['n_differences']} difference(s) flagged" if rep["n_differences"]
               else "no differences")
    partial = sorted({f"{r['model']}_{r['formulation']} ({r['n_records']} of {r['n_records_expected']} records)"
                      for r in rep["rows"] if r["status"] == "partial file"})
    if partial:
        summary += "; partial files, not compared: " + ", ".join(partial)
    if rep.get("skipped_files"):
        summary += ("; not <model>_<formulation>.json, skipped: " + ", ".join(rep["skipped_files"]))
    if not rep.get("n_compared", 1):
        summary += "; COULD NOT VERIFY: no stored value to compare with"
    return (f"MemToC release re-derivation: {rep['scored_dir']} (summaries: {rep['arm_metrics'] or 'not found'})\n"
            "Ret. = retention (keep_strict), Tool = correct-tool following, Wrong = incorrect-tool following, "
            "Err. = tool-error abstention; recomputed from the released decisions by memtoc.scoring.metrics\n\n"
            + table(rows) + "\n\npooled over formulations (unweighted mean):\n" + table(prow)
            + f"\n\n{summary} (tolerance {rep['tolerance']:.1e})")


@dataclass
class VerifyReleaseConfig:
    """``memtoc verify-release``: recompute the paper's Ret./Tool/Wrong/Err. columns from a release checkout."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"path": "input-dir", "json": "output", "csv": "output"}

    path: str = field(default="", metadata=opt(
        "release checkout (with results/scored_episodes/ and results/summaries/)", positional=True, path=True))
    channel: str = field(default="judged", metadata=opt(
        "arm_metrics.json channel to compare with (the scored files are the judged layer)", choices=("judged", "det")))
    json: str | None = field(default=None, metadata=opt("also write the full comparison as JSON", path=True))
    csv: str | None = field(default=None, metadata=opt("also write the per-cell rows as CSV", path=True))


def run_verify_release(cfg: VerifyReleaseConfig) -> dict[str, Any]:
    """The comparison of :func:`verify_release`, also written to ``cfg.json`` / ``cfg.csv`` when given."""
    from memtoc.core.fileio import check_outputs, write_json_atomic, write_records_csv_atomic

    check_outputs({"--json": cfg.json, "--csv": cfg.csv}, [cfg.path])
    rep = verify_release(cfg.path, channel=cfg.channel)
    if cfg.json:
        write_json_atomic(cfg.json, rep)
    if cfg.csv:
        write_records_csv_atomic(cfg.csv, rep["rows"])
    return rep


def exit_status(rep: dict[str, Any]) -> int:
    """0: every value matches; 1: differences flagged; 2: nothing could be compared."""
    if rep["n_differences"]:
        return EXIT_DIFFERENCES
    return EXIT_OK if rep["n_compared"] else EXIT_UNVERIFIED
