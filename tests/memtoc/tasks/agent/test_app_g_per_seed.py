"""App. G's sampled re-run read seed by seed (issue 46 item 6): per-seed arms and auto − guided contrasts with
intervals, then the mean and the sample sd across the seeds (the paper: "Δ -0.732, -0.732, -0.677; mean -0.714,
sd 0.032"), checked against numpy; and the recipe replays the 324-episode set (tool_right and tool_wrong of each
memory-right question: "the 162 question pairs (324 episodes)")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memtoc.tasks.agent.metrics import format_per_seed, summarize_agent

REPO = Path(__file__).resolve().parents[4]


def _recs(n_ep: int, auto_agree: dict[int, int]):
    """Guided agrees everywhere; under auto, seed r agrees on the first auto_agree[r] of the n_ep episodes."""
    out = []
    for rep, k in auto_agree.items():
        for i in range(n_ep):
            ep, q = f"q{i // 2}-{'right' if i % 2 else 'wrong'}", f"q{i // 2}"
            for proto, agree in (("guided", True), ("auto", i < k)):
                out.append({"episode_id": ep, "question_id": q, "repetition": rep, "protocol": proto,
                            "condition": "tool_right" if i % 2 else "tool_wrong",
                            "agreement": agree, "executed": agree, "mechanism": None, "calls": [],
                            "decoding": "sampled"})
    return out


def test_sampled_runs_report_each_seed_then_the_mean_and_sd():
    # Llama-3.1-8B's sampled slice: 127 episodes per seed; auto agrees on 34, 34 and 41 (0.268, 0.268, 0.323)
    recs = _recs(127, {0: 34, 1: 34, 2: 41})
    s = summarize_agent(recs, n_boot=200, seed=0)
    per = s["per_seed"]
    assert [x["repetition"] for x in per["seeds"]] == [0, 1, 2]
    deltas = []
    for x in per["seeds"]:
        (c,) = x["contrasts"]
        assert (c["a"], c["b"], c["n_common"]) == ("guided", "auto", 127)
        assert c["agreement"]["ci_high"] < 0                         # every 95% interval excludes zero
        deltas.append(c["agreement"]["delta"])
    assert deltas == pytest.approx([-93 / 127, -93 / 127, -86 / 127])
    across = per["across_seeds"]["contrasts"]["auto-guided"]["agreement"]
    assert across["mean"] == pytest.approx(float(np.mean(deltas)))
    assert across["sd"] == pytest.approx(float(np.std(deltas, ddof=1)))
    assert round(across["mean"], 3) == -0.714 and round(across["sd"], 3) == 0.032     # App. G's own figures
    auto = per["across_seeds"]["arms"]["auto"]["agreement"]
    assert auto["mean"] == pytest.approx(np.mean([34 / 127, 34 / 127, 41 / 127]))
    text = format_per_seed("m", per)
    assert "Seed (repetition) 2:" in text and "auto-guided Δ agreement: mean -0.714, sd 0.032" in text
    # both conditions replayed: each also read alone (tool_right: where the return and the memory coincide)
    right = {a["protocol"]: a for a in s["by_condition"]["tool_right"]}
    assert right["guided"]["n"] == 3 * 63 and right["auto"]["agreement"]["value"] == pytest.approx(
        sum(1 for k in (34, 34, 41) for i in range(127) if i % 2 and i < k) / (3 * 63))
    # one repetition (greedy): no per-seed block
    assert "per_seed" not in summarize_agent(_recs(6, {0: 2}), n_boot=50)


def test_the_app_g_recipe_replays_both_conditions_of_each_memory_right_question():
    from memtoc.recipes.experiment import load_recipe

    recipe = load_recipe(REPO / "experiments" / "analyses" / "app_g_tool_choice.toml")
    assert set(recipe.defaults["conditions"].split(",")) == {"tool_right", "tool_wrong"}
    sampled = {st.name: st for st in recipe.steps}["sampled"]
    assert sampled.args["repetitions"] == 3 and sampled.args["temperature"] == 0.7
