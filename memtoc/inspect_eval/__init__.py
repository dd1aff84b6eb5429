"""MemToC as an Inspect task (``inspect eval memtoc/memtoc``): an adapter over the evaluation's own pieces.

The package registers :mod:`memtoc.inspect_eval.task` as its Inspect entry point (``pyproject.toml``'s
``[project.entry-points.inspect_ai]``). Only the modules that need Inspect import it (``task``, ``solver``,
``scorer``), so ``import memtoc`` and every other command work without the ``[inspect]`` extra. See
docs/inspect.md.
"""

import importlib.util as _util

#: the modules that import ``inspect_ai`` (the ``[inspect]`` extra) at the top
NEEDS_INSPECT: tuple[str, ...] = ("memtoc.inspect_eval.task", "memtoc.inspect_eval.solver",
                                  "memtoc.inspect_eval.scorer")

# the submodules there are to document and import here: those of the extra only where it is installed
__all__ = ["NEEDS_INSPECT", "plan",
           *(m.rpartition(".")[2] for m in NEEDS_INSPECT if _util.find_spec("inspect_ai") is not None)]
