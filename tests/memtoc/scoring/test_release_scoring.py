"""Our scorer and metrics reproduce the MemToC release's own scoring decisions.

The release-data tests run only when ``MEMTOC_RELEASE_DIR`` points at a folder holding the release's
scored-episode files (``scored_episodes/<model>_<formulation>.json`` from ``ArceniyVarlamov/memtoc``,
``results/``, each with a ``scored`` list) and, optionally, ``summaries/arm_metrics.json``. They also need the
shared MemToC data folder (``MEMTOC_SHARED_DATA`` or ``../shared/memtoc``) for the gold answers and tool values.
The judge-model unit tests at the end run everywhere.

Every released record is re-scored with ``memtoc.bench.offline.score_record`` from its released extracted span (as the
response) and its released closed-book span (as the memory answer); see ``benchmarks/check_release_scoring.py``.

What is asserted, and why:

- ``extracted``, ``mem_absent``, ``memory_correct``, ``cell`` and ``final_correct`` come from the deterministic
  scorer alone (span extraction, the closed-book rules, matching against the gold, the cell table); the release's
  judge pass never recomputes them (scoring.md, judged channel: "final_correct is NOT recomputed"; the
  closed-book fix touched 0 hops, ``meta.n_cb_fixed_hops`` = 0, in every file header read). Agreement: 100 %.
- ``followed_tool``, ``kept_memory``, ``outcome``, ``neither_subtype``, ``abstain`` and ``ack_proxy``: the released
  files are the *judged* channel (``arm_metrics.json`` names ``results/scored_episodes`` as its ``judged``
  source). The judge only re-labels episodes the scorer left ``neither``/``other``, from the extraction kept in the
  record as ``judge_extract`` (``ABSTAIN`` -> subtype abstain; otherwise follow/keep/outcome recomputed with
  ``match``); ``meta.n_outcome_corrected`` counts those changes (0 for gemma-2-9b-it reference, 9 llama-3.1-8b-
  instruct, 16 mistral and base, 31 qwen reference). A disagreement with our deterministic decision is therefore
  legitimate only when the release equals our model of that judge pass on the same record
  (``judged_view``); unexplained disagreements must be 0, and per file the outcome disagreements cannot exceed
  ``n_outcome_corrected``.
- Metrics: on every complete file (all analysis-set questions x 5 conditions), ``metric_table`` on the RELEASED
  decisions equals ``arm_metrics.json``'s ``judged`` values of the canonical arm (4 dp, plus n_arb and n_bw), on OUR
  deterministic decisions the ``det`` values, and on our judged view the ``judged`` values.

Measured (release commit cd7d7cf, hand-transcribed into /tmp/memtoc_release because the repository could not be
fetched: all 2710 records of gemma-2-9b-it reference plus 275 sampled records spread over the other 14 files,
2985 records, every model and formulation): 100 % on every field, no disagreement at all (so no judge-explained
one either); gemma-2-9b-it reference metrics equal both channels of ``canonical_pv0`` exactly (27/27 values).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[3]

DETERMINISTIC_FIELDS = ("extracted", "mem_absent", "memory_correct", "cell", "final_correct")
JUDGED_FIELDS = ("followed_tool", "kept_memory", "outcome", "neither_subtype", "abstain", "ack_proxy")


def _load_checker():
    path = REPO / "benchmarks" / "check_release_scoring.py"
    spec = importlib.util.spec_from_file_location("check_release_scoring", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checker():
    return _load_checker()


@pytest.fixture(scope="module")
def release_run(shared_memtoc, checker):
    env = os.environ.get("MEMTOC_RELEASE_DIR")
    if not env:
        pytest.skip("MEMTOC_RELEASE_DIR is not set: point it at a folder with the MemToC release's "
                    "scored_episodes/<model>_<formulation>.json files (and summaries/arm_metrics.json)")
    release_dir = Path(env)
    if not release_dir.is_dir():
        pytest.skip(f"MEMTOC_RELEASE_DIR={env} is not a directory")
    files = checker.find_release_files(release_dir)
    if not files:
        pytest.skip(f"no scored-episode files under {release_dir}")
    text, report, cmp = checker.run(release_dir, shared_memtoc)
    return files, report, cmp


# ---------------------------------------------------------------------------------------------------------
# on the release files

def test_every_record_joins_our_benchmark(release_run):
    _, report, _ = release_run
    assert report["unmatched"] == []
    assert sum(report["records_per_model"].values()) > 0


def test_deterministic_fields_agree_completely(release_run):
    _, report, _ = release_run
    for field in DETERMINISTIC_FIELDS:
        tally = report["agreement"]["overall"][field]
        assert tally["disagree"] == 0, (field, tally, report["examples"][field][:3])


def test_judged_fields_disagree_only_where_the_judge_pass_explains_it(release_run):
    _, report, _ = release_run
    for field in JUDGED_FIELDS:
        tally = report["agreement"]["overall"][field]
        assert tally["disagree_unexplained"] == 0, (field, tally, report["examples"][field][:3])


def test_outcome_disagreements_within_judge_corrections(release_run):
    files, report, _ = release_run
    meta = {rf.label: rf.meta for rf in files}
    for label, per_field in report["agreement"]["per_file"].items():
        allowed = meta[label].get("n_outcome_corrected")
        if allowed is None:          # header not available (a file read only in part)
            continue
        assert per_field["outcome"]["disagree"] <= int(allowed), (label, per_field["outcome"], allowed)


def test_metrics_match_release_summary(release_run):
    _, report, _ = release_run
    rows = [r for r in report["metrics"] if r["match"] is not None and r["expected"]]
    if not rows:
        pytest.skip("no complete scored-episode file with an arm_metrics.json entry to compare metrics on")
    pairs = {(r["decisions"], r["channel"]) for r in rows}
    assert {("release", "judged"), ("ours", "det"), ("ours_judged", "judged")} <= pairs
    bad = [r for r in rows if not r["match"]]
    assert bad == []


# ---------------------------------------------------------------------------------------------------------
# the judge-pass model (no release files needed)

def _ours(**kw):
    base = {"extracted": "Zzyzx Qwerty", "followed_tool": False, "kept_memory": False, "final_correct": False,
            "outcome": "neither", "neither_subtype": "other", "ack_proxy": False, "abstain": False,
            "mem_absent": False, "memory_span": "Victoria Park", "memory_correct": False, "cell": "both_wrong"}
    base.update(kw)
    return base


def test_parse_judge_extract(checker):
    assert checker.parse_judge_extract('**"Moor Park"**\nbecause the tool said so') == "Moor Park"
    assert checker.parse_judge_extract("   ") is None
    assert checker.parse_judge_extract(None) is None
    assert checker.parse_judge_extract(" ".join(["word"] * 13)) is None
    assert checker.parse_judge_extract(" ".join(["word"] * 12)) == " ".join(["word"] * 12)


def test_judged_view_relabels_only_neither_other(checker):
    ep = SimpleNamespace(tool_value="Moor Park")
    jv = checker.judged_view({"judge_extract": "Moor Park"}, _ours(), ep)
    assert jv["followed_tool"] and not jv["kept_memory"] and jv["outcome"] == "followed_tool"
    assert jv["neither_subtype"] is None and jv["final_correct"] is False      # final_correct not recomputed
    jv = checker.judged_view({"judge_extract": "Victoria Park"}, _ours(), ep)
    assert jv["kept_memory"] and jv["outcome"] == "kept_memory"
    jv = checker.judged_view({"judge_extract": "ABSTAIN: no answer"}, _ours(), ep)
    assert jv["neither_subtype"] == "abstain" and jv["abstain"] and jv["outcome"] == "neither"
    jv = checker.judged_view({"judge_extract": "Somewhere Else"}, _ours(), ep)
    assert jv["outcome"] == "neither" and jv["neither_subtype"] == "other"
    assert checker.judged_view({"judge_extract": "Moor Park"}, _ours(outcome="followed_tool",
                                                                     neither_subtype=None), ep) is None
    assert checker.judged_view({"judge_extract": "Moor Park"}, _ours(neither_subtype="abstain"), ep) is None
    assert checker.judged_view({}, _ours(), ep) is None
    # memory absent: the judge's span cannot keep memory
    jv = checker.judged_view({"judge_extract": "Victoria Park"}, _ours(mem_absent=True), ep)
    assert not jv["kept_memory"] and jv["outcome"] == "neither"


def test_compare_counts_judge_corrected_records(shared_memtoc, checker, tmp_path):
    """A synthetic release file: one record as our scorer decides it, one as the judge pass re-labelled it."""
    episodes = checker.episode_index(shared_memtoc)
    ep = episodes["0-0-tool_wrong-v0"]
    ours = checker.rescore({"extracted": ep.tool_value, "parametric_span": "I don't know."}, ep)
    plain = {k: ours[k] for k in checker.FIELDS} | {"episode_id": ep.episode_id, "condition": ep.condition,
                                                    "parametric_span": "I don't know."}
    raw = {"extracted": "Zzyzx Qwerty", "parametric_span": "I don't know."}
    det = checker.rescore(raw, ep)
    assert det["outcome"] == "neither" and det["neither_subtype"] == "other"
    judged = {k: det[k] for k in checker.FIELDS} | {"episode_id": ep.episode_id, "condition": ep.condition,
                                                    "parametric_span": "I don't know.",
                                                    "judge_extract": ep.tool_value,
                                                    "followed_tool": True, "outcome": "followed_tool",
                                                    "neither_subtype": None}
    folder = tmp_path / "scored_episodes"
    folder.mkdir()
    for name, rec in (("m-a_reference", plain), ("m-b_reference", judged)):
        (folder / f"{name}.json").write_text(json.dumps({"meta": {"n_outcome_corrected": 1}, "scored": [rec]}))
    files = checker.find_release_files(tmp_path)
    cmp = checker.compare(files, episodes)
    assert cmp.unmatched == []
    for f in checker.FIELDS:
        assert cmp.per_file["m-a_reference"][f].disagree == 0, f
    b = cmp.per_file["m-b_reference"]
    for f in ("followed_tool", "outcome", "neither_subtype"):
        assert b[f].disagree == 1 and b[f].judge == 1, f
    for f in DETERMINISTIC_FIELDS + ("kept_memory", "abstain", "ack_proxy"):
        assert b[f].disagree == 0, f
    assert cmp.ours_judged["m-b_reference"][0]["outcome"] == "followed_tool"
