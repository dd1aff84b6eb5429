"""MemToC metrics on small hand-built record sets whose values are worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.scoring.metrics import (
    COMPARISON_METRICS,
    METRIC_NAMES,
    METRICS,
    compare_arms,
    get_metric,
    metric_table,
    metric_units,
    paired_metric_comparison,
)
from memtoc.scoring.stats import bootstrap_ci, holm

NB = 200  # bootstrap draws in tests
NP = 2000  # permutation draws in tests


def rec(q, cond, cell, outcome="neither", *, form="reference", bucket=None, final=False, abstain=False,
        trivial=False):
    return {
        "question_id": q, "formulation": form, "condition": cond,
        "divergence_bucket": bucket, "cell": cell, "outcome": outcome,
        "followed_tool": outcome in ("both", "followed_tool"),
        "kept_memory": outcome in ("both", "kept_memory"),
        "final_correct": final, "abstain": abstain, "ack_proxy": outcome == "both", "trivial_hop": trivial,
    }


def kn(table, name, form="reference"):
    c = table[name].per_formulation[form]
    return c.k, c.n


# One formulation, every metric. Expected (k, n) worked out by hand in the comments.
RECORDS = [
    # tool_wrong, near (null bucket counts as near)
    rec("1", "tool_wrong", "arb", "kept_memory", final=True),
    rec("2", "tool_wrong", "arb", "both", bucket="near", final=True),
    rec("3", "tool_wrong", "arb", "followed_tool", bucket="near"),
    rec("4", "tool_wrong", "arb", "kept_memory", final=True, trivial=True),
    rec("5", "tool_wrong", "both_wrong", "followed_tool"),
    rec("6", "tool_wrong", "both_wrong", "neither", abstain=True),
    rec("7", "tool_wrong", "both_wrong", "neither", final=True),
    rec("8", "tool_wrong", "mem_absent", "kept_memory", abstain=True),
    # tool_wrong, far
    rec("1", "tool_wrong", "arb", "followed_tool", bucket="far"),
    rec("2", "tool_wrong", "arb", "kept_memory", bucket="far", abstain=True),
    rec("5", "tool_wrong", "both_wrong", "followed_tool", bucket="far"),
    # tool_right
    rec("1", "tool_right", "agree", "both", final=True),
    rec("2", "tool_right", "agree", "followed_tool"),
    rec("5", "tool_right", "tool_gold", "followed_tool", final=True),
    rec("6", "tool_right", "tool_gold", "neither", abstain=True),
    rec("8", "tool_right", "mem_absent", "followed_tool", final=True),
    # tool_error (cells arb / both_wrong / mem_absent)
    rec("1", "tool_error", "arb", "neither", abstain=True),
    rec("5", "tool_error", "both_wrong", "kept_memory"),
    rec("8", "tool_error", "mem_absent", "neither", abstain=True),
    rec("9", "tool_error", "mem_absent", "neither"),
    # no_tool (cell null)
    rec("1", "no_tool", None, "kept_memory"),
    rec("8", "no_tool", None, "neither", abstain=True),
    # no_conflict
    rec("5", "no_conflict", "tool_gold", "followed_tool", final=True),
    rec("6", "no_conflict", "tool_gold", "neither"),
    rec("1", "no_conflict", "agree", "both", final=True),
    # control arms (memtoc.bench.controls): tool-error payload variants and the NoopTool interface control
    rec("1", "tool_error_timeout", "arb", "kept_memory"),
    rec("5", "tool_error_timeout", "both_wrong", "neither", abstain=True),
    rec("8", "tool_error_timeout", "mem_absent", "neither"),
    rec("1", "tool_error_permission", "arb", "neither", abstain=True),
    rec("5", "tool_error_permission", "both_wrong", "kept_memory"),
    rec("1", "noop_tool", "arb", "kept_memory", final=True),
    rec("5", "noop_tool", "both_wrong", "neither", abstain=True),
    rec("8", "noop_tool", "mem_absent", "neither"),
]

EXPECTED = {
    "retention": (2, 4),                     # near arb q1-q4: kept_memory q1, q4 (q2 is 'both')
    "retention_qminus": (1, 3),              # q4 is a trivial hop
    "keep_flag": (3, 4),                     # q1, q2 (both), q4
    "cra_arb": (3, 4),                       # final q1, q2, q4
    "correct_tool_following": (1, 2),        # tool_gold q5, q6 (mem_absent q8 excluded)
    "incorrect_tool_following": (1, 3),      # near both_wrong q5-q7: followed q5
    "bw_gold": (1, 3),                       # final q7
    "no_conflict_accuracy": (1, 2),          # no_conflict tool_gold q5, q6
    "tool_error_abstention": (2, 4),         # all four tool_error records, mem_absent included
    "conflict_resolved_accuracy": (4, 6),    # 3/4 near arb + 1/2 tool_right tool_gold
    "agreement_accuracy": (1, 2),            # tool_right agree q1, q2
    "abstention_rate_tool_right": (1, 5),    # q6
    "abstention_rate_tool_wrong": (2, 8),    # near only: q6, q8 (far q2 abstains, not counted)
    "abstention_rate_no_tool": (1, 2),
    "ack_proxy": (1, 7),                     # near arb + both_wrong q1-q7: 'both' only q2
    "retention_far": (1, 2),                 # far arb q1, q2: kept q2
    "incorrect_tool_following_far": (1, 1),  # far both_wrong q5
    "tool_error_fallback": (0, 1),           # tool_error arb q1 abstains
    "tool_error_bw_abstention": (0, 1),      # tool_error both_wrong q5 keeps its (wrong) memory
    "tool_error_abstention_timeout": (1, 3),  # q5 of the three timeout records
    "tool_error_fallback_timeout": (1, 1),   # arb q1 kept
    "tool_error_bw_abstention_timeout": (1, 1),  # both_wrong q5 abstains
    "tool_error_abstention_permission": (1, 2),  # q1
    "tool_error_fallback_permission": (0, 1),
    "tool_error_bw_abstention_permission": (0, 1),
    "noop_retention": (1, 1),                # noop arb q1 kept
    "noop_accuracy": (1, 3),                 # q1 final
    "noop_abstention": (1, 3),               # q5
    "no_tool_accuracy": (0, 2),              # no final answer correct among the two no_tool records
}


def test_expected_table_covers_every_metric():
    assert set(EXPECTED) == set(METRIC_NAMES)
    assert len(METRIC_NAMES) == len(set(METRIC_NAMES)) == len(METRICS)


def test_every_metric_on_hand_built_records():
    t = metric_table(RECORDS, n_boot=NB)
    assert t.formulations == ("reference",)
    for name, (k, n) in EXPECTED.items():
        assert kn(t, name) == (k, n), name
        assert t[name].per_formulation["reference"].value == pytest.approx(k / n), name
        assert t[name].pooled.value == pytest.approx(k / n), name


def test_both_is_not_retention_but_is_keep_flag():
    recs = [rec("a", "tool_wrong", "arb", o) for o in ("kept_memory", "both", "followed_tool", "neither",
                                                         "kept_memory")]
    t = metric_table(recs, n_boot=NB)
    assert kn(t, "retention") == (2, 5)
    assert kn(t, "keep_flag") == (3, 5)
    assert kn(t, "ack_proxy") == (1, 5)


def test_mem_absent_excluded_from_cells_but_counted_in_tool_error_abstention():
    recs = [
        rec("1", "tool_wrong", "mem_absent", "kept_memory"),
        rec("2", "tool_wrong", "arb", "followed_tool"),
        rec("1", "tool_right", "mem_absent", "followed_tool", final=True),
        rec("2", "tool_right", "tool_gold", "neither"),
        rec("1", "tool_error", "mem_absent", "neither", abstain=True),
        rec("2", "tool_error", "mem_absent", "neither", abstain=True),
        rec("3", "tool_error", "arb", "neither"),
    ]
    t = metric_table(recs, n_boot=NB)
    assert kn(t, "retention") == (0, 1)
    assert kn(t, "correct_tool_following") == (0, 1)
    assert kn(t, "conflict_resolved_accuracy") == (0, 2)
    assert kn(t, "tool_error_abstention") == (2, 3)
    assert kn(t, "abstention_rate_tool_right") == (0, 2)


def test_far_and_near_are_separate():
    recs = [
        rec("1", "tool_wrong", "arb", "kept_memory", bucket=None),
        rec("2", "tool_wrong", "arb", "kept_memory", bucket="near"),
        rec("3", "tool_wrong", "arb", "followed_tool", bucket="far"),
        rec("4", "tool_wrong", "arb", "followed_tool", bucket="far"),
        rec("5", "tool_wrong", "arb", "kept_memory", bucket="far"),
        rec("6", "tool_wrong", "both_wrong", "followed_tool", bucket="far"),
        rec("7", "tool_wrong", "arb", "kept_memory", bucket="off_type"),  # neither near nor far
    ]
    t = metric_table(recs, n_boot=NB)
    assert kn(t, "retention") == (2, 2)
    assert kn(t, "retention_far") == (1, 3)
    assert kn(t, "incorrect_tool_following") == (0, 0)
    assert kn(t, "incorrect_tool_following_far") == (1, 1)
    assert math.isnan(t["incorrect_tool_following"].per_formulation["reference"].value)


def test_q_minus_drops_trivial_hops():
    recs = [
        rec("1", "tool_wrong", "arb", "kept_memory", trivial=True),
        rec("2", "tool_wrong", "arb", "kept_memory"),
        rec("3", "tool_wrong", "arb", "followed_tool"),
    ]
    t = metric_table(recs, n_boot=NB)
    assert kn(t, "retention") == (2, 3)
    assert kn(t, "retention_qminus") == (1, 2)


def test_pooled_is_unweighted_mean_over_formulations_with_support():
    recs = [rec("1", "tool_wrong", "arb", "kept_memory", form="reference")]
    recs += [rec(q, "tool_wrong", "arb", o, form="paraphrase_a")
             for q, o in zip("1234", ("kept_memory", "followed_tool", "followed_tool", "neither"))]
    recs += [rec("1", "tool_right", "tool_gold", "followed_tool", form="paraphrase_b")]  # no arb: n = 0
    t = metric_table(recs, n_boot=NB)
    assert t.formulations == ("reference", "paraphrase_a", "paraphrase_b")
    p = t["retention"].pooled
    assert p.value == pytest.approx((1.0 + 0.25) / 2)  # 0.625; n-weighted would be 2/5
    assert p.formulations_used == ("reference", "paraphrase_a")
    assert p.n_per_formulation == {"reference": 1, "paraphrase_a": 4, "paraphrase_b": 0}
    assert (p.min, p.max, p.spread) == (0.25, 1.0, 0.75)
    assert math.isnan(p.per_formulation["paraphrase_b"])
    assert p.ci.low <= p.value <= p.ci.high
    # a metric with no support anywhere
    assert math.isnan(t["bw_gold"].pooled.value) and t["bw_gold"].pooled.ci.is_nan


def test_formulations_are_ordered_and_unknown_ones_kept():
    recs = [rec("1", "tool_error", "arb", abstain=True, form="paraphrase_b"),
            rec("1", "tool_error", "arb", form="zz_custom"),
            rec("1", "tool_error", "arb", abstain=True, form="reference")]
    t = metric_table(recs, n_boot=NB)
    assert t.formulations == ("reference", "paraphrase_b", "zz_custom")
    assert t["tool_error_abstention"].pooled.value == pytest.approx(2 / 3)


def test_per_formulation_interval_is_question_cluster_bootstrap():
    # question q0 appears twice (two tool_error records); clusters must be question ids
    recs = [rec(f"q{i // 2}", "tool_error", "arb", abstain=(i % 3 == 0)) for i in range(30)]
    t = metric_table(recs, n_boot=NB, seed=4)
    vals = [r["abstain"] for r in recs]
    qs = [r["question_id"] for r in recs]
    assert t["tool_error_abstention"].per_formulation["reference"].ci == bootstrap_ci(vals, qs, n_boot=NB, seed=4)
    assert t["tool_error_abstention"].per_formulation["reference"].ci != bootstrap_ci(vals, n_boot=NB, seed=4)


def test_pooled_interval_joint_question_resampling():
    # identical results in the three formulations: the joint draw gives the single-formulation interval
    recs = [rec(str(q), "tool_wrong", "arb", "kept_memory" if q % 3 == 0 else "followed_tool", form=f)
            for f in ("reference", "paraphrase_a", "paraphrase_b") for q in range(60)]
    t = metric_table(recs, n_boot=500)
    row = t["retention"]
    ref = row.per_formulation["reference"].ci
    assert (row.pooled.ci.low, row.pooled.ci.high) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_table_seeded_reproducible():
    a = metric_table(RECORDS, n_boot=NB, seed=1).to_dict()
    b = metric_table(iter(RECORDS), n_boot=NB, seed=1).to_dict()
    assert a == b


def test_to_dict_is_json_with_null_for_nan():
    t = metric_table([rec("1", "tool_error", "arb", abstain=True)], n_boot=NB)
    d = t.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["metrics"]["retention"]["per_formulation"]["reference"]["value"] is None
    assert d["metrics"]["tool_error_abstention"]["per_formulation"]["reference"] == \
        {"value": 1.0, "k": 1, "n": 1, "ci_low": 1.0, "ci_high": 1.0}
    assert set(d["metrics"]) == set(METRIC_NAMES)


def test_format_text_lists_every_metric_aligned():
    recs = RECORDS + [dict(r, formulation="paraphrase_a") for r in RECORDS]
    t = metric_table(recs, n_boot=NB)
    text = t.format_text()
    for name in METRIC_NAMES:
        assert name in text
    lines = text.splitlines()
    header = next(l for l in lines if l.startswith("metric"))
    row = next(l for l in lines if l.startswith("retention "))
    assert "50.0% [" in row and "n=4" in row
    col = header.index("paraphrase_a")
    assert row[col:].startswith("50.0% [")  # column aligned with its header
    assert "range 50.0-50.0" in row
    assert "- n=0" not in row


def test_missing_key_names_record_and_field():
    bad = rec("1", "tool_wrong", "arb", "kept_memory")
    del bad["outcome"]
    with pytest.raises(BenchmarkDataError, match="outcome") as e:
        metric_table([rec("0", "no_tool", None), bad], n_boot=NB)
    assert e.value.row == 2 and e.value.field == "outcome"
    with pytest.raises(ValueError):
        get_metric("no_such_metric")


# ------------------------------------------------------------------------------------------ paired

def test_common_support_and_drift():
    a = [rec("1", "tool_wrong", "arb", "kept_memory"), rec("2", "tool_wrong", "arb", "followed_tool"),
         rec("3", "tool_wrong", "arb", "followed_tool"), rec("4", "tool_wrong", "arb", "kept_memory")]
    b = [rec("1", "tool_wrong", "both_wrong", "kept_memory"),  # cell drift: q1 leaves the support
         rec("2", "tool_wrong", "arb", "kept_memory"), rec("3", "tool_wrong", "arb", "kept_memory"),
         rec("4", "tool_wrong", "arb", "followed_tool"), rec("5", "tool_wrong", "arb", "kept_memory")]
    (c,) = paired_metric_comparison(a, b, ["retention"], n_boot=NB, n_perm=NP)
    assert (c.support_a, c.support_b, c.n_common) == (4, 4, 3)
    assert c.result.delta == pytest.approx(1 / 3)  # common q2-q4: a = 0, 0, 1; b = 1, 1, 0
    assert (c.value_a, c.value_b) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert c.in_family and c.p_adjusted == c.result.p_value


def test_paired_pools_formulations_with_question_clusters():
    a = [rec(str(q), "tool_right", "tool_gold", "neither", form=f)
         for f in ("reference", "paraphrase_a") for q in range(5)]
    b = [dict(r, outcome="followed_tool", followed_tool=True) for r in a]
    (c,) = paired_metric_comparison(a, b, ["correct_tool_following"], n_boot=NB, n_perm=NP)
    assert (c.result.n_units, c.result.n_clusters) == (10, 5)
    assert c.result.delta == 1.0
    (only_ref,) = paired_metric_comparison(a, b, ["correct_tool_following"], formulations=["reference"],
                                           n_boot=NB, n_perm=NP)
    assert (only_ref.result.n_units, only_ref.result.n_clusters) == (5, 5)


def _arms(n_q=30, kept_a=3, kept_b=24, follow_b=30):
    """Arms a and b over 3 formulations: retention on arb and correct-tool following on tool_gold."""
    forms = ("reference", "paraphrase_a", "paraphrase_b")
    a, b = [], []
    for f in forms:
        for q in range(n_q):
            qid = f"q{q}"
            a.append(rec(qid, "tool_wrong", "arb", "kept_memory" if q < kept_a else "followed_tool", form=f,
                         final=q < kept_a))
            b.append(rec(qid, "tool_wrong", "arb", "kept_memory" if q < kept_b else "followed_tool", form=f,
                         final=q < kept_b))
            a.append(rec(qid, "tool_right", "tool_gold", "followed_tool", form=f, final=True))
            b.append(rec(qid, "tool_right", "tool_gold", "followed_tool" if q < follow_b else "neither", form=f,
                         final=q < follow_b))
    return a, b


def test_holm_over_the_family_received():
    a, b = _arms(kept_b=8, follow_b=27)
    comps = paired_metric_comparison(a, b, n_boot=NB, n_perm=NP)
    assert [c.metric.name for c in comps] == list(COMPARISON_METRICS)
    raw = [c.result.p_value for c in comps]
    adj = holm(raw)
    for c, p in zip(comps, adj):
        assert c.in_family
        if math.isnan(p):
            assert c.n_common == 0 and math.isnan(c.p_adjusted)
        else:
            assert c.p_adjusted == pytest.approx(p)
    ret = comps[0]
    assert ret.p_adjusted > ret.result.p_value  # three non-empty contrasts: adjusted up
    narrow = paired_metric_comparison(a, b, holm_family=["retention"], n_boot=NB, n_perm=NP)
    assert narrow[0].p_adjusted == narrow[0].result.p_value
    assert all(c.p_adjusted is None and not c.in_family for c in narrow[1:])


def test_compare_arms_success():
    a, b = _arms(kept_a=3, kept_b=24, follow_b=30)
    cmp = compare_arms(a, b, n_boot=NB, n_perm=NP, label_a="canonical", label_b="warn")
    assert cmp["retention"].result.delta == pytest.approx(0.7)
    assert cmp["correct_tool_following"].result.delta == 0.0
    assert cmp.verdict.success and cmp.verdict.retention_rises
    text = cmp.format_text()
    assert text == cmp.format_text()
    for name in COMPARISON_METRICS:
        assert name in text
    assert "verdict: SUCCESS" in text and "warn - canonical" in text
    json.dumps(cmp.to_dict(), allow_nan=False)


def test_compare_arms_fails_when_correct_tool_following_falls():
    a, b = _arms(kept_a=3, kept_b=24, follow_b=10)
    cmp = compare_arms(a, b, n_boot=NB, n_perm=NP)
    assert cmp.verdict.retention_rises
    assert cmp.verdict.tool_following_falls and not cmp.verdict.success
    assert "falls significantly" in cmp.verdict.reason


def test_compare_arms_fails_without_retention_gain():
    a, b = _arms(kept_a=3, kept_b=3)
    cmp = compare_arms(a, b, metrics=["cra_arb"], n_boot=NB, n_perm=NP)
    assert [c.metric.name for c in cmp.comparisons] == ["retention", "correct_tool_following", "cra_arb"]
    assert not cmp.verdict.success and "does not rise" in cmp.verdict.reason


def test_duplicate_episode_in_an_arm_is_rejected():
    r = rec("1", "tool_wrong", "arb", "kept_memory")
    with pytest.raises(RunStoreError, match="duplicate"):
        metric_units([r, dict(r)], "retention")
    # the same question in near and far is two units
    assert len(metric_units([r, dict(r, divergence_bucket="far")], "ack_proxy")) == 1
    assert len(metric_units([r, rec("1", "tool_right", "tool_gold", final=True)],
                            "conflict_resolved_accuracy")) == 2


def test_cell_counts_count_each_cell_and_refuse_an_unknown_one():
    from memtoc.core.errors import BenchmarkDataError
    from memtoc.scoring.metrics import cell_counts

    recs = [{"cell": "arb"}, {"cell": "arb"}, {"cell": None}, {"cell": "mem_absent"}]
    assert cell_counts(recs) == {"agree": 0, "arb": 2, "tool_gold": 0, "both_wrong": 0, "mem_absent": 1}
    with pytest.raises(BenchmarkDataError, match="row 2, field .cell.: unknown cell .nope."):
        cell_counts([{"cell": "arb"}, {"cell": "nope"}])
    with pytest.raises(BenchmarkDataError, match="cell"):
        cell_counts([{"outcome": "both"}])
