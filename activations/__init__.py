"""activations: read the residual stream at chosen sites and positions and store it in HDF5.

- ``activations.positions`` -- position selectors over a left-padded batch; shared with ``steering``.
- ``activations.capture`` -- the ``ResidualCapture`` option of ``Backend.forward``.
- ``activations.store`` -- the HDF5 store: schema, resumable writer, lazy reader (``open_store``).
- ``activations.batches`` -- what one batch of ``memtoc extract`` captures and writes.

Sites follow ``output_hidden_states`` (0 = embedding output, ``s`` = output of block ``s - 1``), except that the
last site is the raw, pre-norm output of the last block. The schema is documented in ``docs/activations.md``.
"""

from memtoc.core.errors import MemtocError


class ActivationStoreError(MemtocError):
    """An activation job or store that cannot be used as asked (bad selection, foreign store, unwritable path)."""


__all__ = ["ActivationStoreError"]
