"""The direction job: a mean-difference steering direction from stored activations (``memtoc direction``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["DirectionConfig", "DirectionJobResult", "run_direction"]


@dataclass
class DirectionConfig:
    activations: str = ""
    contrast: str = ""                   # A:B; the direction points from B to A
    out: str = "direction.json"          # spec file; vectors go to <stem>.safetensors beside it
    layers: str | None = None            # default: every stored site; 'overreliance': the paper's band
    position_kind: str = "last_input"
    split_questions: str | None = None   # exactly one training split: a file of question ids,
    fold: str | None = None              # ... a benchmark fold,
    all_questions: bool = False          # ... or every stored question
    benchmark: str | None = None         # benchmark of ``fold`` (default: the store's)
    min_pairs: int = 1
    absolute_scale: bool = False
    strength: float = 1.0
    positions: str = "last_input"        # where the edit is applied
    toward: str = "memory"
    apply_to_closed_book: bool = False
    random_control: int | None = None
    name: str | None = None


@dataclass
class DirectionJobResult:
    result: Any                          # steering.direction.DirectionResult
    path: Path


def run_direction(cfg: DirectionConfig, *, backend: Any = None, edit: Any = None,
                  log: Callable[[str], None] | None = None) -> DirectionJobResult:
    """Fit the directions of ``cfg.contrast`` and write the edit spec to ``cfg.out``."""
    from activations.capture import parse_layers
    from activations.store import open_store
    from steering.direction import estimate_directions, fold_questions, random_control, read_question_split, \
        write_direction
    from steering.spec import EditSpecError

    if sum(x is not None and x is not False for x in (cfg.fold, cfg.split_questions, cfg.all_questions or None)) != 1:
        raise EditSpecError("direction needs exactly one training split: fold, split_questions or all_questions")
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
                                 position_kind=cfg.position_kind, train_questions=train,
                                 min_groups=cfg.min_pairs, absolute_scale=cfg.absolute_scale)
    if cfg.random_control is not None:
        result = random_control(result, cfg.random_control)
    result.source["train_split"] = (f"file {cfg.split_questions}" if cfg.split_questions else
                                    f"fold {cfg.fold}" if cfg.fold else "all stored questions")
    a, b = cfg.contrast.split(":")
    name = cfg.name or f"direction-{a}-minus-{b}-sites-{'-'.join(str(s) for s in sorted(result.fits))}"
    path = write_direction(cfg.out, result, name=name, positions=cfg.positions, strength=cfg.strength,
                           toward=cfg.toward, apply_to_closed_book=cfg.apply_to_closed_book)
    return DirectionJobResult(result, Path(path))
