"""``memtoc finetune crossfit``'s config from its generated command line: the training options reach the adapter's
TrainConfig, the record in crossfit.json keeps its keys, the executor is checked before any work, and the paper
protocol fills only the evaluation options the user did not type (None, not "differs from the default")."""

from __future__ import annotations

import dataclasses

import pytest

from memtoc.cli.parse import parse_config
from memtoc.jobs.finetune.crossfit import CrossfitConfig, _eval_cfg, run_crossfit
from memtoc.jobs.finetune.lora import LoraSettings
from memtoc.jobs.finetune.train import TrainConfig


def _cfg(*argv: str) -> CrossfitConfig:
    return parse_config(["finetune", "crossfit", "--out", "o", *argv])[1]


def test_training_options_make_the_adapters_train_config() -> None:
    cfg = _cfg("--r", "8", "--alpha", "16", "--lora-dropout", "0.05", "--targets", "q,v", "--target-modules",
               "q_proj,v_proj", "--lr", "2e-4", "--epochs", "2", "--beta", "0.2", "--train-batch-size", "2",
               "--micro-batch-size", "1", "--max-length", "512", "--save-every", "5", "--gradient-checkpointing",
               "--train-seed", "3")
    want = TrainConfig(objective="sft", lora=LoraSettings(r=8, alpha=16, dropout=0.05, targets=("q", "v"),
                                                          target_modules=("q_proj", "v_proj")),
                       lr=2e-4, epochs=2, beta=0.2, batch_size=2, micro_batch_size=1, max_length=512, seed=3,
                       save_every=5, gradient_checkpointing=True)
    assert cfg.train == want
    assert _cfg().train == TrainConfig() == CrossfitConfig().train      # the defaults are the paper's
    assert CrossfitConfig(train=want).train is want                     # a whole TrainConfig (Python) is kept


def test_the_crossfit_record_keeps_its_keys() -> None:
    """crossfit.json's ``config``: the pieces' fields flat, the job's own fields, ``train`` whole; neither the
    training options one by one nor the executor settings."""
    from memtoc.core.config import EpisodeSelection, Intervention, JobSettings, ModelSpec
    from memtoc.core.runtime import GenerationConfig

    pieces = (ModelSpec, EpisodeSelection, Intervention, GenerationConfig, JobSettings)
    want = {f.name for p in pieces for f in dataclasses.fields(p)} | {
        "objective", "train", "fold_pool", "train_formulations", "protocol"}
    record = _cfg("--r", "4", "--executor", "local").to_dict()
    assert set(record) == want
    assert record["train"] == TrainConfig(lora=LoraSettings(r=4)).to_dict()


def test_the_executor_is_checked_before_any_work(tmp_path) -> None:
    from memtoc.jobs.executor import ExecutorError

    with pytest.raises(ExecutorError, match="--executor must be one of"):
        run_crossfit(_cfg("--executor", "nope", "--benchmark", str(tmp_path / "missing")))
    with pytest.raises(ExecutorError, match="--address .* needs --executor ray"):
        run_crossfit(_cfg("--address", "x:1", "--benchmark", str(tmp_path / "missing")))


def test_the_paper_protocol_keeps_an_explicitly_typed_default(tmp_path) -> None:
    """``--protocol paper --max-new-tokens 128`` keeps 128 (the default value, typed); without it the paper's
    512: an option not typed is None (not given), which the job resolves, not "differs from the default"."""
    from memtoc.core.runtime import GenerationConfig
    from memtoc.tasks.memtoc.evaluation import resolve_protocol

    assert _cfg("--protocol", "paper").generation.max_new_tokens is None
    typed = _eval_cfg(resolve_protocol(_cfg("--protocol", "paper", "--max-new-tokens", "128")), tmp_path / "a")
    left = _eval_cfg(resolve_protocol(_cfg("--protocol", "paper")), tmp_path / "b")
    assert typed.generation.max_new_tokens == 128 == GenerationConfig().max_new_tokens
    assert left.generation.max_new_tokens == 512 and left.selection.formulations == "all"
    assert left.generation.stop_at_final_line is False
    assert typed.selection.question_set == left.selection.question_set == "all"    # the cross-fit decides them
