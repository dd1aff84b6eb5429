"""Job configs from keyword values (the Python API, recipes): every value checked by name against the option
table's metadata (:mod:`memtoc.core.options`). A key not given takes the config's default (a protocol-filled
option's default is None: the job fills it). No parser, and nothing heavy: ``mt.compare`` builds its config
through this module without loading torch.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping, Sequence

from memtoc.core.errors import ConfigError, UnknownOptionError
from memtoc.core.options import field_default, option_leaves, piece_type, type_hints


def option_fields(cls: type) -> dict[str, Any]:
    """field name -> :class:`~memtoc.core.options.Leaf` of every option a config class takes (pieces included)."""
    return {leaf.path[-1]: leaf for leaf in option_leaves(cls)}


def _allows_none(leaf: Any) -> bool:
    hint = type_hints(leaf.owner).get(leaf.path[-1])
    return leaf.default is None or hint is type(None) or type(None) in typing.get_args(hint)


def coerce_value(leaf: Any, key: str, value: Any, where: str = "") -> Any:
    """One keyword value as the field holds it, checked: whole numbers for integer options (not ``True``, not
    2.7), numbers for float options, a choice for options with choices, a path for path options, comma lists
    for list-valued text options. The error is one line naming ``key``."""
    import os

    opt, pre, kind = leaf.spec, f"{where}{key}", leaf.spec.parse
    if value is None:
        if _allows_none(leaf):
            return None
        raise ConfigError(f"{pre} cannot be None")
    if opt.negate or opt.off_flag or opt.switch or isinstance(leaf.default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{pre} must be true or false, got {value!r}")
        return value
    if isinstance(value, bool):
        raise ConfigError(f"{pre} takes {'a whole number' if kind is int else 'a value'}, not {value!r}")
    if kind in (int, float):
        text = "a whole number" if kind is int else "a number"
        if isinstance(value, str):
            try:
                value = kind(value)
            except ValueError:
                raise ConfigError(f"{pre} must be {text}, got {value!r}") from None
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int if kind is int else (int, float)):
            raise ConfigError(f"{pre} must be {text}, got {value!r}")
        value = kind(value)
        check_bounds(pre, value, opt)
        return value
    if opt.path or opt.role is not None:
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"{pre} must be a path (str or pathlib.Path), got {type(value).__name__} {value!r}")
        value = os.fspath(value)
    else:
        tuple_valued = isinstance(leaf.default, tuple)
        if isinstance(value, (list, tuple, set, frozenset, range)):
            value = tuple(str(v) for v in value) if tuple_valued else ",".join(str(v) for v in value)
        elif isinstance(value, (int, float)):
            value = str(value)
        if isinstance(value, str) and tuple_valued:
            value = tuple(v.strip() for v in value.split(",") if v.strip())
        if not isinstance(value, (str, tuple)):
            raise ConfigError(f"{pre} must be text, got {type(value).__name__} {value!r}")
        if opt.choices is not None and isinstance(value, str) and value not in opt.choices:
            raise ConfigError(f"{pre} must be one of {', '.join(opt.choices)}; got {value!r}")
    return opt.to_field(value) if opt.to_field is not None and isinstance(value, str) else value


def check_bounds(name: str, value: float, opt: Any) -> None:
    """A number inside its option's declared bounds (and finite): one line naming the option and the value."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} {value!r}: give a finite number")
    low, high = getattr(opt, "low", None), getattr(opt, "high", None)
    show = lambda x: str(int(x)) if float(x).is_integer() else f"{x:g}"  # noqa: E731
    if low is not None and (value <= low if opt.above else value < low):
        raise ConfigError(f"{name} {value!r}: must be {'greater than' if opt.above else 'at least'} {show(low)}")
    if high is not None and value > high:
        raise ConfigError(f"{name} {value!r}: must be at most {show(high)}")


def build_config(cls: type, values: Mapping[str, Any], *, where: str = "", exclude: Sequence[str] = ()) -> Any:
    """Config ``cls`` from keyword values (field names, public names or flags), every value checked by
    :func:`coerce_value`. A value reaches its piece by the option's path (``limit`` sets
    ``selection.limit``). ``exclude``: options refused as unknown besides those the config does not take. An
    unknown key raises :class:`UnknownOptionError` naming it."""
    fields = {k: v for k, v in option_fields(cls).items() if k not in exclude}
    # the command line's own spelling (for its messages), and the public name: the field's, or its switch's
    # (``progress`` of ``--no-progress``)
    alias = {leaf.spec.option_string: name for name, leaf in fields.items() if not leaf.spec.positional}
    publics = {leaf.spec.public: name for name, leaf in fields.items()}
    alias.update(publics)
    unknown = sorted(k for k in values if k not in fields and k not in alias)
    if unknown:
        raise UnknownOptionError(f"{where}unknown option(s) {', '.join(unknown)}; it takes "
                                 f"{', '.join(sorted(publics))}")
    checked: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in values.items():
        name = alias.get(key, key)
        if name in keys:
            raise ConfigError(f"{where}{keys[name]} and {key} set one option: give {fields[name].spec.public} only")
        keys[name] = key
        checked[name] = coerce_value(fields[name], key, value, where)
    tree = nested(cls, checked)
    pieces = {f.name: f for f in dataclasses.fields(cls)}
    kw = {k: replace_nested(field_default(pieces[k]), v) if isinstance(v, Changes) else v for k, v in tree.items()}
    return cls(**kw)


def field_path(cls: type, name: str) -> tuple[str, ...] | None:
    """Where field ``name`` lives in config class ``cls``: ``(name,)`` for its own field, ``(piece, ..., name)``
    for a piece's (``("selection", "limit")``); None when it has no such field."""
    if not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    if any(f.name == name for f in fields):
        return (name,)
    for f in fields:
        sub = piece_type(cls, f)
        path = field_path(sub, name) if sub is not None else None
        if path is not None:
            return (f.name, *path)
    return None


class Changes(dict):
    """Values to set in one piece of a config, by field name (a nested piece's as another ``Changes``)."""


def nested(cls: type, values: Mapping[str, Any]) -> Changes:
    """``values`` by field name (a config's own or a piece's) as :class:`Changes` by each field's path (``limit``
    under ``selection``); AttributeError names a field ``cls`` does not have."""
    tree = Changes()
    for name, value in values.items():
        path = field_path(cls, name)
        if path is None:
            raise AttributeError(f"{cls.__name__} has no field {name!r}")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, Changes())
        node[path[-1]] = value
    return tree


def replace_nested(piece: Any, values: Mapping[str, Any]) -> Any:
    """``piece`` with ``values`` set (``dataclasses.replace``), a :class:`Changes` value setting the fields of the
    piece nested under that name."""
    return dataclasses.replace(piece, **{k: replace_nested(getattr(piece, k), v) if isinstance(v, Changes) else v
                                         for k, v in values.items()})

