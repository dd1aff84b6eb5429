"""The fine-tuning jobs ``memtoc finetune data|train|table`` (``crossfit``: :mod:`memtoc.jobs.finetune.crossfit`): their
configs, whose fields are the commands' options, and their ``run_<job>`` functions.

The training options (:class:`TrainSettings`) are one piece, shared by ``finetune train`` and ``finetune crossfit``.
This module is read to build the command line, so it imports neither torch nor peft until a job runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt, option

__all__ = ["TrainSettings", "FinetuneDataConfig", "FinetuneTrainConfig", "FinetuneTableConfig", "run_finetune_data",
           "run_finetune_train", "run_finetune_table"]

def _csv_or_none(value: Any) -> tuple[str, ...] | None:
    """``--target-modules a,b``: the suffixes as a tuple; empty: None (found from ``--targets``)."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    return tuple(t.strip() for t in items if t.strip()) or None


@dataclass(frozen=True)
class TrainSettings:
    """Training (paper defaults: r=16 on q/k/v/o, alpha 32, lr 1e-5, 1 epoch, beta 0.1).

    The training options of ``finetune train`` and ``finetune crossfit``, as the command line names them;
    :meth:`train_config` gives the adapter's :class:`~memtoc.jobs.finetune.train_config.TrainConfig`."""

    r: int = field(default=16, metadata=opt("LoRA rank", low=1))
    alpha: int = field(default=32, metadata=opt("LoRA alpha"))
    lora_dropout: float = field(default=0.0, metadata=opt("LoRA dropout", low=0, high=0.99))
    targets: tuple[str, ...] = field(default=("q", "k", "v", "o"), metadata=opt(
        "attention projections to adapt (found by name suffix)"))
    target_modules: tuple[str, ...] | None = field(default=None, metadata=opt(
        "explicit module-name suffixes (overrides --targets)", to_field=_csv_or_none))
    lr: float = field(default=1e-5, metadata=opt("learning rate", low=0, above=True))
    epochs: int = field(default=1, metadata=opt("passes over the training examples", low=1))
    beta: float = field(default=0.1, metadata=opt("DPO beta"))
    train_batch_size: int = field(default=4, metadata=opt(
        "examples (SFT) or pairs (DPO) per step (paper silent; ours: 4)"))
    lr_schedule: str = field(default="linear", metadata=opt(
        "learning-rate schedule: linear (decay to 0, no warm-up: the transformers Trainer's default, App. B) or "
        "constant", choices=("linear", "constant")))
    micro_batch_size: int | None = field(default=None, metadata=opt(
        "gradient accumulation: rows per forward"))
    max_length: int = field(default=2048, metadata=opt("refuse (never truncate) longer examples"))
    save_every: int = field(default=25, metadata=opt("checkpoint every N optimizer steps"))
    gradient_checkpointing: bool = field(default=False, metadata=opt("for 7-9B models on one GPU"))
    train_seed: int = field(default=0, metadata=opt("LoRA init and data order"))

    def __post_init__(self) -> None:
        """Values no training can run with, refused when the options are read (before any model loads), in one
        line naming the option."""
        from memtoc.core.checks import OptionValueError, check_int
        from memtoc.jobs import is_finite

        for flag, value in (("--epochs", self.epochs), ("--train-batch-size", self.train_batch_size),
                            ("--max-length", self.max_length), ("--save-every", self.save_every),
                            ("--r", self.r)):
            check_int(value, flag)
        if self.micro_batch_size is not None:
            check_int(self.micro_batch_size, "--micro-batch-size")
        for flag, value in (("--lr", self.lr), ("--beta", self.beta)):
            if not is_finite(value) or value <= 0:
                raise OptionValueError(f"{flag} {value!r}: must be a finite number above 0")

    def train_config(self, objective: str) -> Any:
        from memtoc.jobs.finetune.lora import LoraSettings
        from memtoc.jobs.finetune.train_config import TrainConfig

        lora = LoraSettings(r=self.r, alpha=self.alpha, dropout=self.lora_dropout, targets=tuple(self.targets),
                            target_modules=self.target_modules)
        return TrainConfig(objective=objective, lora=lora, lr=self.lr, epochs=self.epochs, beta=self.beta,
                           batch_size=self.train_batch_size, micro_batch_size=self.micro_batch_size,
                           max_length=self.max_length, seed=self.train_seed, save_every=self.save_every,
                           lr_schedule=self.lr_schedule,
                           gradient_checkpointing=self.gradient_checkpointing)


