"""``memtoc finetune data`` and ``finetune train`` (interrupted, then resumed) from the command line."""

from __future__ import annotations

import json

import torch

from memtoc.bench.benchmark import load_benchmark
from memtoc.cli import main
from memtoc.jobs.finetune.data import read_pair_set

torch.set_num_threads(1)


def test_data_then_train_resumes_from_the_command_line(tiny_model_dir, tiny_backend, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    assert main(["finetune", "data", "--model", str(tiny_model_dir), "--fold", "A", "--limit", "6",
                 "--out", str(pairs)]) == 0
    ps = read_pair_set(pairs)
    bench = load_benchmark("demo")
    ids_a = {q.id for q in bench.fold("A")}
    fold_a = [q for q in bench.select("all", 6) if q.id in ids_a]
    assert len(fold_a) == 3 and len(ps.pairs) == 6 and ps.question_ids == [q.id for q in fold_a]
    # the tokenizer-only path formats prompts exactly as the backend does
    assert all(p.prompt == tiny_backend.format_prompt(p.user_prompt) for p in ps.pairs)
    args = ["finetune", "train", "--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
            "--pairs", str(pairs), "--objective", "dpo", "--train-batch-size", "2", "--save-every", "1",
            "--out", str(tmp_path / "adapter")]
    assert main(args + ["--stop-after", "1"]) == 0
    assert "stopped at 1/3" in capsys.readouterr().out
    assert main(args) == 0
    assert "adapter complete" in capsys.readouterr().out
    meta = json.loads((tmp_path / "adapter" / "memtoc_adapter.json").read_text())
    assert meta["resumed_from_step"] == 1 and meta["steps"] == 3 and meta["data"]["sha256"] == ps.sha256
    assert meta["train_config"]["beta"] == 0.1 and meta["train_config"]["lora"]["r"] == 16


def test_crossfit_refuses_a_fold_question_set(tmp_path, capsys):
    assert main(["finetune", "crossfit", "--limit", "4", "--question-set", "all", "--objective", "sft",
                 "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    capsys.readouterr()
    assert main(["finetune", "crossfit", "--question-set", "fold-A", "--out", str(tmp_path / "o")]) == 2
    assert "--question-set must be one of all, analysis; got 'fold-A'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
