"""LoRA settings and where the adapters go: the attention projections, found by module-name suffix.

Architectures name their projections differently (``q_proj`` in Llama/Mistral/Qwen/Gemma, ``query``/``value``
in BERT-style blocks, ``wq``/``wo`` in some ports, ``out_proj``/``dense`` for the output). Rather than a table
per model class, every ``nn.Linear`` is matched by the last component of its name against the suffix lists
below, so a new architecture with conventional names needs no code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from memtoc.core.errors import MemtocError

if TYPE_CHECKING:  # torch in annotations only: LoraSettings is part of job configs, read by --help
    import torch

#: Projection kind -> accepted last name components (first match per kind wins, in this order).
ATTENTION_SUFFIXES: dict[str, tuple[str, ...]] = {
    "q": ("q_proj", "query", "wq", "q"),
    "k": ("k_proj", "key", "wk", "k"),
    "v": ("v_proj", "value", "wv", "v"),
    "o": ("o_proj", "out_proj", "wo", "dense", "o"),
}


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA configuration (paper defaults: r=16 on q/k/v/o, alpha 32, no dropout).

    The paper names r, alpha and the target projections, not dropout; 0 keeps each step deterministic, which
    is what lets a resumed run equal an uninterrupted one.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q", "k", "v", "o")
    target_modules: tuple[str, ...] | None = None   # explicit suffixes; None: found from ``targets``

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["targets"] = list(self.targets)
        d["target_modules"] = None if self.target_modules is None else list(self.target_modules)
        return d


def _in_attention(name: str) -> bool:
    parts = name.lower().split(".")[:-1]
    return any("attn" in p or "attention" in p for p in parts)


def find_target_modules(model: torch.nn.Module, targets: tuple[str, ...] = ("q", "k", "v", "o")) -> list[str]:
    """Name suffixes of the linear attention projections of ``targets`` kinds present in ``model``.

    Only linear modules under a module whose name contains ``attn``/``attention`` count for the short
    suffixes, so an MLP's ``dense`` is never picked up. Raises when a requested kind is absent.
    """
    from torch import nn

    linear_names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    found: list[str] = []
    for kind in targets:
        if kind not in ATTENTION_SUFFIXES:
            raise MemtocError(f"unknown LoRA target {kind!r}; choose from {', '.join(ATTENTION_SUFFIXES)}")
        hit = next((suffix for suffix in ATTENTION_SUFFIXES[kind]      # the first accepted name present wins
                    if any(n.split(".")[-1] == suffix and _in_attention(n) for n in linear_names)), None)
        if hit is None:
            raise MemtocError(f"no linear attention projection of kind {kind!r} found (looked for "
                              f"{', '.join(ATTENTION_SUFFIXES[kind])}); pass explicit target modules")
        found.append(hit)
    return found


def lora_config(model: torch.nn.Module, settings: LoraSettings) -> Any:
    """A ``peft.LoraConfig`` for a causal LM, targets resolved on ``model`` (regex-free suffix match)."""
    from peft import LoraConfig

    modules = list(settings.target_modules) if settings.target_modules else find_target_modules(model,
                                                                                                settings.targets)
    return LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=modules, bias="none", task_type="CAUSAL_LM")
