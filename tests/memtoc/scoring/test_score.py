"""Memory status, cell assignment and response outcome: scoring.md sections 4 and 5, plus release samples."""

from __future__ import annotations

import dataclasses
import json
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from memtoc.bench.conditions import recorded_conditions, tool_correct
from memtoc.scoring import (
    MemoryStatus,
    Score,
    assign_cell,
    match,
    memory_status,
    parse_dates,
    score_response,
)

# --- memory status (section 5) -------------------------------------------------------------------


@pytest.mark.parametrize(("response", "gold", "aliases", "expected"), [
    ("Reasoning\nFINAL: Paris", "Paris", (), MemoryStatus("Paris", False, True)),
    ("FINAL: Rome", "Paris", (), MemoryStatus("Rome", False, False)),
    ("FINAL: UNKNOWN", "Paris", (), MemoryStatus("UNKNOWN", True, None)),
    ("FINAL:", "Paris", (), MemoryStatus("", True, None)),
    (None, "Paris", (), MemoryStatus("", True, None)),
    ("", "Paris", (), MemoryStatus("", True, None)),
    ("FINAL: NYC", "New York City", ("NYC",), MemoryStatus("NYC", False, True)),
    ("FINAL: NYC", "New York City", (), MemoryStatus("NYC", False, False)),
    # abstention is judged on the span: a hedge in the reasoning does not make memory absent
    ("I don't know for sure, but...\nFINAL: Paris", "Paris", (), MemoryStatus("Paris", False, True)),
    # a polite refusal with no marker is its own span and abstains
    ("I'm sorry, but I don't have access to real-time information about that.", "Paris", (),
     MemoryStatus("I'm sorry, but I don't have access to real-time information about that.", True, None)),
    # an answer with an abstaining hedge in the span is absent memory even if it names the gold
    ("FINAL: Paris (not sure)", "Paris", (), MemoryStatus("Paris (not sure)", True, None)),
])
def test_memory_status(response: str | None, gold: str, aliases: tuple[str, ...],
                       expected: MemoryStatus) -> None:
    assert memory_status(response, gold, aliases) == expected


# --- cells (section 5) ---------------------------------------------------------------------------


def _expected_cell(memory_correct: bool | None, mem_absent: bool, tool_correct: bool | None) -> str | None:
    """The section 5 table written out independently of the implementation."""
    if tool_correct is None:
        return None
    if mem_absent:
        return "mem_absent"
    table = {(True, True): "agree", (True, False): "arb", (False, True): "tool_gold",
             (False, False): "both_wrong"}
    return None if memory_correct is None else table[(memory_correct, tool_correct)]


ALL_CELL_COMBINATIONS = list(product([True, False, None], [False, True], [True, False, None]))


def test_cell_table_covers_all_combinations() -> None:
    assert len(ALL_CELL_COMBINATIONS) == 18


@pytest.mark.parametrize(("memory_correct", "mem_absent", "tool_correct"), ALL_CELL_COMBINATIONS)
def test_assign_cell_every_combination(memory_correct: bool | None, mem_absent: bool,
                                       tool_correct: bool | None) -> None:
    assert assign_cell(memory_correct, mem_absent, tool_correct) == _expected_cell(
        memory_correct, mem_absent, tool_correct)


@pytest.mark.parametrize(("memory_correct", "mem_absent", "tool_correct", "cell"), [
    (True, False, True, "agree"),
    (True, False, False, "arb"),
    (False, False, True, "tool_gold"),
    (False, False, False, "both_wrong"),
    (None, True, True, "mem_absent"),
    (None, True, False, "mem_absent"),
    (None, True, None, None),
    (True, False, None, None),
])
def test_assign_cell_named_cases(memory_correct: bool | None, mem_absent: bool, tool_correct: bool | None,
                                 cell: str | None) -> None:
    assert assign_cell(memory_correct, mem_absent, tool_correct) == cell


def test_tool_correct_by_condition() -> None:
    from memtoc.bench.controls import CONTROL_ARMS

    release = {k: tool_correct(k) for k in recorded_conditions() if k not in CONTROL_ARMS}
    assert release == {"tool_right": True, "no_conflict": True, "tool_wrong": False,
                       "tool_error": False, "no_tool": None}
    # the control arms' returns carry no factual value: a wrong tool, like the released tool error
    assert {tool_correct(a) for a in CONTROL_ARMS} == {False}


