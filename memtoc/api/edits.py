"""Edits from Python objects: a callable of the hidden state, or a plain tensor direction.

Both return edits of registered kinds (``steering.registry``), so ``evaluate(edit=...)`` and ``sweep(edit=...)``
run them through the same hooks, KV-cache plan, row compaction and scorer as a spec file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence


def _layers(layers: int | Sequence[int]) -> list[int]:
    return [int(layers)] if isinstance(layers, int) else [int(s) for s in layers]


def function_edit(fn: Callable[..., Any], *, layers: int | Sequence[int], positions: str = "last_input",
                  strength: float = 1.0, name: str | None = None, toward: str | None = None,
                  apply_to_closed_book: bool = False) -> Any:
    """An edit of kind ``function``: ``fn(site, hidden, positions) -> hidden`` at the edited positions.

    ``hidden`` is ``[n, d_model]`` (the edited positions of one forward chunk), ``positions`` a
    ``steering.Positions`` (``rows``, ``cols`` of those positions in the chunk). ``strength`` scales the
    change, ``h + strength * (fn(h) - h)`` (1: ``fn(h)``; 0: untouched). ``toward`` ("memory" | "tool") lets
    :func:`memtoc.sweep` steer it. The run identity records the sha256 of ``fn``'s source (``docs/api.md``:
    weaker provenance than a spec file).
    """
    from steering.kinds.function import FunctionEdit

    return FunctionEdit.build(fn, layers=_layers(layers), positions=positions, strength=strength, name=name,
                              toward=toward, apply_to_closed_book=apply_to_closed_book)


def vector_edit(vectors: Any, *, layers: int | Sequence[int] | None = None, positions: str = "last_input",
                strength: float = 1.0, name: str = "vector", toward: str = "memory",
                apply_to_closed_book: bool = False) -> Any:
    """A ``direction`` edit adding ``strength * v`` at each site: ``vectors`` is one ``[d_model]`` tensor (used at
    every site of ``layers``) or ``{site: tensor}``.

    Stored as the direction kind stores it (unit vector and its norm as ``scale``), so it can be saved as a
    spec file (``steering.kinds.direction.save_direction_edit``) and swept like a fitted direction.
    """
    import torch

    from steering.kinds.direction import DirectionEdit

    if isinstance(vectors, Mapping):
        vecs = {int(s): torch.as_tensor(v, dtype=torch.float32).reshape(-1) for s, v in vectors.items()}
        sites = sorted(vecs) if layers is None else _layers(layers)
    else:
        if layers is None:
            from memtoc.core.errors import MemtocError

            raise MemtocError("vector_edit needs layers= when given one vector (or pass {site: vector})")
        sites = _layers(layers)
        v = torch.as_tensor(vectors, dtype=torch.float32).reshape(-1)
        vecs = {s: v for s in sites}
    norms = {s: float(vecs[s].norm()) for s in sites}
    units = {s: vecs[s] / norms[s] if norms[s] > 0 else vecs[s] for s in sites}
    return DirectionEdit.build(name=name, layers=sites, vectors=units, scale=norms, positions=positions,
                               strength=strength, toward=toward, apply_to_closed_book=apply_to_closed_book)


def load_edit(path: str | Path) -> Any:
    """An edit spec file, read and validated as ``--edit`` reads it."""
    from steering import load_edit as load

    return load(path)
