"""The lens registry: ``--lens NAME[=FILE]`` -> a :class:`Lens` that turns captured states into vectors to decode.

The rank table decodes every lens the same way (``ModelParts.unembed``), so a lens only supplies the transport
``x_s -> t_s`` and states ``needs_artifact`` (it reads a fitted file, loaded once by ``load(parts, sites)``),
``needs_factors`` (the detached-lens factors in the capture), ``reads_capture`` (False: it runs passes of its
own) and ``read(inputs)`` (``{site: [B, d]}`` for a :class:`LensInputs` batch). Lenses register with
``@register_lens("name")`` (``docs/extending.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Sequence, TypeVar

import torch

from memtoc.core.registry import Registry
from probes.model import ModelParts, ProbeError

_LENSES: Registry[type["Lens"]] = Registry("lens")

T = TypeVar("T", bound=type)


@dataclass
class LensInputs:
    """What a lens may read for one batch: the model's parts, the captured forward, and the prompts/backend
    for a lens that runs passes of its own (``reads_capture = False``)."""

    parts: ModelParts
    capture: Any                     # probes.lens.LensCapture after the forward
    sites: Sequence[int]
    backend: Any = None
    prompts: Sequence[str] = ()

    def states(self) -> dict[int, torch.Tensor]:
        """``site -> [B, d]``: the captured states at each row's last position."""
        return {s: self.capture.states[s] for s in self.sites}


class Lens:
    """Base class of every lens; a lens subclasses it and registers with ``@register_lens("name")``."""

    #: set by ``register_lens``
    name: ClassVar[str] = ""
    needs_artifact: ClassVar[bool] = False
    needs_factors: ClassVar[bool] = False
    reads_capture: ClassVar[bool] = True
    #: how to make the artifact (shown when it is missing)
    artifact_hint: ClassVar[str] = ""

    def __init__(self, file: str | None = None) -> None:
        self.file = file

    def load(self, parts: ModelParts, sites: Sequence[int]) -> None:
        """Read the artifact (``self.file``) and refuse one that does not fit the model or the sites; default: none."""

    def preflight(self, n_layers: int | None, d_model: int | None) -> None:
        """Check the artifact from its header alone (no tensors, no model: it runs before the weights load);
        ``n_layers``/``d_model``: the model's shape when known. Default: nothing to check."""

    def read(self, inputs: LensInputs) -> dict[int, torch.Tensor]:
        """``site -> [B, d]`` transported vectors (the identity at the last site: every lens is the logit lens)."""
        raise NotImplementedError

    def artifact_meta(self) -> dict[str, Any] | None:
        """Provenance of the artifact recorded in the rank table's meta (None without one)."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, file={self.file!r})"


def register_lens(name: str, *, replace: bool = False) -> Callable[[T], T]:
    """Class decorator: register a :class:`Lens` subclass as ``--lens name`` (sets ``cls.name``)."""
    if not isinstance(name, str) or not name or "=" in name or "," in name:
        raise ValueError(f"a lens name must be a non-empty string without '=' or ',', got {name!r}")

    def deco(cls: T) -> T:
        if not (isinstance(cls, type) and issubclass(cls, Lens)):
            raise TypeError(f"lens {name!r}: {cls!r} is not a subclass of probes.lenses.Lens")
        _LENSES.add(name, cls, replace=replace)
        cls.name = name
        return cls
    return deco


def unregister_lens(name: str) -> None:
    """Remove a lens (tests that register a toy lens clean up with this)."""
    _LENSES.remove(name)


def lens_names() -> tuple[str, ...]:
    """The registered lens names, in registration order (built-ins first)."""
    return _LENSES.names()


def lens_class(name: str) -> type[Lens]:
    cls = _LENSES.get(name)
    if cls is None:
        raise ProbeError(f"unknown lens {name!r}; choose from {', '.join(lens_names())}")
    return cls


def parse_lens_option(items: str | Iterable[str]) -> list[tuple[str, str | None]]:
    """``NAME[=FILE]`` items (each may be a comma list) -> ``[(name, file or None)]`` in order, one per name.

    The same name twice is kept once; twice with different files is refused."""
    if isinstance(items, str):
        items = [items]
    out: dict[str, str | None] = {}
    for item in items:
        for tok in str(item).split(","):
            tok = tok.strip()
            if not tok:
                continue
            name, _, file = tok.partition("=")
            name, file = name.strip(), (file.strip() or None)
            if not name:
                raise ProbeError(f"--lens {tok!r}: give NAME or NAME=FILE")
            if name in out and file is not None and out[name] not in (None, file):
                raise ProbeError(f"--lens {name} is given two files ({out[name]} and {file})")
            out[name] = file if file is not None else out.get(name)
    return list(out.items())


def make_lenses(requests: Sequence[tuple[str, str | None]], *, default_file: str | None = None) -> list[Lens]:
    """Lens objects for ``(name, file)`` requests; ``default_file`` (``--lens-file``) goes to every lens that needs
    an artifact and names none. Unknown names, missing and superfluous files are refused here (before any model
    work); artifacts are read later by :func:`load_lenses`."""
    classes = [(lens_class(name), file) for name, file in requests]
    out = []
    for cls, file in classes:
        if cls.needs_artifact:
            file = file or default_file or None
            if not file:
                hint = f" ({cls.artifact_hint})" if cls.artifact_hint else ""
                raise ProbeError(f"--lens {cls.name} needs --lens-file FILE or --lens {cls.name}=FILE{hint}")
        elif file:
            raise ProbeError(f"--lens {cls.name}={file}: the {cls.name} lens reads no file")
        out.append(cls(file))
    return out


def load_lenses(lenses: Sequence[Lens], parts: ModelParts, sites: Sequence[int]) -> None:
    """Read and check every lens's artifact against the model and the sites."""
    for lens in lenses:
        lens.load(parts, sites)


def read_all(lenses: Sequence[Lens], inputs: LensInputs) -> dict[str, dict[int, torch.Tensor]]:
    """``name -> site -> [B, d]``: the lenses that read the captured forward first, then those with own passes."""
    ordered = [ln for ln in lenses if ln.reads_capture] + [ln for ln in lenses if not ln.reads_capture]
    return {ln.name: ln.read(inputs) for ln in ordered}


def needs_factors(lenses: Sequence[Lens]) -> bool:
    return any(ln.needs_factors for ln in lenses)
