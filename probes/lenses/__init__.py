"""Lenses as a registry (``--lens NAME[=FILE]``): the base class, registration and the built-in lenses.

The built-in lenses (``logit``, ``jacobian``, ``detached``, ``jvp``; definitions in ``probes.lens`` and
``docs/probes.md``) are one module each below and register on import. A new lens is one new module plus one
import line here (``docs/extending.md``).
"""

from probes.lenses.registry import (Lens, LensInputs, lens_class, lens_names, load_lenses, make_lenses,
                                    parse_lens_option, read_all, register_lens, unregister_lens)
from probes.lenses import logit, jacobian, detached, jvp  # noqa: F401,E402  (registration on import)

__all__ = ["Lens", "LensInputs", "register_lens", "unregister_lens", "lens_names", "lens_class",
           "parse_lens_option", "make_lenses", "load_lenses", "read_all"]
