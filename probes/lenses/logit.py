"""``--lens logit``: the identity transport ``t = x_s[T]`` (the baseline; always part of the rank table)."""

from __future__ import annotations

import torch

from probes.lenses.registry import Lens, LensInputs, register_lens


@register_lens("logit")
class LogitLens(Lens):
    def read(self, inputs: LensInputs) -> dict[int, torch.Tensor]:
        return inputs.states()
