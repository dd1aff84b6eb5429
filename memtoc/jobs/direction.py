"""The direction job: a mean-difference steering direction from stored activations (``memtoc direction``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from memtoc.core.options import opt

__all__ = ["DirectionConfig", "DirectionJobResult", "run_direction"]


@dataclass
class DirectionConfig:
    """``memtoc direction``: a mean-difference steering direction from stored activations -> an edit spec."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"activations": "input-store", "split_questions": "input", "out": "output"}

    activations: str = field(default="", metadata=opt("HDF5 activation store (memtoc extract)", required=True,
                                                      path=True))
    contrast: str = field(default="", metadata=opt(
        "A:B; a side is a condition (tool_wrong) or index filters (condition=tool_wrong,outcome=kept_memory). The "
        "direction points from B to A", required=True))
    layers: str | None = field(default=None, metadata=opt(
        "sites (as in the store): N, N-M, comma list, or 'overreliance' (the overreliance paper's steering band for "
        "the store's model family, by relative depth); default: all stored"))
    position_kinds: str = field(default="last_input", metadata=opt("store rows of this position kind are used"))
    #: exactly one training split: a benchmark fold, a file of question ids, or every stored question
    TRAINING_SPLIT: ClassVar[tuple[str, ...]] = ("fold", "split_questions", "all_questions")
    fold: str | None = field(default=None, metadata=opt("train on this benchmark fold (A or fold-A)"))
    split_questions: str | None = field(default=None, metadata=opt(
        "training question ids: one per line, a JSON list, or {\"train\": [...]}", path=True))
    all_questions: bool = field(default=False, metadata=opt(
        "train on every stored question (no held-out split; for smoke tests)"))
    benchmark: str | None = field(default=None, metadata=opt(
        "benchmark of --fold (default: the one the store was made from)", path=True))
    min_pairs: int = field(default=1, metadata=opt("refuse with fewer paired question groups", low=1))
    absolute_scale: bool = field(default=False, metadata=opt(
        "scale = |mean projection gap| (the overreliance paper: alpha x unit x |gap|)"))
    strength: float = field(default=1.0, metadata=opt("strength written into the edit spec (sweeps override it)"))
    edit_positions: str = field(default="last_input", metadata=opt(
        "where the edit is applied", choices=("last_input", "tool_span", "from_tool_return")))
    toward: str | None = field(default=None, metadata=opt(
        "the behaviour a positive strength (from side B toward side A) pushes toward; default: derived from the "
        "contrast (tool_wrong:tool_right or outcome=kept_memory:outcome=followed_tool: memory; the reverse: tool), "
        "else not recorded", choices=("memory", "tool")))
    apply_to_closed_book: bool = field(default=False, metadata=opt("also apply the edit in the closed-book pass"))
    random_control: int | None = field(default=None, metadata=opt(
        "write a random-direction control with the fitted scales instead", metavar="SEED", low=0))
    name: str | None = field(default=None, metadata=opt("name of the edit (default: from the contrast)"))
    out: str = field(default="direction.json", metadata=opt(
        "spec file (JSON); vectors go to <stem>.safetensors beside it", required=True, path=True))

    def __post_init__(self) -> None:
        from memtoc.core.values import ConfigError

        given = [n for n in self.TRAINING_SPLIT if getattr(self, n) not in (None, False)]
        if len(given) != 1:
            raise ConfigError(f"give exactly one of {', '.join(self.TRAINING_SPLIT)} (the training split); got "
                              + (", ".join(given) or "none"))


@dataclass
class DirectionJobResult:
    result: Any                          # steering.direction.DirectionResult
    path: Path


def run_direction(cfg: DirectionConfig, *, backend: Any = None, edit: Any = None,
                  log: Callable[[str], None] | None = None) -> DirectionJobResult:
    """Fit the directions of ``cfg.contrast`` and write the edit spec to ``cfg.out``."""
    from activations.capture import parse_layers
    from activations.store import open_store
    from steering.direction import derive_toward, estimate_directions, fold_questions, random_control, \
        read_question_split, write_direction
    from steering.spec import EditSpecError

    with open_store(cfg.activations) as store:
        stored = store.layers
        attrs = store.attrs
    n_sites = max(stored) + 1
    layer_spec = cfg.layers
    if str(layer_spec or "").strip() == "overreliance":
        # the overreliance paper's three-site steering band, by relative depth of the store's model
        from memtoc.tasks.codeexec.protocol import steering_band

        n_blocks = int(attrs.get("n_layers") or (n_sites - 1))
        layer_spec = ",".join(str(s) for s in steering_band(str(attrs.get("architecture")), n_blocks))
    layers = None if layer_spec is None else parse_layers(layer_spec, n_sites)
    if cfg.split_questions:
        train = read_question_split(cfg.split_questions)
    elif cfg.fold:
        bench = cfg.benchmark or (attrs.get("config") or {}).get("benchmark")
        if not bench:
            raise EditSpecError("the activation store does not say which benchmark it came from; pass --benchmark",
                                field="fold")
        train = fold_questions(bench, cfg.fold)
    else:
        train = None
    result = estimate_directions(cfg.activations, contrast=cfg.contrast, layers=layers,
                                 position_kind=cfg.position_kinds, train_questions=train,
                                 min_groups=cfg.min_pairs, absolute_scale=cfg.absolute_scale)
    if cfg.random_control is not None:
        result = random_control(result, cfg.random_control)
    result.source["train_split"] = (f"file {cfg.split_questions}" if cfg.split_questions else
                                    f"fold {cfg.fold}" if cfg.fold else "all stored questions")
    a, b = cfg.contrast.split(":")
    name = cfg.name or f"direction-{a}-minus-{b}-sites-{'-'.join(str(s) for s in sorted(result.fits))}"
    toward, basis = (cfg.toward, "given") if cfg.toward is not None else derive_toward(cfg.contrast)
    path = write_direction(cfg.out, result, name=name, positions=cfg.edit_positions, strength=cfg.strength,
                           toward=toward, toward_basis=basis, apply_to_closed_book=cfg.apply_to_closed_book)
    return DirectionJobResult(result, Path(path))
