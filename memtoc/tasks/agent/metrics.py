"""Per-arm figures of an agent run (paper Table 7) and paired protocol contrasts (docs/agent.md, "Metrics").

Per protocol (an *arm*): answer agreement (the scorer's ``followed_tool``), execution rate and the mechanism
counts, with percentile bootstrap intervals clustered by question; paired contrasts (arm b minus arm a) on the
(episode, repetition) units both arms have. A sampled run is also read seed by seed, as App. G reports its
T = 0.7 re-run: per seed the arms and contrasts with their intervals, then across seeds the mean and the sample
sd (ddof 1) of each arm's agreement and each contrast's Δ (:func:`per_seed_summary`).
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Any, Mapping, Sequence

from memtoc.tasks.agent.calls import MECHANISMS
from memtoc.tasks.agent.protocols import PROTOCOLS
from memtoc.scoring.stats import bootstrap_ci, paired_difference

__all__ = ["arm_rows", "per_seed_summary", "protocol_contrasts", "summarize_agent"]


def _estimate(values: list[bool], clusters: list[str], n_boot: int, seed: int) -> dict[str, Any]:
    if not values:
        return {"value": None, "ci_low": None, "ci_high": None, "n": 0}
    ci = bootstrap_ci(values, clusters, n_boot=n_boot, seed=seed)
    return {"value": sum(values) / len(values), "ci_low": ci.low, "ci_high": ci.high, "n": len(values)}


def arm_rows(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """One row per protocol present, in :data:`PROTOCOLS` order."""
    rows = []
    for proto in PROTOCOLS:
        recs = [r for r in records if r["protocol"] == proto]
        if not recs:
            continue
        clusters = [r["question_id"] for r in recs]
        mech = Counter(r["mechanism"] for r in recs if r["mechanism"] is not None)
        errors = [e for r in recs for c in r["calls"] for e in c.get("errors", [])]
        rows.append({"protocol": proto, "n": len(recs), "n_questions": len(set(clusters)),
                     "decoding": sorted({r["decoding"] for r in recs}),
                     "agreement": _estimate([bool(r["agreement"]) for r in recs], clusters, n_boot, seed),
                     "execution_rate": _estimate([bool(r["executed"]) for r in recs], clusters, n_boot, seed),
                     "mechanisms": {m: mech.get(m, 0) for m in MECHANISMS},
                     "type_errors": sum(1 for e in errors if e.get("validator") == "type"),
                     "stringified_type_errors": sum(1 for e in errors if e.get("stringified"))})
    return rows


def protocol_contrasts(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, n_perm: int = 10000,
                       seed: int = 0) -> list[dict[str, Any]]:
    """Every pair of protocols present: b minus a on their common support, for agreement and execution."""
    by = {p: {(r["episode_id"], r["repetition"]): r for r in records if r["protocol"] == p} for p in PROTOCOLS}
    present = [p for p in PROTOCOLS if by[p]]
    out = []
    for a, b in combinations(present, 2):
        common = sorted(set(by[a]) & set(by[b]))
        row: dict[str, Any] = {"a": a, "b": b, "n_common": len(common),
                               "n_only_a": len(set(by[a]) - set(by[b])), "n_only_b": len(set(by[b]) - set(by[a]))}
        clusters = [by[a][u]["question_id"] for u in common]
        for metric, fieldname in (("agreement", "agreement"), ("execution_rate", "executed")):
            res = paired_difference([bool(by[a][u][fieldname]) for u in common],
                                    [bool(by[b][u][fieldname]) for u in common], clusters,
                                    n_boot=n_boot, n_perm=n_perm, seed=seed)
            row[metric] = {"delta": res.delta, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p_value}
        out.append(row)
    return out


def _mean_sd(values: Sequence[float | None]) -> dict[str, Any]:
    xs = [float(v) for v in values if v is not None and v == v]
    if not xs:
        return {"mean": None, "sd": None, "n_seeds": 0}
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else None
    return {"mean": mean, "sd": sd, "n_seeds": len(xs), "values": xs}


def per_seed_summary(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, n_perm: int = 10000,
                     seed: int = 0) -> dict[str, Any]:
    """Each repetition (one sample seed) read alone -- its arms and contrasts with intervals -- then the mean and
    sample sd across seeds of every arm's agreement and execution rate and every contrast's Δ."""
    reps = sorted({int(r["repetition"]) for r in records})
    seeds = []
    for rep in reps:
        recs = [r for r in records if int(r["repetition"]) == rep]
        seeds.append({"repetition": rep, "arms": arm_rows(recs, n_boot=n_boot, seed=seed),
                      "contrasts": protocol_contrasts(recs, n_boot=n_boot, n_perm=n_perm, seed=seed)})
    across: dict[str, Any] = {"arms": {}, "contrasts": {}}
    for proto in PROTOCOLS:
        rows = [a for s in seeds for a in s["arms"] if a["protocol"] == proto]
        if rows:
            across["arms"][proto] = {m: _mean_sd([a[m]["value"] for a in rows])
                                     for m in ("agreement", "execution_rate")}
    pairs = {(c["a"], c["b"]) for s in seeds for c in s["contrasts"]}
    for a, b in sorted(pairs, key=lambda ab: (PROTOCOLS.index(ab[0]), PROTOCOLS.index(ab[1]))):
        rows = [c for s in seeds for c in s["contrasts"] if (c["a"], c["b"]) == (a, b)]
        across["contrasts"][f"{b}-{a}"] = {m: _mean_sd([c[m]["delta"] for c in rows])
                                           for m in ("agreement", "execution_rate")}
    return {"seeds": seeds, "across_seeds": across}


def summarize_agent(records: Sequence[Mapping[str, Any]], *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    out = {"schema_version": "memtoc-agent-summary-v1", "n_records": len(records),
           "arms": arm_rows(records, n_boot=n_boot, seed=seed),
           "contrasts": protocol_contrasts(records, n_boot=n_boot, seed=seed)}
    if len({r["repetition"] for r in records}) > 1:
        out["per_seed"] = per_seed_summary(records, n_boot=n_boot, seed=seed)
    conditions = sorted({str(r.get("condition") or "") for r in records} - {""})
    if len(conditions) > 1:         # e.g. tool_right alone: where the return and the memory coincide (Table 7)
        out["by_condition"] = {c: arm_rows([r for r in records if r.get("condition") == c], n_boot=n_boot,
                                           seed=seed) for c in conditions}
    return out


def format_table7(model: str, arms: Sequence[Mapping[str, Any]]) -> str:
    """Table 7's columns (agreement per protocol, n) plus the execution rate of each arm."""
    by = {r["protocol"]: r for r in arms}

    def cell(p: str, key: str) -> str:
        e = (by.get(p) or {}).get(key) or {}
        return "–" if e.get("value") is None else f"{e['value']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]"

    n = max((r["n"] for r in arms), default=0)
    head = "| model | Guided | Auto | Two-stage | n |\n|---|---|---|---|---|\n"
    lines = [f"| {model} | " + " | ".join(cell(p, "agreement") for p in PROTOCOLS) + f" | {n} |",
             "| (execution rate) | " + " | ".join(cell(p, "execution_rate") for p in PROTOCOLS) + " | |"]
    return head + "\n".join(lines)