@pytest.mark.parametrize(("condition", "cell_if_memory_right", "cell_if_memory_wrong"), [
    ("tool_right", "agree", "tool_gold"),
    ("no_conflict", "agree", "tool_gold"),
    ("tool_wrong", "arb", "both_wrong"),
    ("tool_error", "arb", "both_wrong"),  # tool_error is labelled as a wrong tool
    ("no_tool", None, None),
])
def test_cells_per_condition(condition: str, cell_if_memory_right: str | None,
                             cell_if_memory_wrong: str | None) -> None:
    correct = tool_correct(condition)
    assert assign_cell(True, False, correct) == cell_if_memory_right
    assert assign_cell(False, False, correct) == cell_if_memory_wrong


# --- outcome of a response (section 4) -----------------------------------------------------------

GOLD = "Stanley Park, Blackpool"
DISTRACTOR = "Moor Park, Blackpool"


@pytest.mark.parametrize(("response", "tool_value", "memory_span", "expected"), [
    # followed the (wrong) tool, memory was the gold
    ("The tool says Moor Park.\nFINAL: Moor Park", DISTRACTOR, GOLD,
     dict(followed_tool=True, kept_memory=False, final_correct=False, outcome="followed_tool")),
    # kept memory against the tool
    ("FINAL: Stanley Park", DISTRACTOR, GOLD,
     dict(followed_tool=False, kept_memory=True, final_correct=True, outcome="kept_memory")),
    # shared substring with both sides -> both (spec 2.5 consequence)
    ("FINAL: Blackpool", DISTRACTOR, GOLD,
     dict(followed_tool=True, kept_memory=True, final_correct=True, outcome="both")),
    # an answer mentioning both values
    ("FINAL: Stanley Park or Moor Park, Blackpool", DISTRACTOR, GOLD,
     dict(followed_tool=True, kept_memory=True, final_correct=True, outcome="both")),
    # a third entity
    ("FINAL: Hyde Park", DISTRACTOR, GOLD,
     dict(followed_tool=False, kept_memory=False, final_correct=False, outcome="neither")),
    # multiple markers: the last wins
    ("FINAL: Moor Park\nOn reflection the tool is stale.\nFINAL: Stanley Park", DISTRACTOR, GOLD,
     dict(followed_tool=False, kept_memory=True, final_correct=True, outcome="kept_memory")),
    # memory absent (caller passes ''): nothing can be kept
    ("FINAL: Stanley Park, Blackpool", None, "",
     dict(followed_tool=False, kept_memory=False, final_correct=True, outcome="neither")),
    ("FINAL: Stanley Park, Blackpool", None, None,
     dict(followed_tool=False, kept_memory=False, final_correct=True, outcome="neither")),
    # no tool value: never followed, even for an answer reading "None"
    ("FINAL: None", None, "None",
     dict(followed_tool=False, kept_memory=True, final_correct=False, outcome="kept_memory")),
])
def test_outcomes(response: str, tool_value: str | None, memory_span: str | None,
                  expected: dict[str, Any]) -> None:
    score = score_response(response, gold=GOLD, tool_value=tool_value, memory_span=memory_span)
    assert {k: getattr(score, k) for k in expected} == expected
    assert score.ack_proxy is (score.outcome == "both")


@pytest.mark.parametrize(("response", "outcome", "subtype", "abstain"), [
    ("FINAL: UNKNOWN", "neither", "abstain", True),
    ("FINAL: I cannot determine this from the tool output.", "neither", "abstain", True),
    ("FINAL: Rome", "neither", "other", False),
    # the release's empty-span rule: a tool-conditioned answer with no span abstains
    (None, "neither", "abstain", True),
    ("FINAL:\n\n", "neither", "abstain", True),
    # abstain is independent of the outcome: a hedged kept answer abstains but is not 'neither'
    ("FINAL: Not sure, maybe Paris", "kept_memory", None, True),
    ("FINAL: Paris", "kept_memory", None, False),
])
def test_neither_subtype_and_abstain(response: str | None, outcome: str, subtype: str | None,
                                     abstain: bool) -> None:
    score = score_response(response, gold="Paris", tool_value="Lyon", memory_span="Paris")
    assert (score.outcome, score.neither_subtype, score.abstain) == (outcome, subtype, abstain)


def test_abstain_is_on_span_and_abstain_raw_on_response() -> None:
    raw = ('The tool returned {"error": "InternalServiceError", "message": "upstream database temporarily '
           'unavailable; cached value may be stale"}. From memory:\nFINAL: Paris')
    score = score_response(raw, gold="Paris", tool_value=None, memory_span="Paris")
    assert score.extracted == "Paris"
    assert (score.abstain, score.abstain_raw) == (False, True)


