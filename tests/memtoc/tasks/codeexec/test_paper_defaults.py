"""Defaults as the papers state them: Code Executor intervals 2,000 item-bootstrap resamples
(overreliance seed 002 L111), App. G's B = 2,000, and the primary adapters' seed 20260705 (MemToC App. E) in
every recipe that trains one."""

from __future__ import annotations

from pathlib import Path

from memtoc.recipes.experiment import load_recipe

REPO = Path(__file__).resolve().parents[4]


def test_code_executor_intervals_use_2000_draws():
    from memtoc.tasks.codeexec.metrics import MetricsConfig
    from memtoc.tasks.codeexec.run import CodeexecRunConfig

    assert MetricsConfig().n_boot == 2000
    assert CodeexecRunConfig().job.n_boot == 2000


def test_app_g_agent_intervals_use_b_2000():
    from memtoc.tasks.agent.task import AgentRunConfig

    assert AgentRunConfig().job.n_boot == 2000


def test_recipes_train_the_primary_adapters_with_seed_20260705():
    for rel in ("experiments/paper/table1_finetuning.toml", "experiments/transfer.toml"):
        recipe = load_recipe(REPO / rel)
        train = [st for st in recipe.steps if st.command[0] == "finetune" and st.command[1] in ("train", "crossfit")]
        assert train, rel
        assert all(st.args.get("train_seed") == 20260705 for st in train), rel