def format_per_seed(model: str, per_seed: Mapping[str, Any]) -> str:
    """App. G's sampled re-run: Table 7 per seed, each contrast's Δ per seed, then the mean and sd across seeds."""
    def num(x: Any, spec: str = "+.3f") -> str:
        return "–" if x is None else format(x, spec)

    parts = []
    for s in per_seed["seeds"]:
        parts += [f"Seed (repetition) {s['repetition']}:", "", format_table7(model, s["arms"]), ""]
        parts += [f"- {c['b']} − {c['a']}: Δ agreement {num(c['agreement']['delta'])} "
                  f"[{num(c['agreement']['ci_low'])}, {num(c['agreement']['ci_high'])}] (n {c['n_common']})"
                  for c in s["contrasts"]]
        parts.append("")
    across = per_seed["across_seeds"]
    parts += ["Across seeds (mean, sd):", ""]
    parts += [f"- {p} agreement: mean {num(v['agreement']['mean'], '.3f')}, sd {num(v['agreement']['sd'], '.3f')}"
              for p, v in across["arms"].items()]
    parts += [f"- {k} Δ agreement: mean {num(v['agreement']['mean'])}, sd {num(v['agreement']['sd'], '.3f')}"
              for k, v in across["contrasts"].items()]
    return "\n".join(parts)
