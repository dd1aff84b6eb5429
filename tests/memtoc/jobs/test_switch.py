"""Switch compositions (paper Appendix E) on constructed records: which arm answers each episode under each gate,
the composed run's metric rows (computed by hand), the refusals, and the ``memtoc switch`` command."""

from __future__ import annotations

import json

import pytest

from memtoc.cli import main as run_command
from memtoc.scoring.metrics import metric_table
from memtoc.bench.offline import score_record
from memtoc.runs.runstore import RunStore
from memtoc.jobs.switch import SwitchError, compose_switch, composition_metrics

# (question, gold, near distractor, closed-book answer)
QUESTIONS = [("Capital of France?", "Paris", "Lyon", "Paris"),       # memory right
             ("Capital of Italy?", "Rome", "Milan", "Rome"),          # memory right
             ("Capital of Spain?", "Madrid", "Seville", "Porto"),     # memory wrong (both_wrong under tool_wrong)
             ("Capital of Peru?", "Lima", "Cusco", "Cusco")]          # memory wrong, equal to the tool value


def _rec(i: int, condition: str, response: str) -> dict:
    q, gold, near, mem = QUESTIONS[i]
    tool_value = {"tool_wrong": near, "tool_right": gold}.get(condition)
    r = score_record({"question": q, "gold_answer": gold, "condition": condition, "response": response,
                      "memory_answer": f"FINAL: {mem}", "tool_value": tool_value, "question_id": f"q{i}"})
    r["episode_id"] = f"q{i}-{condition}"
    return r


def _arm(follow: bool) -> list[dict]:
    """An arm that follows the tool (standard) or keeps its closed-book answer (knob) everywhere."""
    out = []
    for i, (_q, gold, near, mem) in enumerate(QUESTIONS):
        out.append(_rec(i, "tool_wrong", f"FINAL: {near if follow else mem}"))
        out.append(_rec(i, "tool_right", f"FINAL: {gold if follow else mem}"))
        out.append(_rec(i, "tool_error", "FINAL: UNKNOWN" if follow else f"FINAL: {mem}"))
    return out


def _fired(records: list[dict]) -> dict[str, bool]:
    return {r["episode_id"]: r["switch_fired"] for r in records}


def test_oracle_gate_fires_exactly_where_the_tool_value_is_wrong():
    comp = compose_switch(_arm(True), _arm(False), "oracle", knob_label="source-priority")
    fired = _fired(comp.records)
    assert {e for e, f in fired.items() if f} == {f"q{i}-tool_wrong" for i in range(4)}
    assert comp.n_fired == 4 and comp.n_dropped_base == comp.n_dropped_knob == 0
    for r in comp.records:
        assert r["switch_source"] == ("source-priority" if r["switch_fired"] else "base")
        assert r["switch_gate"] == "oracle"


def test_observable_gate_fires_where_memory_disagrees_with_the_tool():
    comp = compose_switch(_arm(True), _arm(False), "observable")
    fired = {e for e, f in _fired(comp.records).items() if f}
    # q0/q1 tool_wrong: memory right vs wrong tool; q2 tool_wrong: Porto vs Seville; q2 tool_right: Porto vs
    # Madrid. q3: memory equals the wrong tool value (its blind spot); tool_error has no tool value; agree never.
    assert fired == {"q0-tool_wrong", "q1-tool_wrong", "q2-tool_wrong", "q2-tool_right", "q3-tool_right"}
    agree = [r for r in comp.records if r["condition"] == "tool_right" and r["cell"] == "agree"]
    assert agree and not any(r["switch_fired"] for r in agree)


def test_composed_metric_rows_match_hand_counts():
    comp = compose_switch(_arm(True), _arm(False), "observable")
    table = metric_table(comp.records, metrics=composition_metrics(), n_boot=10)
    cell = table["retention"].per_formulation["reference"]          # arb = q0, q1: both answered by the knob
    assert (cell.k, cell.n) == (2, 2)
    cell = table["switch_false_fire_agree"].per_formulation["reference"]   # agree = q0, q1 tool_right
    assert (cell.k, cell.n) == (0, 2)
    cell = table["switch_fire_conflict"].per_formulation["reference"]  # arb q0, q1 + both_wrong q2, q3
    assert (cell.k, cell.n) == (3, 4)
    cell = table["correct_tool_following"].per_formulation["reference"]  # tool_gold: q2, q3 tool_right
    assert (cell.k, cell.n) == (0, 2)                                   # both fired: the knob kept memory
    base = metric_table(_arm(True), n_boot=10)
    assert base["retention"].per_formulation["reference"].k == 0


def test_refuses_arms_with_different_closed_book_answers_naming_the_field():
    knob = _arm(False)
    knob[0] = {**knob[0], "memory_span": "Marseille"}
    with pytest.raises(SwitchError, match=r"q0-tool_wrong.*'memory_span'"):
        compose_switch(_arm(True), knob, "oracle")
    with pytest.raises(SwitchError, match="unknown switch gate"):
        compose_switch(_arm(True), _arm(False), "psychic")
    with pytest.raises(SwitchError, match="no episode in common"):
        compose_switch(_arm(True), [{**r, "episode_id": "x" + r["episode_id"]} for r in _arm(False)], "oracle")


def _write_run(root, records, intervention):
    store = RunStore.open(root, identity={"model": "m", "weights_sha256": "w", "closed_book": "forced",
                                          "frame": "tool-no-schema", "prompt_intervention": intervention},
                          run_info={"status": "running"})
    store.episodes.append(records)
    store.update_run_info(status="complete")
    store.close()


def test_switch_command_writes_a_run_that_compare_reads(tmp_path, capsys):
    _write_run(tmp_path / "std", _arm(True), "none")
    _write_run(tmp_path / "knob", _arm(False), "source-priority")
    out = tmp_path / "switch"
    assert run_command(["switch", str(tmp_path / "std"), str(tmp_path / "knob"), "--gate", "oracle", "--out",
                        str(out), "--n-boot", "10"]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["identity"]["prompt_intervention"] == "switch:oracle:source-priority"
    assert info["composed_from"]["n_fired"] == 4 and info["status"] == "complete"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["metrics"]["retention"]["per_formulation"]["reference"]["k"] == 2
    # the composed arm is a run like any other: compare reads it against the standard arm
    assert run_command(["compare", str(tmp_path / "std"), str(out)]) == 0
    # again: same identity, resumed; another model's knob is refused naming the field
    assert run_command(["switch", str(tmp_path / "std"), str(tmp_path / "knob"), "--gate", "oracle", "--out",
                        str(out), "--n-boot", "10"]) == 0
    other = tmp_path / "other"
    store = RunStore.open(other, identity={"model": "m2", "weights_sha256": "w", "closed_book": "forced",
                                           "frame": "tool-no-schema"}, run_info={"status": "complete"})
    store.episodes.append(_arm(False))
    store.close()
    capsys.readouterr()
    assert run_command(["switch", str(tmp_path / "std"), str(other), "--gate", "oracle", "--out",
                        str(tmp_path / "s2")]) == 2
    assert "identity.model" in capsys.readouterr().err
