"""activations: read the residual stream at chosen sites and positions and store it in HDF5.

- ``activations.positions`` -- position selectors (``last_input``, ``tool_span``, ``from_tool_return``,
  ``all``, ``generated``) over a left-padded batch, found through the tokenizer's offset mapping; shared with
  ``steering``.
- ``activations.capture`` -- the ``ResidualCapture`` option of ``Backend.forward`` (hooks installed by the one
  registrar, ``memtoc.backends.hooks``; sites numbered and parsed by ``memtoc.backends.parts``).
- ``activations.store`` -- the HDF5 store: schema, resumable writer, lazy reader (``open_store``).
- ``activations.batches`` -- what one batch of ``memtoc extract`` captures and writes (the job itself is
  ``memtoc.jobs.extract``).

Site numbering follows ``output_hidden_states``: site 0 is the embedding output (the residual stream entering
block 0), site ``s >= 1`` the output of block ``s - 1``. Unlike ``hidden_states[L]`` the last site is the raw,
pre-norm output of the last block. The schema is documented in ``docs/activations.md``.
"""

from memtoc.core.errors import MemtocError


class ActivationStoreError(MemtocError):
    """An activation job or store that cannot be used as asked (bad selection, foreign store, unwritable path)."""


__all__ = ["ActivationStoreError"]