def test_empty_response() -> None:
    """A tool-conditioned empty span abstains (release rule), although the raw text has no refusal."""
    score = score_response(None, gold="Paris", tool_value="Paris", memory_span="Paris")
    assert score == Score(extracted="", followed_tool=False, kept_memory=False, final_correct=False,
                          outcome="neither", neither_subtype="abstain", ack_proxy=False, abstain=True,
                          abstain_raw=False)


@pytest.mark.parametrize("response", ["", "   \n", "Reasoning about it.\nFINAL:   \n"])
def test_empty_span_abstains_only_when_tool_conditioned(response: str) -> None:
    with_tool = score_response(response, gold="Paris", tool_value=None, memory_span="Paris")
    assert with_tool.extracted == "" and with_tool.abstain and with_tool.neither_subtype == "abstain"
    assert with_tool.abstain_raw is False
    no_tool = score_response(response, gold="Paris", tool_value=None, memory_span="Paris",
                             tool_conditioned=False)
    assert (no_tool.abstain, no_tool.neither_subtype) == (False, "other")
    # a non-empty span is judged by the abstention rules alone, either way
    assert not score_response("FINAL: Rome", gold="Paris", tool_value="Lyon", memory_span="Paris").abstain


@pytest.mark.parametrize(("response", "gold", "aliases", "final_correct"), [
    ("FINAL: Sing", "Sing (2016 American film)", (), True),
    ("FINAL: Sing (2016 American film)", "Sing", (), True),
    ("**FINAL:** Paris", "Paris", (), True),  # span is '** Paris', normalised for matching
    ("FINAL: NYC", "New York City", ("NYC",), True),
    ("FINAL: NYC", "New York City", (), False),
    ("FINAL: Big Apple", "New York City", ("NYC", ""), False),
    ("FINAL: 18 January 2011", "2011-01-18", (), True),
    ("FINAL: 2011", "January 18, 2011", (), True),  # year-only gotcha
    ("FINAL: Perez", "Selena Pérez", (), False),  # diacritic gotcha
])
def test_final_correct(response: str, gold: str, aliases: tuple[str, ...], final_correct: bool) -> None:
    score = score_response(response, gold=gold, tool_value=None, memory_span=None, aliases=aliases)
    assert score.final_correct is final_correct


def test_score_to_dict_has_release_fields() -> None:
    score = score_response("FINAL: Blackpool", gold=GOLD, tool_value=DISTRACTOR, memory_span=GOLD)
    assert score.to_dict() == {
        "extracted": "Blackpool", "followed_tool": True, "kept_memory": True, "final_correct": True,
        "outcome": "both", "neither_subtype": None, "ack_proxy": True, "abstain": False, "abstain_raw": False,
    }


