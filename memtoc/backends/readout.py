"""The readout of a model without its module tree: final norm and output head, loaded on their own.

A backend that runs the model elsewhere (vLLM) captures states, which lenses decode with the model's own final
norm and head. Those are loaded from the checkpoint the engine serves into a weightless skeleton on the meta
device (so the norm is the architecture's own class), reading only their tensors; the skeleton's parameter
names let a fitted lens's weights fingerprint be recomputed from the checkpoint on demand
(:func:`checkpoint_fingerprint`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from memtoc.backends.parts import ModelParts, params_fingerprint
from memtoc.core.errors import MemtocError


class ReadoutError(MemtocError):
    """The readout of a model cannot be loaded from its checkpoint (the message names the directory)."""


class CheckpointTensors:
    """Name -> tensor of a local safetensors checkpoint directory (every ``*.safetensors`` file, read lazily)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            self.where = {k: self.dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            from safetensors import safe_open

            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise ReadoutError(f"{self.dir}: no safetensors checkpoint to read the final norm and output head "
                                   "from (the lens readout on this backend needs a local safetensors model)")
            self.where = {}
            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    self.where.update({k: f for k in fh.keys()})

    def get(self, *names: str) -> torch.Tensor:
        """The first of ``names`` the checkpoint holds (a tied weight is saved under one of its names)."""
        from safetensors import safe_open

        for name in names:
            if name in self.where:
                with safe_open(str(self.where[name]), framework="pt") as fh:
                    return fh.get_tensor(name)
        raise ReadoutError(f"{self.dir}: the checkpoint has no tensor {' / '.join(names)}")


def _aliases(model: nn.Module) -> dict[int, list[str]]:
    """id(parameter) -> every name it has in ``model`` (tied weights have several)."""
    out: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(name)
    return out


def _materialize(module: nn.Module, aliases: dict[int, list[str]], tensors: CheckpointTensors,
                 dtype: torch.dtype) -> None:
    """Give a meta-device module its weights from the checkpoint (in place)."""
    names = {pname: aliases[id(p)] for pname, p in module.named_parameters()}
    module.to_empty(device="cpu")
    for pname, p in module.named_parameters():
        value = tensors.get(*names[pname])
        if tuple(value.shape) != tuple(p.shape):
            raise ReadoutError(f"{tensors.dir}: tensor {names[pname][0]} has shape {tuple(value.shape)}, the model "
                               f"config says {tuple(p.shape)}")
        p.data = value.to(dtype)
        p.requires_grad_(False)


def parameter_names(model: nn.Module) -> list[list[str]]:
    """Every parameter of ``model`` once (tied weights once, as ``named_parameters`` lists them), each with all
    its names, the listed one first."""
    aliases = _aliases(model)
    return [[name, *(a for a in aliases[id(p)] if a != name)] for name, p in model.named_parameters()]


def checkpoint_fingerprint(names: list[list[str]], tensors: CheckpointTensors) -> str:
    """``params_fingerprint`` of the checkpoint's tensors under the model's own parameter names (``names`` from
    :func:`parameter_names` of the skeleton): what ``probes.model.model_fingerprint`` gives for the same weights
    loaded by transformers. Reads one tensor at a time."""
    def named() -> Iterator[tuple[str, torch.Tensor]]:
        for alias in names:
            yield alias[0], tensors.get(*alias)

    return params_fingerprint(named())


def load_readout(model_dir: str | Path, *, n_vocab: int, dtype: torch.dtype = torch.float32,
                 n_layers: int | None = None) -> ModelParts:
    """Readout-only :class:`ModelParts` of the checkpoint in ``model_dir``: final norm and head with their weights
    (in ``dtype``, on the CPU), the rest a weightless skeleton; ``n_layers`` (the engine's) is checked against it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ReadoutError(f"{model_dir}: cannot read the model config for the lens readout ({exc})") from None
    if hasattr(config, "quantization_config"):
        raise ReadoutError(f"{model_dir}: a quantized checkpoint; the lens readout reads plain weights")
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parts = ModelParts.of(skeleton, n_vocab)
    if n_layers is not None and parts.n_layers != int(n_layers):
        raise ReadoutError(f"{model_dir}: the config has {parts.n_layers} blocks, the engine runs {n_layers}")
    tensors = CheckpointTensors(model_dir)
    aliases = _aliases(skeleton)
    names = parameter_names(skeleton)            # before any weight is materialized (which unties the head)
    for module in (parts.final_norm, parts.lm_head):
        _materialize(module, aliases, tensors, dtype)
    parts.readout_only = True
    parts.fingerprint_of = lru_cache(maxsize=1)(lambda: checkpoint_fingerprint(names, tensors))
    return parts
