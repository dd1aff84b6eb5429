"""Holm families of a study, declared explicitly.

A family is a named set of contrasts (``<model>/<arm>``). Holm is applied inside each family, separately in
every slice (each formulation and the pooled slice), to the p-values of each Holm metric (by default retention,
the primary metric). Builders are a registry so a new family shape is one entry:

- ``arm``: one family per arm label, across models (e.g. the ``warn`` arm of four models);
- ``model``: one family per model, across its arms;
- ``model×arm`` (also ``model-arm``, ``modelxarm``): one family of every contrast (the paper's 4 models ×
  3 prompts, or model × objective for fine-tuning);
- ``none``: no Holm adjustment.

The paper's own families are declared once, in :data:`DECLARED_FAMILIES` (``docs/statistics.md`` lists their
members); a declared paired family takes its members from the study's contrasts by arm label. A user-written
family is ``NAME=m/a,m/a;NAME2=...`` or ``@file.json``; contrasts outside every family get no adjusted p.

A declared family with members missing is refused (its Holm would run over fewer contrasts than the paper's and
give smaller p values) unless it is asked for as partial by name (``--partial-family B``, reported "3 of 12").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from memtoc.core.errors import MemtocError
from memtoc.jobs.study.runs import Contrast


class StudyError(MemtocError):
    """A study that cannot be computed as asked (bad family, unknown metric)."""


class FamilyError(StudyError):
    """A Holm family that cannot be built from the study's contrasts."""


Families = dict[str, tuple[str, ...]]


def _grouped(key: Callable[[Contrast], str]) -> Callable[[Sequence[Contrast]], Families]:
    """A builder of one family per value of ``key`` (the arm label, the model)."""
    def build(contrasts: Sequence[Contrast]) -> Families:
        out: dict[str, list[str]] = {}
        for c in contrasts:
            out.setdefault(key(c), []).append(c.name)
        return {k: tuple(v) for k, v in out.items()}

    return build


def _all(contrasts: Sequence[Contrast]) -> Families:
    return {"model×arm": tuple(c.name for c in contrasts)} if contrasts else {}


FAMILY_BUILDERS: dict[str, Callable[[Sequence[Contrast]], Families]] = {
    "arm": _grouped(lambda c: f"arm:{c.arm}"),
    "model": _grouped(lambda c: f"model:{c.base_run.model_name}"),
    "model×arm": _all,
    "none": lambda contrasts: {},
}
_ALIASES = {"model-arm": "model×arm", "modelxarm": "model×arm", "model_x_arm": "model×arm", "model*arm": "model×arm"}


@dataclass(frozen=True)
class DeclaredFamily:
    """A Holm family the paper (or its release) declares: which table it adjusts, its members, where it is stated.

    ``table``: ``paired`` (the study's arm-vs-base contrasts, members chosen by arm label), ``model_pairs`` (the
    paired base-vs-instruct contrasts of ``--model-pair``), ``ztests`` (unpaired cross-model z tests), or
    ``overreliance`` (the Code Executor policy contrasts). ``arms`` maps each member arm to the labels it may be
    written as. ``size`` is the member count in the paper's full study; ``draws`` (n_boot, n_perm, seed) where
    the paper states them for this family.
    """

    name: str
    table: str
    members: str
    source: str
    arms: tuple[tuple[str, ...], ...] = ()
    size: int | None = None
    draws: tuple[int, int, int] | None = None

    def arm_labels(self) -> dict[str, str]:
        """Every accepted arm label -> the member arm it names."""
        return {label: labels[0] for labels in self.arms for label in labels}


