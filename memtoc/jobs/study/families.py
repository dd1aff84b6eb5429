"""Holm families of a study, declared explicitly.

A family is a named set of contrasts (``<model>/<arm>``). Holm is applied inside each family, separately in
every slice (each formulation and the pooled slice), to the p-values of each Holm metric (by default retention,
the primary metric). Builders are a registry so a new family shape is one entry:

- ``arm``: one family per arm label, across models (e.g. the ``warn`` arm of four models);
- ``model``: one family per model, across its arms;
- ``model×arm`` (also ``model-arm``, ``modelxarm``): one family of every contrast (the paper's 4 models ×
  3 prompts, or model × objective for fine-tuning);
- ``none``: no Holm adjustment.

A user-written family is ``NAME=m/a,m/a;NAME2=...`` or ``@file.json`` holding ``{"NAME": ["m/a", ...]}``.
Contrasts outside every family get no adjusted p.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from memtoc.core.errors import MemtocError
from memtoc.jobs.study.runs import Contrast


class StudyError(MemtocError):
    """A study that cannot be computed as asked (bad family, unknown metric)."""


class FamilyError(StudyError):
    """A Holm family that cannot be built from the study's contrasts."""


Families = dict[str, tuple[str, ...]]


def _by_arm(contrasts: Sequence[Contrast]) -> Families:
    out: dict[str, list[str]] = {}
    for c in contrasts:
        out.setdefault(f"arm:{c.arm}", []).append(c.name)
    return {k: tuple(v) for k, v in out.items()}


def _by_model(contrasts: Sequence[Contrast]) -> Families:
    out: dict[str, list[str]] = {}
    for c in contrasts:
        out.setdefault(f"model:{c.base_run.model_name}", []).append(c.name)
    return {k: tuple(v) for k, v in out.items()}


def _all(contrasts: Sequence[Contrast]) -> Families:
    return {"model×arm": tuple(c.name for c in contrasts)} if contrasts else {}


FAMILY_BUILDERS: dict[str, Callable[[Sequence[Contrast]], Families]] = {
    "arm": _by_arm,
    "model": _by_model,
    "model×arm": _all,
    "none": lambda contrasts: {},
}
_ALIASES = {"model-arm": "model×arm", "modelxarm": "model×arm", "model_x_arm": "model×arm", "model*arm": "model×arm"}


def _parse_custom(spec: str) -> dict[str, list[str]]:
    if spec.startswith("@"):
        path = Path(spec[1:])
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FamilyError(f"{path}: family file not found") from None
        except json.JSONDecodeError as exc:
            raise FamilyError(f"{path}: invalid JSON ({exc.msg})") from None
        if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
            raise FamilyError(f"{path}: expected an object of family name -> list of '<model>/<arm>' members")
        return {str(k): [str(m) for m in v] for k, v in data.items()}
    out: dict[str, list[str]] = {}
    for i, part in enumerate(p for p in spec.split(";") if p.strip()):
        if "=" in part:
            name, members = part.split("=", 1)
        else:
            name, members = f"family{i + 1}", part
        out[name.strip()] = [m.strip() for m in members.split(",") if m.strip()]
    return out


def resolve_families(spec: str, contrasts: Sequence[Contrast]) -> Families:
    """Turn a ``--holm-family`` value into named families of contrast names, validated against the study."""
    key = _ALIASES.get(spec.strip(), spec.strip())
    if key in FAMILY_BUILDERS:
        return FAMILY_BUILDERS[key](contrasts)
    if "/" not in key and not key.startswith("@"):
        raise FamilyError(f"--holm-family {spec!r}: choose {', '.join(FAMILY_BUILDERS)}, or write families as "
                          "NAME=model/arm,model/arm;NAME2=... or @file.json")
    custom = _parse_custom(key)
    known = {c.name for c in contrasts}
    owner: dict[str, str] = {}
    for name, members in custom.items():
        if not members:
            raise FamilyError(f"family {name!r} has no members")
        for m in members:
            if m not in known:
                raise FamilyError(f"family {name!r}: unknown contrast {m!r}; the study has "
                                  f"{', '.join(sorted(known)) or 'no contrasts'}")
            if m in owner:
                raise FamilyError(f"contrast {m!r} is in two families ({owner[m]!r} and {name!r})")
            owner[m] = name
    return {k: tuple(v) for k, v in custom.items()}