#: the fine-tuning jobs' wording of the model options
TRAINING_PROMPTS_HELP = "comma list or all (training prompts)"
TRAINING_DTYPE_HELP = "auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16"


@dataclass
class FinetuneDataConfig:
    """``memtoc finetune data``: preference / SFT pairs (tool_wrong and tool_right, near distractors)."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"out": "output"}

    model: str = field(default="default", metadata=option("model"))
    benchmark: str = field(default="demo", metadata=option("benchmark"))
    formulations: str = field(default="reference", metadata=option("formulations", help=TRAINING_PROMPTS_HELP))
    frame: str = field(default="auto", metadata=option("frame"))
    limit: int | None = field(default=None, metadata=option("limit"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="auto", metadata=option("dtype", help=TRAINING_DTYPE_HELP))
    fold: str | None = field(default=None, metadata=opt("only this fold's questions (e.g. A)"))
    out: str = field(default="pairs.jsonl", metadata=opt(
        "pairs .jsonl (a .meta.json with the hash is written beside it)", required=True, path=True))


def _pairs(cfg: Any, format_prompt: Any) -> Any:
    """The pair set of ``cfg``'s questions (its fold, its first ``limit``), prompts formatted by ``format_prompt``."""
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import parse_formulations
    from memtoc.jobs.finetune.data import build_pairs, make_pair_set

    bench = load_benchmark(cfg.benchmark)
    qs = bench.select("all" if not cfg.fold else f"fold-{cfg.fold}", None)
    if cfg.limit is not None:
        selected = {q.id for q in bench.select("all", cfg.limit)}
        qs = [q for q in qs if q.id in selected]
    if not qs:
        raise MemtocError("no questions selected")
    frame = bench.default_frame if cfg.frame == "auto" else cfg.frame
    forms = parse_formulations(cfg.formulations)
    return make_pair_set(build_pairs(qs, format_prompt, formulations=forms, frame=frame), benchmark=bench.name,
                         benchmark_files=bench.files, fold=cfg.fold, frame=frame, formulations=list(forms),
                         limit=cfg.limit)


@dataclass
class PairsResult:
    pair_set: Any          # memtoc.jobs.finetune.data.PairSet
    path: Path


def run_finetune_data(cfg: FinetuneDataConfig) -> PairsResult:
    """The pairs, with prompts formatted by the model's tokenizer alone (no weights loaded), written to ``out``."""
    from transformers import AutoTokenizer

    from memtoc.backends.chat import format_user_prompt, uses_chat_template
    from memtoc.backends.models import resolve_model
    from memtoc.jobs.finetune.data import write_pair_set

    src = resolve_model(cfg.model)
    kw: dict[str, Any] = {"local_files_only": src.local}
    if src.gguf_file:
        kw["gguf_file"] = src.gguf_file
    tok = AutoTokenizer.from_pretrained(src.path, **kw)
    chat = uses_chat_template(tok)
    # The same function HFBackend.format_prompt calls, without loading the weights.
    ps = _pairs(cfg, lambda p: format_user_prompt(tok, p, chat=chat))
    return PairsResult(ps, write_pair_set(cfg.out, ps))


