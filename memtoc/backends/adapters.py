"""Adapter views and training copies of a loaded model, neither of which ever writes to the shared model.

Both are *structural* copies: new ``nn.Parameter`` objects over the shared model's storage (no weight memory)
with requires-grad flags of their own. :func:`adapter_view` merges a LoRA adapter into real copies of the
weights it targets, equal bit for bit to merging it in place; :func:`frozen_copy` shares and freezes every
weight, so a trainer's optimizer never reaches a shared one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from torch import nn

from memtoc.core.adapter import adapter_dir, apply_adapter
from memtoc.core.errors import MemtocError


def _structural_copy(model: nn.Module, *, clone: set[int] = frozenset(), requires_grad: bool | None = None
                     ) -> nn.Module:
    """A copy of ``model`` sharing every parameter's storage except those whose id is in ``clone`` (copied)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in clone:
            flag = p.requires_grad if requires_grad is None else requires_grad
            memo[id(p)] = nn.Parameter(p.data, requires_grad=flag)
    for b in model.buffers():
        memo[id(b)] = b
    return copy.deepcopy(model, memo)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` for training adapters on: weights shared with ``model`` and frozen."""
    return _structural_copy(model, requires_grad=False)


def adapter_view(model: nn.Module, path: str | Path) -> nn.Module:
    """``model`` with the LoRA adapter at ``path`` merged in, as a new module tree; ``model`` is not modified."""
    p = adapter_dir(path)
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MemtocError("adapters need peft: pip install 'peft>=0.17' (or the interp extra)") from exc
    from peft.tuners.tuners_utils import check_target_module_exists

    config = peft.PeftConfig.from_pretrained(str(p))
    saved = set(getattr(config, "modules_to_save", None) or ())
    clone: set[int] = set()
    for name, module in model.named_modules():
        if not name:
            continue
        if check_target_module_exists(config, name) or name.split(".")[-1] in saved:
            clone.update(id(q) for q in module.parameters())
    return apply_adapter(_structural_copy(model, clone=clone), p)
