"""Checks that run before any weights load and before any output directory is created.

Everything a job can check from files and the model's configuration is checked here first, so a user error
costs a second and one line (exit 2), never a model load, a closed-book pass, or a half-made run directory that
then blocks the corrected command: the model's shape from its config alone (:func:`read_model_shape`), an edit
against it (:func:`check_edit_fits`), and an existing run directory's recorded identity (:func:`check_run_dir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from memtoc.core.errors import RunStoreError


@dataclass(frozen=True)
class ModelShape:
    """What an edit must fit: the residual-stream width and the number of decoder blocks."""

    d_model: int
    n_layers: int
    source: str

    @property
    def n_sites(self) -> int:
        """Sites 0..n_layers: 0 = embedding output, s = output of block s-1."""
        return self.n_layers + 1


def _gguf_shape(path: Path) -> ModelShape | None:
    """Width and depth from the GGUF header alone (``memtoc.backends.preflight``: the ``gguf`` package's reader
    maps every tensor first, about 15 s for the default model on a loaded 2-core machine)."""
    from memtoc.backends.preflight import read_gguf_metadata

    meta = read_gguf_metadata(path)
    arch = meta.get("general.architecture")
    if not arch:
        return None
    width, blocks = meta.get(f"{arch}.embedding_length"), meta.get(f"{arch}.block_count")
    if width is None or blocks is None:
        return None
    return ModelShape(d_model=int(width), n_layers=int(blocks), source=str(path))


def read_model_shape(model: str) -> ModelShape | None:
    """The model's width and depth without loading weights; None when its config cannot be read here.

    A spec that names no model (a typo'd local path) raises the loader's own ``ModelNotAvailableError``.
    """
    from memtoc.backends.models import resolve_model

    src = resolve_model(model)
    try:
        if src.gguf_file:
            return _gguf_shape(Path(src.path) / src.gguf_file)
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(src.path, local_files_only=src.kind != "hub")
    except Exception:  # noqa: BLE001 - unreadable here: the loader reports it, and the post-load checks still run
        return None
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    width = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    blocks = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    if not width or not blocks:
        return None
    return ModelShape(d_model=int(width), n_layers=int(blocks), source=src.path)


def check_edit_fits(edit: Any, shape: ModelShape | None) -> None:
    """Refuse an edit whose sites or vector width do not fit the model (the message names the spec file)."""
    if edit is None or shape is None:
        return
    from steering.spec import EditSpecError

    bad = [s for s in edit.layers if not 0 <= int(s) < shape.n_sites]
    if bad:
        raise EditSpecError(f"site(s) {bad} do not exist: the model has sites 0..{shape.n_sites - 1} (0 = embedding "
                            "output, s = output of block s-1)", path=edit.source, field="layers")
    vectors = getattr(edit, "vectors", None)
    if isinstance(vectors, Mapping) and vectors:
        width = int(next(iter(vectors.values())).numel())
        if width != shape.d_model:
            raise EditSpecError(f"vectors have width {width}, the model's residual stream has {shape.d_model}",
                                path=edit.source, field="vectors")


def check_edit_for_model(edit: Any, model: str) -> None:
    """:func:`check_edit_fits` against the model named by a model spec string (config only, no weights)."""
    if edit is not None:
        check_edit_fits(edit, read_model_shape(model))


def recorded_identity(root: str | Path, name: str = "run.json") -> dict[str, Any] | None:
    """The identity an existing run directory recorded; None when there is none (or it cannot be read here:
    the store reports a corrupt ``run.json`` itself)."""
    path = Path(root) / name
    if not path.is_file():
        return None
    try:
        identity = json.loads(path.read_text(encoding="utf-8")).get("identity")
    except (OSError, ValueError, AttributeError):
        return None
    return identity if isinstance(identity, dict) else None


def check_run_dir(root: str | Path, known: Mapping[str, Any], *, kind: str = "") -> None:
    """Refuse an existing run directory whose recorded identity differs in a field of ``known`` (the fields
    that need no model), with the run store's message, before anything loads or is written."""
    old = recorded_identity(root)
    if old is None:
        return
    diff = sorted(k for k in known if old.get(k) != known[k])
    if diff:
        what = f"a {kind} run" if kind else "a run"
        raise RunStoreError(f"{root} holds {what} made with different settings ({', '.join(diff)}); use another "
                            "--out directory, or delete this one to start over")