@dataclass
class FinetuneTrainConfig:
    """``memtoc finetune train``: one LoRA adapter (SFT or DPO), resumable."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"pairs": "input", "out": "output-dir"}

    model: str = field(default="default", metadata=option("model"))
    benchmark: str = field(default="demo", metadata=option("benchmark"))
    formulations: str = field(default="reference", metadata=option("formulations", help=TRAINING_PROMPTS_HELP))
    frame: str = field(default="auto", metadata=option("frame"))
    limit: int | None = field(default=None, metadata=option("limit"))
    device: str = field(default="auto", metadata=option("device"))
    dtype: str = field(default="auto", metadata=option("dtype", help=TRAINING_DTYPE_HELP))
    training: TrainSettings = field(default_factory=TrainSettings)
    objective: str = field(default="sft", metadata=opt("sft (supervised) or dpo (preference pairs)",
                                                       choices=("sft", "dpo"), required=True))
    fold: str | None = field(default=None, metadata=opt("train on this fold's questions (e.g. A)"))
    pairs: str | None = field(default=None, metadata=opt("a pairs file from 'finetune data' instead of building them",
                                                         path=True))
    stop_after: int | None = field(default=None, metadata=opt("stop after N total steps (checkpointed)"))
    out: str = field(default="adapter", metadata=opt("adapter directory", required=True, path=True))


def run_finetune_train(cfg: FinetuneTrainConfig) -> Any:
    """Train (or resume) the adapter into ``out``; returns :class:`~memtoc.jobs.finetune.train.TrainResult`."""
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec
    from memtoc.jobs.finetune.data import read_pair_set
    from memtoc.jobs.finetune.train import train_adapter

    tcfg = cfg.training.train_config(cfg.objective)
    backend = load_backend(ModelSpec(model=cfg.model, backend="hf", device=cfg.device, dtype=cfg.dtype))
    ps = read_pair_set(cfg.pairs) if cfg.pairs else _pairs(cfg, backend.format_prompt)
    return train_adapter(ps, backend, cfg.out, tcfg, stop_after=cfg.stop_after)


@dataclass
class FinetuneTableConfig:
    """``memtoc finetune table``: paired changes vs base: prompting, SFT, DPO, best steering edit."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"base": "input-run", "sft": "input-path", "dpo": "input-path",
        "prompt": "input-run", "steer": "input-run", "out": "output"}

    base: str = field(default="", metadata=opt("untreated run directory", required=True, path=True))
    sft: tuple[str, ...] = field(default=(), metadata=opt("SFT arm (crossfit OUT/arms/sft or a run directory)",
                                                          repeat=True))
    dpo: tuple[str, ...] = field(default=(), metadata=opt("DPO arm", repeat=True))
    prompt: tuple[str, ...] = field(default=(), metadata=opt("prompting run (evaluate --prompt-intervention)",
                                                             repeat=True))
    steer: tuple[str, ...] = field(default=(), metadata=opt("steering run (evaluate --edit); repeat: the best is "
                                                            "kept", repeat=True))
    seed: int = field(default=0, metadata=option("seed"))
    out: str | None = field(default=None, metadata=opt("write OUT.md and OUT.json", path=True))


@dataclass
class TableResult:
    table: Any             # memtoc.jobs.finetune.table.SideBySide
    files: dict[str, Path] | None


def run_finetune_table(cfg: FinetuneTableConfig) -> TableResult:
    """The side-by-side table of the arms against base (written to ``OUT.md`` / ``OUT.json`` when ``out``)."""
    from memtoc.jobs.finetune.table import read_arm, side_by_side, write_table
    from memtoc.runs.runstore import RunStore

    arms = [read_arm(kind, path) for kind in ("prompt", "sft", "dpo", "steer") for path in getattr(cfg, kind)]
    table = side_by_side(RunStore.read(cfg.base).episodes.records(), arms, seed=cfg.seed)
    return TableResult(table, write_table(table, cfg.out) if cfg.out else None)
