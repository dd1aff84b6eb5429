"""``--lens jvp``: the plain local Jacobian-vector product ``J_s(x)[T,T] x_s[T]`` (diagnostic; one forward-mode
pass per site, so it does not read the shared captured forward)."""

from __future__ import annotations

import torch

from probes.lens import local_jvp_vectors
from probes.lenses.registry import Lens, LensInputs, register_lens


@register_lens("jvp")
class JVPLens(Lens):
    reads_capture = False

    def read(self, inputs: LensInputs) -> dict[int, torch.Tensor]:
        batch = inputs.backend.encode(list(inputs.prompts))
        return local_jvp_vectors(inputs.parts, batch, inputs.sites)
