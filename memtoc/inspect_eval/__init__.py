"""MemToC as an Inspect task (``inspect eval memtoc/memtoc``): an adapter over the evaluation's own pieces.

The package registers :mod:`memtoc.inspect_eval.task` as its Inspect entry point (``pyproject.toml``'s
``[project.entry-points.inspect_ai]``). Only the modules that need Inspect import it (``task``, ``solver``,
``scorer``), so ``import memtoc`` and every other command work without the ``[inspect]`` extra. See
docs/inspect.md.
"""
