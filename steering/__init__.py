"""steering: edits of the residual stream applied by the backend during generation, directions and sweeps.

- ``steering.spec`` -- the edit spec (JSON, ``memtoc-edit-v1``): validation naming file and field, atomic save;
- ``steering.edits`` -- :class:`Edit` (the base of every kind), :class:`BoundEdit`, ``load_edit``; an edit is bound
  to a batch with ``edit.bind(prompts, tool_spans)`` and applied by ``Backend.generate(..., edit=bound)``;
- ``steering.registry`` -- the edit-kind registry (``register_edit_kind``); ``steering.kinds`` -- the built-in
  kinds, one module each: :class:`DirectionEdit` (mean-difference steering), :class:`SAEClampEdit` (SpARE
  remove/add clamp), :class:`FunctionEdit` (a Python callable of the hidden state, ``docs/api.md``); adding a
  kind: ``docs/extending.md``;
- ``steering.direction`` -- ``memtoc direction``: within-question mean-difference directions from stored
  activations;
- ``memtoc sweep`` (``memtoc.jobs.sweep``, MemToC's rows in ``memtoc.tasks.memtoc.sweep``): one evaluation per
  strength, flip tables and plots.

The format and semantics are documented in ``docs/steering.md``.
"""

from steering.registry import edit_kinds, register_edit_kind
from steering.spec import EditSpecError, load_spec, save_spec, validate_spec
from steering.edits import BoundEdit, Edit, load_edit
from steering.kinds.direction import DirectionEdit
from steering.kinds.function import FunctionEdit, Positions
from steering.kinds.sae_clamp import SAEClampEdit

__all__ = ["load_edit", "Edit", "BoundEdit", "DirectionEdit", "SAEClampEdit", "FunctionEdit", "Positions",
           "EditSpecError", "load_spec", "save_spec", "validate_spec", "register_edit_kind", "edit_kinds"]
