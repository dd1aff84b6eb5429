"""``--lens detached``: ``t = J^det_s[T,T] x_s[T]`` from the frozen sub-block factors of the one captured forward."""

from __future__ import annotations

import torch

from probes.lens import detached_chain
from probes.lenses.registry import Lens, LensInputs, register_lens
from probes.model import ProbeError


@register_lens("detached")
class DetachedLens(Lens):
    needs_factors = True

    def read(self, inputs: LensInputs) -> dict[int, torch.Tensor]:
        cap, L = inputs.capture, inputs.parts.n_layers
        if not cap.factors:
            raise ProbeError("the detached lens needs a capture made with detached=True")
        return {s: x if s == L else detached_chain(inputs.parts, cap.factors, cap.states, s, x)
                for s, x in inputs.states().items()}