#: The paper's Holm families, in one place. Holm runs inside each family separately in every slice.
DECLARED_FAMILIES: dict[str, DeclaredFamily] = {f.name: f for f in (
    DeclaredFamily(
        "B", "paired", "4 instruction-tuned models x {warn, source-priority, abstain-and-flag}, per slice; "
        "the pooled slice is Table 4's pooled family (12 members)",
        "Table 4 caption (paired changes and Holm tests pooled over the three formulations); App. E / §5.4 "
        "('eleven of twelve pooled comparisons are Holm-significant'); release family B (scoring.md §11)",
        arms=(("warn",), ("source-priority", "prior", "source_priority"),
              ("abstain-and-flag", "flag", "abstain_and_flag")), size=12),
    DeclaredFamily(
        "finetune", "paired", "4 instruction-tuned models x {SFT, DPO}, per slice (8 members)",
        "Table 5 caption ('Holm correction inside each slice's own family'); §5.2 model x objective; the "
        "membership (Table 5's eight arm rows as one family): paper silent; ours",
        arms=(("sft",), ("dpo",)), size=8),
    DeclaredFamily(
        "T3", "paired", "the two further training seeds (42, 20260719) x the two anchors that meet the criterion "
        "(Llama-Instruct, gemma), per slice (4 members)",
        "App. E seed robustness ('all four additional arms are Holm-significant at p 0.0004 within family T3')",
        arms=(("seed42", "dpo-seed42", "sft-seed42"), ("seed20260719", "dpo-seed20260719", "sft-seed20260719")),
        size=4),
    DeclaredFamily(
        "A", "paired", "5 models x {toolns, ragsnip} presentation frames, per slice (10 members)",
        "§5.4 presentation format; release family A (scoring.md §11)",
        arms=(("toolns", "tool-no-schema"), ("ragsnip", "passage")), size=10),
    DeclaredFamily(
        "reverse-transfer", "paired", "the two anchors (Llama-3.1-8B-Instruct, gemma-2-9b-it) x the DPO adapter "
        "trained on FaithEval/ARC rows only, evaluated on the MemToC benchmark set, per slice (2 members)",
        "§5.4 reverse transfer ('raise retention on the untouched MemToC set for gemma-2-9b-it by 4.6 points (Holm "
        "p<0.001) [...] Llama-3.1-8B-Instruct (1.2 points, Holm p=0.35)'); App. F.1 (Holm p 0.0008, n = 158); "
        "the two anchors as the family: ours (the paper names no members)",
        arms=(("reverse-dpo", "faitheval-arc-dpo"),), size=2),
    DeclaredFamily(
        "C", "model_pairs", "the base model vs each instruction-tuned model, paired on the intersection of the two "
        "models' cells (the --model-pair pairs), per formulation; no pooled slice (the base model is pv0 only)",
        "App. B (pairwise common-support tests for the preregistered base-versus-instruct contrasts); release "
        "family C", size=4),
    DeclaredFamily(
        "z-planned", "ztests", "keepQ retention, the base model vs each instruction-tuned model (the --model-pair "
        "pairs), unpaired two-proportion z tests per formulation (4 members)",
        "App. E ('per-cell two-proportion family (planned, Holm-corrected)', Holm p 0.0007 / 0.017 / 0.041 / "
        "0.129); release 'planned family keepQ base vs each instruct (4 pairs)'", size=4),
    DeclaredFamily(
        "z-all-pairs", "ztests", "every pair of the study's models, per arm, metric and formulation (10 members "
        "with 5 models)", "release 'prior_bw all 10 model pairs; keepQ all 10 pairs'", size=10),
    DeclaredFamily(
        "overreliance-policy", "overreliance", "the policy contrasts of one tool (42 per tool: each policy arm vs "
        "Plain on each metric and condition), Holm inside each tool",
        "overreliance paper seed 002 L117 (10,000 resamples, 20,000 permutations, seed 20260918, Holm over 42 "
        "contrasts per tool)", size=42, draws=(10000, 20000, 20260918)),
)}
#: declared paired families by the names a study accepts
PAIRED_FAMILIES = tuple(n for n, f in DECLARED_FAMILIES.items() if f.table == "paired")


def declared_family(name: str, table: str | None = None) -> DeclaredFamily:
    """The declared family ``name`` (of ``table`` when given); an undeclared one is a one-line error."""
    fam = DECLARED_FAMILIES.get(name)
    if fam is None or (table is not None and fam.table != table):
        names = [n for n, f in DECLARED_FAMILIES.items() if table is None or f.table == table]
        raise FamilyError(f"family {name!r} is not declared{f' for the {table} table' if table else ''}; "
                          f"declared: {', '.join(names)}")
    return fam


def _declared_members(fam: DeclaredFamily, contrasts: Sequence[Contrast], partial: Sequence[str] = ()
                      ) -> Families:
    labels = fam.arm_labels()
    members = tuple(c.name for c in contrasts if c.arm in labels)
    if not members:
        raise FamilyError(f"family {fam.name!r} ({fam.members}) has no member in this study: it needs arms "
                          f"labelled {', '.join(a[0] for a in fam.arms)}; the study has "
                          f"{', '.join(sorted({c.arm for c in contrasts})) or 'no arms'}")
    if fam.size is not None and len(members) < fam.size and fam.name not in partial:
        raise FamilyError(f"family {fam.name!r} has {len(members)} of its {fam.size} declared members in this study "
                          f"({fam.members}): its Holm p values would be smaller than the paper's; compute it whole "
                          "over every model's runs (memtoc study --experiment DIR ...), or ask for the partial "
                          f"family by name (--partial-family {fam.name})")
    return {fam.name: members}


def family_sizes(families: Families, partial: Sequence[str] = ()) -> dict[str, dict[str, object]]:
    """Each declared family of a study: members present, the declared size, and whether it is partial."""
    out: dict[str, dict[str, object]] = {}
    for name, members in families.items():
        fam = DECLARED_FAMILIES.get(name)
        if fam is None or fam.size is None:
            continue
        out[name] = {"present": len(members), "declared": fam.size,
                     "partial": len(members) < fam.size, "asked_partial": name in partial}
    return out


def size_line(name: str, size: dict[str, object]) -> str:
    """``family B: 3 of 12 declared members (partial, asked for by name)``."""
    tail = (" (partial, asked for by name)" if size["partial"] else "")
    return f"family {name}: {size['present']} of {size['declared']} declared members{tail}"


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


def resolve_families(spec: str, contrasts: Sequence[Contrast], partial: Sequence[str] = ()) -> Families:
    """Turn a ``--holm-family`` value into named families of contrast names, validated against the study.
    ``partial``: declared families that may be computed with members missing (asked for by name)."""
    key = _ALIASES.get(spec.strip(), spec.strip())
    for name in partial:
        if name not in DECLARED_FAMILIES:
            raise FamilyError(f"--partial-family {name!r} is not a declared family; declared: "
                              f"{', '.join(DECLARED_FAMILIES)}")
    if key in FAMILY_BUILDERS:
        return FAMILY_BUILDERS[key](contrasts)
    if key in DECLARED_FAMILIES:
        return _declared_members(declared_family(key, "paired"), contrasts, partial)
    if "/" not in key and not key.startswith("@"):
        raise FamilyError(f"--holm-family {spec!r} is not declared: choose a paper family "
                          f"({', '.join(PAIRED_FAMILIES)}), a shape ({', '.join(FAMILY_BUILDERS)}), or write "
                          "families as NAME=model/arm,model/arm;NAME2=... or @file.json")
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
