"""steering: edits of the residual stream applied by the backend during generation, directions and sweeps.

- ``steering.spec`` -- the edit spec (JSON, ``memtoc-edit-v1``): validation naming file and field, atomic save;
- ``steering.edits`` -- :class:`Edit` (the base of every kind), :class:`BoundEdit`, ``load_edit``;
- ``steering.registry`` / ``steering.kinds`` -- the edit-kind registry and the built-in kinds
  (:class:`DirectionEdit`, :class:`SAEClampEdit`, :class:`FunctionEdit`; adding one: ``docs/extending.md``);
- ``steering.direction`` -- ``memtoc direction``: within-question mean-difference directions.

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
