"""``--lens jacobian=FILE``: ``t = Jbar_s x_s[T]`` with the averaged Jacobians fitted by ``memtoc lens fit``."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from probes.lens import JacobianLens
from probes.lenses.registry import Lens, LensInputs, register_lens
from probes.model import ModelParts, ProbeError

#: the fit's provenance recorded in the rank table's meta
META_KEYS = ("corpus", "corpus_sha256", "n_sequences", "max_seq_len", "skip_first", "model_fingerprint")


@register_lens("jacobian")
class JacobianTransportLens(Lens):
    needs_artifact = True
    artifact_hint = "fit one with: memtoc lens fit --model MODEL --out lens.safetensors"

    def load(self, parts: ModelParts, sites: Sequence[int]) -> None:
        self.artifact = JacobianLens.load(self.file, parts=parts)
        L = parts.n_layers
        missing = [s for s in sites if s != L and s not in self.artifact.matrices]
        if missing:
            raise ProbeError(f"{self.file} has no matrices for sites {missing} (it covers {self.artifact.sites}); "
                             "refit with --layers covering the band, or choose --layers inside it")

    def preflight(self, n_layers: int | None, d_model: int | None) -> None:
        from probes.lens import check_lens_header

        check_lens_header(self.file, n_layers=n_layers, d_model=d_model)

    def read(self, inputs: LensInputs) -> dict[int, torch.Tensor]:
        L = inputs.parts.n_layers
        return {s: self.artifact.transport(s, x, L) for s, x in inputs.states().items()}

    def artifact_meta(self) -> dict[str, Any]:
        return {k: self.artifact.meta.get(k) for k in META_KEYS}
