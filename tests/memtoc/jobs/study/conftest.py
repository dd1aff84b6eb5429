"""Fixtures: tiny run directories for study tests, written in the run-store format (run.json + episodes.jsonl).

Each run has 20 questions per formulation:
- q0..q9 sit in ``arb`` (memory right): tool_wrong near, tool_error, and (reference only) tool_wrong far for q0..q5;
- q10..q19 sit in ``tool_gold`` for tool_right and in ``both_wrong`` for tool_wrong near.
Which questions keep memory, follow the tool, etc. is given per formulation by the caller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from memtoc.runs.runstore import RunStore

FORMS = ("reference", "paraphrase_a", "paraphrase_b")
ARB = [f"q{i}" for i in range(10)]
GOLD = [f"q{i}" for i in range(10, 20)]
FAR = [f"q{i}" for i in range(6)]


def rec(q: str, form: str, cond: str, cell: str | None, outcome: str, *, bucket: str | None = None,
        abstain: bool = False) -> dict:
    arm = "tool_wrong_far" if bucket == "far" else cond
    return {"episode_id": f"{q}-{arm}-{form}", "question_id": q, "formulation": form, "condition": cond,
            "divergence_bucket": bucket, "cell": cell, "outcome": outcome,
            "followed_tool": outcome in ("both", "followed_tool"), "kept_memory": outcome in ("both", "kept_memory"),
            "final_correct": outcome == "kept_memory" if cond == "tool_wrong" else outcome == "followed_tool",
            "abstain": abstain, "ack_proxy": outcome == "both", "trivial_hop": False}


def per_form(value: Iterable[str] | Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    if isinstance(value, Mapping):
        return {f: set(value.get(f, ())) for f in FORMS}
    return {f: set(value) for f in FORMS}


def build_records(*, keep, follow, wrong=(), abstain=(), far_keep=(), far_wrong=(), far=True) -> list[dict]:
    """Records of one run. Each argument: the questions with the 'good'/counted behaviour (a set, or per form)."""
    keep, follow, wrong, abstain = per_form(keep), per_form(follow), per_form(wrong), per_form(abstain)
    out = []
    for f in FORMS:
        for q in ARB:
            out.append(rec(q, f, "tool_wrong", "arb", "kept_memory" if q in keep[f] else "followed_tool",
                           bucket="near"))
            out.append(rec(q, f, "tool_error", "arb", "neither", abstain=q in abstain[f]))
        for q in GOLD:
            out.append(rec(q, f, "tool_right", "tool_gold", "followed_tool" if q in follow[f] else "neither"))
            out.append(rec(q, f, "tool_wrong", "both_wrong", "followed_tool" if q in wrong[f] else "neither",
                           bucket="near"))
            out.append(rec(q, f, "tool_error", "both_wrong", "neither", abstain=q in abstain[f]))
    for q in FAR if far else ():
        out.append(rec(q, "reference", "tool_wrong", "arb", "kept_memory" if q in set(far_keep) else "followed_tool",
                       bucket="far"))
    for q in GOLD[:6] if far else ():
        out.append(rec(q, "reference", "tool_wrong", "both_wrong",
                       "followed_tool" if q in set(far_wrong) else "neither", bucket="far"))
    return out


def write_run(root: Path, model: str, records: list[dict], **identity) -> Path:
    store = RunStore.open(root, identity={"model": model, **identity}, run_info={"config": {"model": model}})
    store.episodes.append(records)
    return root


def qs(lo: int, hi: int) -> list[str]:
    return [f"q{i}" for i in range(lo, hi)]


# ---------------------------------------------------------------------------------------------------------
# fixtures

import types  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def sd():
    """The helpers above, for tests that build their own runs."""
    return types.SimpleNamespace(rec=rec, build_records=build_records, write_run=write_run, qs=qs, FORMS=FORMS,
                                 ARB=ARB, GOLD=GOLD, FAR=FAR)


@pytest.fixture(scope="module")
def study_dirs(tmp_path_factory):
    """Three models (org/mA, org/mB, org/mC); mA and mB each with a base and two arms, mC with a base only.

    Retention (arb, 10 questions): mA base 2/10 everywhere; mA/warn 10/10 on reference and paraphrase_b, 3/10 on
    paraphrase_a; mA/prior = mA base (the same records). Correct-tool following: mA/warn keeps 10/10 except on
    paraphrase_b (2/10). mB base 5/10, mB/warn 10/10, mB/prior 7/10 on reference only. mC base 6/10, 1/10,
    3/10 (mC has no far records).
    Far distractor (reference, q0..q5): mA base keeps 6/6 far against 2/6 near; follows 2/6 far wrong against 6/6.
    """
    a_base = build_records(keep=qs(0, 2), follow=GOLD, wrong=qs(10, 18), abstain=qs(0, 16), far_keep=FAR,
                           far_wrong=qs(10, 12))
    a_warn = build_records(keep={"reference": ARB, "paraphrase_a": qs(0, 3), "paraphrase_b": ARB},
                           follow={"reference": GOLD, "paraphrase_a": GOLD, "paraphrase_b": qs(10, 12)},
                           wrong=qs(10, 18), abstain=qs(0, 6))
    b_base = build_records(keep=qs(0, 5), follow=qs(10, 19), wrong=qs(10, 19), abstain=qs(0, 10))
    b_warn = build_records(keep=ARB, follow=qs(10, 19), wrong=qs(10, 19), abstain=qs(0, 10))
    b_prior = build_records(keep={"reference": qs(0, 7), "paraphrase_a": qs(0, 5), "paraphrase_b": qs(0, 5)},
                            follow=qs(10, 19), wrong=qs(10, 19), abstain=qs(0, 10))
    c_base = build_records(keep={"reference": qs(0, 6), "paraphrase_a": qs(0, 1), "paraphrase_b": qs(0, 3)},
                           follow=qs(10, 17), wrong=qs(10, 15), abstain=qs(0, 12), far=False)
    tmp_path = tmp_path_factory.mktemp("study_runs")
    d = {
        "mA": write_run(tmp_path / "mA_base", "org/mA", a_base),
        "mA/warn": write_run(tmp_path / "mA_warn", "org/mA", a_warn, prompt_intervention="warn"),
        "mA/prior": write_run(tmp_path / "mA_prior", "org/mA", a_base, prompt_intervention="source-priority"),
        "mB": write_run(tmp_path / "mB_base", "org/mB", b_base),
        "mB/warn": write_run(tmp_path / "mB_warn", "org/mB", b_warn, prompt_intervention="warn"),
        "mB/prior": write_run(tmp_path / "mB_prior", "org/mB", b_prior, prompt_intervention="source-priority"),
        "mC": write_run(tmp_path / "mC_base", "org/mC", c_base),
    }
    return d
