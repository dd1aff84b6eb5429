"""The settings of one adapter's training (:class:`TrainConfig`), apart from the trainer.

The cross-fit job's config holds one, so it lives where importing it loads no torch: ``memtoc finetune crossfit
--help`` reads the config's type hints, and the trainer (:mod:`memtoc.jobs.finetune.train`) imports torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memtoc.core.errors import MemtocError
from memtoc.jobs.finetune.lora import LoraSettings

__all__ = ["LR_SCHEDULES", "OBJECTIVES", "TrainConfig", "lr_at"]

OBJECTIVES = ("sft", "dpo")
#: App. B trains with "the transformers Trainer", whose default schedule is linear decay to 0 with no warm-up
#: (``lr_scheduler_type="linear"``, ``warmup_steps=0``); ``constant`` keeps the learning rate fixed
LR_SCHEDULES = ("linear", "constant")


def lr_at(lr: float, schedule: str, step: int, total: int) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total``: the Trainer's linear decay gives step
    s the rate ``lr * (total - s) / total`` (transformers' ``get_linear_schedule_with_warmup`` with no warm-up)."""
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr * max(0.0, (total - step) / max(1, total))
    raise MemtocError(f"unknown learning-rate schedule {schedule!r}; choose {' or '.join(LR_SCHEDULES)}")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one adapter. Everything but ``save_every`` is part of the adapter's identity."""

    objective: str = "sft"
    lora: LoraSettings = field(default_factory=LoraSettings)
    lr: float = 1e-5
    epochs: int = 1
    beta: float = 0.1
    batch_size: int = 4                 # examples (SFT) or pairs (DPO) per optimizer step
    micro_batch_size: int | None = None  # split a step into micro-batches (gradient accumulation); None: whole
    weight_decay: float = 0.0
    lr_schedule: str = "linear"
    max_length: int = 2048
    seed: int = 0
    save_every: int = 25
    gradient_checkpointing: bool = False

    def validate(self) -> None:
        if self.objective not in OBJECTIVES:
            raise MemtocError(f"unknown objective {self.objective!r}; choose sft or dpo")
        for name in ("epochs", "batch_size", "save_every", "max_length"):
            if getattr(self, name) < 1:
                raise MemtocError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise MemtocError(f"micro_batch_size must be at least 1, got {self.micro_batch_size}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise MemtocError(f"unknown learning-rate schedule {self.lr_schedule!r}; choose "
                              f"{' or '.join(LR_SCHEDULES)}")
        if self.lr <= 0 or self.beta <= 0:
            raise MemtocError("lr and beta must be positive")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora"] = self.lora.to_dict()
        return d

    def identity(self) -> dict[str, Any]:
        d = self.to_dict()
        d.pop("save_every")
        return d

    def matched(self, objective: str) -> "TrainConfig":
        """The same settings for the other objective (matched SFT/DPO arms)."""
        from dataclasses import replace

        return replace(self, objective=objective)
