"""The MemToC paper's study protocol as data (``memtoc/data/paper_protocol.json``): per-family layer bands for the
SAE steering probe (App. C) and the Jacobian-lens rank table (App. H), the steering defaults (budget, strengths,
dev-set size, FVU gate, flip bar) and the paper's reported numbers, printed beside a user's.

Why data: the bands are facts about the paper's models and dictionaries, not logic; adding a family is an edit of
the JSON file. Bands are written in the paper's *block* numbering (``blocks.L.hook_resid_post`` = output of block
L); the toolkit's site is ``L + 1`` (site 0 = embedding output). On a model whose depth differs from the paper's
model of that family, each block is rescaled by depth (``docs/sae_mining.md``, "Paper protocol").
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from memtoc.core.errors import MemtocError

PAPER_KEYWORD = "paper"


class ProtocolError(MemtocError):
    """A paper band asked for a model family the paper did not study (or a dictionary it did not use)."""


@lru_cache(maxsize=1)
def protocol() -> dict[str, Any]:
    """The parsed ``paper_protocol.json`` (cached; treat as read-only)."""
    return json.loads(resources.files("memtoc").joinpath("data/paper_protocol.json").read_text(encoding="utf-8"))


def family_of(model_type: str | None) -> str | None:
    """The paper family (``llama`` / ``gemma`` / ``qwen``) of a ``config.model_type`` or architecture class name
    (``LlamaForCausalLM``, ``gemma2``, ``qwen2`` ...); None for a family the paper did not study."""
    text = str(model_type or "").lower()
    for name, fam in protocol()["families"].items():
        if any(m in text for m in fam["match"]):
            return name
    return None


def blocks_to_sites(blocks: Sequence[int], n_blocks: int, paper_n_blocks: int) -> tuple[int, ...]:
    """Sites (block + 1) of paper blocks on this model, sorted and unique: a block is unchanged at the paper's
    depth, else rescaled by depth (half rounds up), and clipped to ``0 .. n_blocks - 1``."""
    scaled = (int(b) if n_blocks == paper_n_blocks else int(math.floor(b * n_blocks / paper_n_blocks + 0.5))
              for b in blocks)
    return tuple(sorted({min(max(b, 0), n_blocks - 1) + 1 for b in scaled}))


def _family(model_type: str | None, what: str) -> tuple[str, dict[str, Any]]:
    fam = family_of(model_type)
    if fam is None:
        known = ", ".join(protocol()["families"])
        raise ProtocolError(f"the paper has no {what} for model type {model_type!r} (families: {known}); give the "
                            "layers explicitly")
    return fam, protocol()["families"][fam]


def lens_sites(model_type: str | None, n_blocks: int) -> tuple[int, ...]:
    """The rank table's paper band (App. H: 8-28 Llama, 10-38 gemma, 7-24 Qwen, blocks) as sites of this model."""
    _, fam = _family(model_type, "lens band")
    lo, hi = fam["lens_band"]
    return blocks_to_sites(range(lo, hi + 1), n_blocks, fam["paper_n_blocks"])


def sae_sites(model_type: str | None, n_blocks: int, dictionary: str | None = None) -> tuple[int, ...]:
    """The SAE steering layers of the paper (App. C) as sites of this model: the family's default dictionary
    band (Llama Scope 12-15, GemmaScope pre-trained 23-26) or a named one (``goodfire`` 19, ``gemmascope_it``
    9/20)."""
    name, fam = _family(model_type, "SAE band")
    key = dictionary or fam["sae_default"]
    if key not in fam["sae_bands"]:
        have = ", ".join(fam["sae_bands"]) or "none"
        raise ProtocolError(f"the paper used no SAE dictionary {key!r} on the {name} family (dictionaries: {have})")
    return blocks_to_sites(fam["sae_bands"][key], n_blocks, fam["paper_n_blocks"])


def pretrained_refs(model_type: str | None, n_blocks: int, dictionary: str | None = None
                    ) -> dict[int, dict[str, str]]:
    """The paper's pretrained dictionaries (App. C) as ``{site: {"release", "sae_id"}}`` for a model of the paper's
    family AND depth (a pretrained dictionary fits its own checkpoint's width and depth only)."""
    name, fam = _family(model_type, "pretrained dictionary")
    key = dictionary or fam["sae_default"]
    pre = (fam.get("pretrained") or {}).get(key or "")
    if pre is None:
        raise ProtocolError(f"no pretrained dictionary {key!r} of the {name} family in the registry "
                            f"(memtoc/data/paper_protocol.json)")
    if n_blocks != fam["paper_n_blocks"]:
        raise ProtocolError(f"the {name} family's pretrained dictionaries fit {fam['paper_model']} "
                            f"({fam['paper_n_blocks']} blocks); this model has {n_blocks}")
    return {int(b) + 1: {"release": pre["release"], "sae_id": pre["sae_id"].format(block=int(b))}
            for b in fam["sae_bands"][key]}


def parse_paper_spec(spec: Any) -> tuple[bool, str | None]:
    """``paper`` -> (True, None); ``paper:goodfire`` -> (True, "goodfire"); anything else -> (False, None)."""
    text = str(spec or "").strip()
    if text == PAPER_KEYWORD:
        return True, None
    if text.startswith(PAPER_KEYWORD + ":"):
        return True, text.split(":", 1)[1].strip() or None
    return False, None


def table8() -> list[dict[str, Any]]:
    return list(protocol()["rank_table"]["table8"])