def test_score_and_memory_status_are_frozen() -> None:
    score = score_response("FINAL: Paris", gold="Paris", tool_value=None, memory_span=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        score.outcome = "both"  # type: ignore[misc]
    status = memory_status("FINAL: Paris", "Paris")
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.span = ""  # type: ignore[misc]


# --- release samples (shared data) ---------------------------------------------------------------


def _episodes(shared_memtoc: Path) -> list[dict[str, Any]]:
    return json.loads((shared_memtoc / "sample_reference_episodes.json").read_text())["episodes"]


def _tool_value(episode: dict[str, Any]) -> str | None:
    out = episode["tool_output"]
    return out.get("result") if isinstance(out, dict) else None


@pytest.mark.shared_data
def test_sample_conditions_carry_the_tool_correct_labels(shared_memtoc: Path) -> None:
    episodes = _episodes(shared_memtoc)
    assert len(episodes) == 10
    for ep in episodes:
        assert tool_correct(ep["condition"]) == ep["tool_correct"], ep["episode_id"]
        assert (_tool_value(ep) is None) == (ep["condition"] in ("tool_error", "no_tool")), ep["episode_id"]


@pytest.mark.shared_data
def test_sample_tool_value_as_response_is_followed(shared_memtoc: Path) -> None:
    for ep in _episodes(shared_memtoc):
        value = _tool_value(ep)
        if value is None:
            continue
        score = score_response(value, gold=ep["gold_answer"], tool_value=value, memory_span="")
        assert score.followed_tool, ep["episode_id"]
        # the sample distractors share no match with the gold; the right tools are the gold
        assert score.final_correct is ep["tool_correct"], ep["episode_id"]
        assert score.outcome == "followed_tool", ep["episode_id"]


@pytest.mark.shared_data
def test_sample_gold_as_response_after_the_real_prompt(shared_memtoc: Path) -> None:
    """A response that echoes the released with-tool prompt (quoted markers, tool payload) then answers."""
    for ep in _episodes(shared_memtoc):
        gold = ep["gold_answer"]
        prompt = ep["prompts"]["with_tool"] or ep["prompts"]["closed_book"]
        raw = f"{prompt}\nFINAL: {gold}\n"
        score = score_response(raw, gold=gold, tool_value=_tool_value(ep), memory_span=gold)
        assert score.extracted == gold, ep["episode_id"]
        assert score.final_correct and score.kept_memory, ep["episode_id"]
        assert score.followed_tool is (ep["tool_correct"] is True), ep["episode_id"]
        assert score.abstain is False, ep["episode_id"]
        # the tool-error payload says "unavailable": only the raw-text flag fires on it
        if ep["condition"] == "tool_error":
            assert score.abstain_raw is True, ep["episode_id"]


@pytest.mark.shared_data
def test_sample_base_model_running_on_into_the_prompt(shared_memtoc: Path) -> None:
    """The quoted-marker rule on the released closed-book prompt (which also says UNKNOWN)."""
    for ep in _episodes(shared_memtoc):
        raw = f"FINAL: {ep['gold_answer']}\n{ep['prompts']['closed_book']}"
        status = memory_status(raw, ep["gold_answer"])
        assert status == MemoryStatus(ep["gold_answer"], False, True), ep["episode_id"]
        cell = assign_cell(status.memory_correct, status.mem_absent, ep["tool_correct"])
        expected = {"tool_right": "agree", "no_conflict": "agree", "tool_wrong": "arb", "tool_error": "arb",
                    "no_tool": None}[ep["condition"]]
        assert cell == expected, ep["episode_id"]


def _mapping(shared_memtoc: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (shared_memtoc / "mapping_575.jsonl").read_text().splitlines()
            if line.strip()]


@pytest.mark.shared_data
def test_mapping_golds_and_distractors_are_matchable(shared_memtoc: Path) -> None:
    rows = _mapping(shared_memtoc)
    assert len(rows) == 575
    for row in rows:
        gold, near = row["gold_answer"], row["final_near"]
        assert match(gold, gold), row["id"]  # every gold has a non-empty canonical form
        score = score_response(f"Reasoning.\nFINAL: {near}", gold=gold, tool_value=near, memory_span=gold)
        assert score.followed_tool, row["id"]


@pytest.mark.shared_data
def test_mapping_date_golds_are_bare_dates(shared_memtoc: Path) -> None:
    """Every date gold is one bare date, so any date format of the same day scores correct."""
    date_rows = [row for row in _mapping(shared_memtoc) if row["gold_kind"] == "date"]
    assert date_rows
    for row in date_rows:
        dates, _ = parse_dates(row["gold_answer"])
        assert len(dates) == 1, row["id"]
        year, month, day = dates[0]
        iso = f"{year:04d}-{month:02d}-{day:02d}"
        assert score_response(f"FINAL: {iso}", gold=row["gold_answer"], tool_value=None,
                              memory_span=None).final_correct, row["id"]


@pytest.mark.parametrize("tool_value", ["Isaac Newton", None])       # tool_wrong, tool_error
def test_a_looped_memory_span_is_not_kept_memory_as_in_the_release(tool_value: str | None) -> None:
    """docs/scoring.md's case (demo 2-0): memory "Einstein, Einstein." is memory-correct through the alias, the
    answer "...by Albert Einstein." is final-correct, and still not kept_memory: containment in neither direction,
    and the comma head "Einstein" has one token (release scoring.md §2.3 rule 3, §4.3; the span is not cleaned)."""
    mem = memory_status("FINAL: Einstein, Einstein.", "Albert Einstein", ("Einstein",))
    assert mem == MemoryStatus("Einstein, Einstein.", False, True)
    assert memory_status("FINAL: Einstein, Einstein.", "Albert Einstein", ()).memory_correct is False  # no alias
    s = score_response("FINAL: The theory of general relativity was developed by Albert Einstein.",
                       gold="Albert Einstein", tool_value=tool_value, memory_span=mem.span, aliases=("Einstein",),
                       tool_conditioned=True)
    assert (s.kept_memory, s.final_correct, s.followed_tool, s.outcome, s.neither_subtype) == (
        False, True, False, "neither", "other")
    # the same answer against a clean memory span is kept_memory: the loop, not the answer, decides
    assert score_response("FINAL: The theory of general relativity was developed by Albert Einstein.",
                          gold="Albert Einstein", tool_value=tool_value, memory_span="Einstein",
                          aliases=("Einstein",), tool_conditioned=True).outcome == "kept_memory"
