"""Evaluation protocols: one name (``--protocol paper``) for every setting the MemToC paper fixes.

A protocol is a list of :class:`Setting` s. Settings marked ``fill`` are applied where the user did not set the
option (an explicit flag always wins); every run, whatever its protocol, is then compared with the paper's
settings, and each difference is printed in the run header and recorded in ``run.json``'s ``protocol`` block.
The settings and where the paper states each are :data:`PROTOCOLS`; the token budget is not stated in the paper
or the release code, so :data:`PAPER_MAX_NEW_TOKENS` is this project's choice (docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from memtoc.core.errors import MemtocError
from memtoc.core.vocab import EVAL_PROTOCOLS, FORMULATIONS

__all__ = ["Setting", "PROTOCOLS", "PROTOCOL_CHOICES", "PAPER_MAX_NEW_TOKENS", "ProtocolError", "protocol_settings",
           "fill_values", "paper_helps", "protocol_block", "header_lines", "frame_fallback"]

#: Our choice of the paper's unstated generation budget: long enough that a 7-9B instruct model's reasoning
#: and a revised answer fit before the cut (the release runner's default of 128 was raised for v1 runs).
PAPER_MAX_NEW_TOKENS = 512


class ProtocolError(MemtocError):
    """An unknown protocol name."""


@dataclass(frozen=True)
class Setting:
    """One setting a protocol fixes: the config field, the protocol's value, and where the paper says so."""

    name: str
    value: Any
    source: str
    fill: bool = True      # applied where the user did not set the option; False: compared only


PROTOCOLS: dict[str, tuple[Setting, ...]] = {
    "none": (),
    "paper": (
        Setting("question_set", "analysis", "§3.2: the 542-question analysis set (575 minus 33 exclusions)"),
        Setting("limit", None, "§3.2: every question of the set", fill=False),
        Setting("formulations", "all", "§3.3/App. B: reference + two paraphrases, pooled unweighted"),
        Setting("closed_book", "forced", "§3.3: the best-guess closed-book prompt defines memory"),
        Setting("stop_at_final_line", False, "release runner: no stop strings, generation to the budget; the "
                                             "scorer takes the last FINAL: marker"),
        Setting("max_new_tokens", PAPER_MAX_NEW_TOKENS, "not stated in the paper; this project's choice "
                                                       "(docs/protocol.md)"),
        Setting("frame", "tool", "release episodes: the tool-schema frame", fill=False),
    ),
}
PROTOCOL_CHOICES = EVAL_PROTOCOLS
assert set(PROTOCOLS) == set(EVAL_PROTOCOLS), "memtoc.core.vocab.EVAL_PROTOCOLS names every protocol"
#: The settings every run is compared with (whatever its protocol).
REFERENCE = "paper"


def paper_helps(*names: str, **helps: str) -> dict[str, dict[str, Any]]:
    """``OPTIONS_HERE`` entries (:func:`memtoc.core.options.here`) of options a protocol fills (``helps``: a job's
    own wording): each says its piece's default and the value ``--protocol paper`` gives it."""
    from memtoc.core.config import EpisodeSelection, GenerationConfig, Intervention
    from memtoc.core.options import protocol_help

    paper = {s.name: s.value for s in PROTOCOLS["paper"]}
    pieces = (EpisodeSelection, Intervention, GenerationConfig)
    return {n: protocol_help(pieces, n, paper[n], helps.get(n)) for n in (*names, *helps)}


def protocol_settings(name: str) -> tuple[Setting, ...]:
    if name not in PROTOCOLS:
        raise ProtocolError(f"unknown --protocol {name!r}; choose from {', '.join(PROTOCOL_CHOICES)}")
    return PROTOCOLS[name]


def fill_values(name: str, given: Iterable[str], fields: Iterable[str]) -> dict[str, Any]:
    """The values protocol ``name`` sets: its ``fill`` settings among ``fields`` the user did not give."""
    given, fields = set(given), set(fields)
    return {s.name: s.value for s in protocol_settings(name) if s.fill and s.name in fields and s.name not in given}


def _same(name: str, run: Any, paper: Any) -> bool:
    if name == "formulations":
        def norm(v: Any) -> tuple[str, ...]:
            if v is None or v == "all":
                return FORMULATIONS
            items = v.split(",") if isinstance(v, str) else list(v)
            return tuple(sorted(dict.fromkeys(s.strip() for s in items if s.strip())))
        return sorted(norm(run)) == sorted(norm(paper))
    return run == paper


def protocol_block(name: str, values: Mapping[str, Any], *, given: Iterable[str] = (),
                   closed_book_source: Mapping[str, Any] | None = None,
                   fallback: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``run.json``'s ``protocol`` record: every paper setting with the value this run uses and whether it
    differs, the options the user set explicitly, and where the closed-book answers came from."""
    protocol_settings(name)
    settings = {}
    for s in PROTOCOLS[REFERENCE]:
        if s.name not in values:
            continue
        run = values[s.name]
        settings[s.name] = {"paper": s.value, "run": run, "differs": not _same(s.name, run, s.value),
                            "source": s.source}
    return {
        "name": name, "reference": REFERENCE, "settings": settings,
        "differs_from_paper": sorted(k for k, v in settings.items() if v["differs"]),
        "explicit": sorted(set(given) & set(settings)),
        "closed_book_source": dict(closed_book_source) if closed_book_source else {"kind": "own pass"},
        "generation": "greedy; " + ("cut after the first complete FINAL line" if values.get("stop_at_final_line")
                                    else "to the token budget") + "; the scorer takes the last FINAL: marker",
        "frame_fallback": dict(fallback) if fallback else None,
    }


def _show(v: Any) -> str:
    return "all" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def header_lines(block: Mapping[str, Any]) -> list[str]:
    """The run header: the protocol and every setting that differs from the paper (value here, paper value)."""
    diffs = [f"{k} {_show(v['run'])} (paper: {_show(v['paper'])})" for k, v in block["settings"].items()
             if v["differs"]]
    src = block.get("closed_book_source") or {}
    cb = (f"closed book from {src.get('path')}" if src.get("kind") == "shared" else "own closed-book pass")
    return [f"protocol {block['name']}: {cb}; " + ("matches the paper's settings" if not diffs else
                                                  "differs from the paper in " + "; ".join(diffs))]


def frame_fallback(requested: str, used: str, has_schemas: bool, benchmark: str) -> dict[str, Any] | None:
    """The record of an ``auto`` frame that fell back to the no-schema frame (None when it did not)."""
    if requested != "auto" or has_schemas or used != "tool-no-schema":
        return None
    return {"requested": requested, "used": used, "paper": "tool", "benchmark": benchmark,
            "reason": "the benchmark has no tool schemas (mapping-only data: no benchmark/{reference,paraphrase_a,"
                      "paraphrase_b}.json release episode files), so every arm uses the no-schema frame"}


def fallback_warning(fb: Mapping[str, Any]) -> str:
    return (f"warning: FRAME FALLBACK: {fb['reason']}: frame {fb['used']!r} instead of the paper's {fb['paper']!r} "
            f"(benchmark {fb['benchmark']}). Give a release checkout with its episode files for the schema frame, "
            "or pass --frame tool-no-schema to choose this frame explicitly.")
