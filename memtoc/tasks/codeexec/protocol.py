"""The overreliance paper's Code Executor protocol as data (``data/overreliance_protocol.json``).

Two things live here: the main evaluation's settings (three repetitions, 2-of-3 override support, 50 calls and
16k output tokens per run, the model's own calls), which ``codeexec evaluate --protocol paper`` fills in
where the user gave no value (those fields default to None), and the per-family steering band and probe layer,
by relative depth. Why data: the numbers are facts about the paper's runs and models; a new family is an edit of
the JSON.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

from memtoc.core.errors import MemtocError

RUN_PROTOCOLS = ("none", "paper")


@lru_cache(maxsize=1)
def protocol() -> dict[str, Any]:
    data = resources.files("memtoc.tasks.codeexec").joinpath("data/overreliance_protocol.json")
    text = data.read_text(encoding="utf-8")
    return json.loads(text)


def main_settings() -> dict[str, Any]:
    """Field name -> the paper's value for the Code Executor main evaluation."""
    return {k: v["value"] for k, v in protocol()["main_evaluation"]["settings"].items()}


def paper_helps(**helps: str) -> dict[str, dict[str, Any]]:
    """``OPTIONS_HERE`` entries (:func:`memtoc.core.options.here`) of the options the run protocol fills (``helps``:
    a job's own wording): each says its piece's default and the main evaluation's value."""
    from memtoc.core.config import CodeexecTask
    from memtoc.core.options import protocol_help
    from memtoc.tasks.codeexec.agent import AgentConfig

    pieces = (CodeexecTask, AgentConfig)
    names = {f.name for p in pieces for f in fields(p)}
    return {n: protocol_help(pieces, n, v, helps.get(n)) for n, v in main_settings().items() if n in names}


def not_given(piece: type) -> Any:
    """``piece`` (``CodeexecTask``, ``AgentConfig``) with every field the run protocol fills set to None (not
    given): ``CodeexecRunConfig``'s defaults, resolved by :func:`apply_run_protocol`."""
    settings = main_settings()
    return piece(**{f.name: None for f in fields(piece) if f.name in settings})


def apply_run_protocol(name: str, task: Any, agent: Any) -> tuple[Any, Any, list[str]]:
    """``task`` (CodeexecTask) and ``agent`` (AgentConfig) with each protocol field that is None (not given) set
    to the protocol's value (``paper``), else to the piece's own default; returns them and the names whose value
    the protocol changed from that default. A field given keeps its value, also when it equals the default."""
    if name not in RUN_PROTOCOLS:
        raise MemtocError(f"--protocol must be one of {', '.join(RUN_PROTOCOLS)}, not {name!r}")
    settings = main_settings() if name == "paper" else {}
    filled: list[str] = []
    out = []
    for obj in (task, agent):
        default = type(obj)()
        kw = {f.name: settings.get(f.name, getattr(default, f.name)) for f in fields(obj)
              if getattr(obj, f.name) is None and f.name in main_settings()}
        filled += sorted(k for k, v in kw.items() if v != getattr(default, k))
        out.append(replace(obj, **kw) if kw else obj)
    return out[0], out[1], filled


def family_of(architecture: str | None) -> str | None:
    text = str(architecture or "").lower().replace("-", "_")
    for name, fam in protocol()["families"].items():
        if any(m in text for m in fam["match"]):
            return name
    return None


def _scale(site: int, n_blocks: int, paper_n_blocks: int) -> int:
    s = site if n_blocks == paper_n_blocks else int(math.floor(site * n_blocks / paper_n_blocks + 0.5))
    return min(max(s, 1), n_blocks)


def steering_band(architecture: str | None, n_blocks: int, *,
                  log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> tuple[int, ...]:
    """The paper's three-site steering band for this model, by relative depth (sites; see the JSON's numbering)."""
    fam_name = family_of(architecture)
    fam = protocol()["families"].get(fam_name or "")
    if fam is not None and fam["paper_n_blocks"] is None and n_blocks > fam["steering_band"][1]:
        lo, hi = fam["steering_band"]
        log(f"overreliance band: {fam['paper_model']}'s depth is not in the text; sites {lo}-{hi} used as given")
        return tuple(range(lo, hi + 1))
    if fam is not None and fam["paper_n_blocks"] is not None:
        width = fam["steering_band"][1] - fam["steering_band"][0] + 1      # the paper's width (3) is kept
        lo = min(_scale(fam["steering_band"][0], n_blocks, fam["paper_n_blocks"]), n_blocks - width + 1)
        return tuple(range(max(lo, 1), max(lo, 1) + width))
    fb = protocol()["fallback"]
    start = min(int(math.floor(fb["relative_band_start"] * n_blocks + 0.5)), n_blocks - fb["band_width"] + 1)
    start = max(start, 1)
    log(f"overreliance band: the paper steered no {architecture!r} model at this depth; FALLBACK to the shared "
        f"relative depth {fb['relative_band_start']}: sites {start}-{start + fb['band_width'] - 1} of {n_blocks}")
    return tuple(range(start, start + fb["band_width"]))


def probe_site_info(architecture: str | None, n_blocks: int) -> tuple[int, str]:
    """(site, source): the paper's fixed probe layer (Table 39) where the data has it, else the band's middle
    site with the source saying it is a fallback."""
    fam = protocol()["families"].get(family_of(architecture) or "")
    if fam is not None and fam.get("probe_site") is not None:
        return _scale(int(fam["probe_site"]), n_blocks, fam["paper_n_blocks"] or n_blocks), "paper Table 39"
    band = steering_band(architecture, n_blocks, log=lambda s: None)
    return band[len(band) // 2], "FALLBACK: the steering band's middle site (Table 39 is not in the text copy)"


def probe_site(architecture: str | None, n_blocks: int, *,
               log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> int:
    """The paper's fixed probe layer (Table 39) where the data has it, else (loudly) the band's middle site."""
    site, source = probe_site_info(architecture, n_blocks)
    if source.startswith("FALLBACK"):
        log(f"overreliance probe layer: FALLBACK ({protocol()['fallback']['probe']}): site {site}")
    return site
