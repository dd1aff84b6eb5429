"""The built-in edit kinds; importing this package registers them (``steering.registry``).

One module per kind; a new kind is one new module here plus one line below (see ``docs/extending.md``).
"""

from steering.kinds import direction, sae_clamp, function  # noqa: F401  (registration on import)
