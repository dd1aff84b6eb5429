"""App. D's comparison of the two closed-book protocols (issue 46 item 7): the permissive UNKNOWN rate ("declines
104 of 107 pilot questions") and the agreement between the protocols on shared questions (0.60-0.90), on
constructed closed-book records."""

from __future__ import annotations

import json

import pytest

from memtoc.cli import main
from memtoc.runs.runstore import RunStore
from memtoc.scoring.score import memory_status


def _run(root, answers: dict[str, str], gold: dict[str, str]):
    cbs = []
    for q, span in answers.items():
        mem = memory_status(span, gold[q], [])
        cbs.append({"key": f"{q}|reference", "question_id": q, "formulation": "reference", "memory_span": mem.span,
                    "mem_absent": mem.mem_absent, "memory_correct": mem.memory_correct})
    store = RunStore.open(root, identity={"model": "m"}, run_info={"config": {"model": "m"}})
    store.closed_book.append(cbs)
    return str(root)


def test_unknown_rate_and_agreement_of_forced_vs_permissive(tmp_path, capsys):
    gold = {f"q{i}": f"Answer{i}" for i in range(10)}
    # forced: right on q0-q5, a wrong guess elsewhere; permissive: UNKNOWN on q6-q9 (and q5), on the rest the
    # same answer as forced except q4 (another wrong answer) -> 4 of 5 answered shared questions agree
    forced = {q: (g if int(q[1:]) < 6 else "Guess") for q, g in gold.items()}
    permissive = {q: ("UNKNOWN" if int(q[1:]) >= 5 else forced[q]) for q in gold}
    permissive["q4"] = "Other"
    permissive.pop("q0")                                   # not elicited: outside the shared questions
    f, p = _run(tmp_path / "forced", forced, gold), _run(tmp_path / "permissive", permissive, gold)
    out = tmp_path / "agree"
    assert main(["elicitation-agreement", "--forced", f, "--permissive", p, "--label", "Qwen",
                 "--out", str(out)]) == 0
    t = json.loads((out / "elicitation_agreement.json").read_text())
    assert t["unknown"] == {"k": 5, "n": 9, "rate": pytest.approx(5 / 9)}
    assert t["n_shared"] == 9
    assert t["agreement"] == {"k": 3, "n": 4, "rate": pytest.approx(0.75)}      # q1-q3 agree, q4 does not
    assert t["correctness_agreement"]["k"] == 3                                 # q4: right (forced) vs wrong
    assert "| Qwen | 0.556 (5/9) | 0.750 (3/4) |" in capsys.readouterr().out


def test_the_permissive_recipe_computes_the_agreement():
    from pathlib import Path

    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[3] / "experiments" / "analyses"
                         / "permissive_sensitivity.toml")
    (step,) = [st for st in recipe.steps if st.command == ["elicitation-agreement"]]
    assert step.args == {"forced": "${forced}", "permissive": "${permissive}"}
