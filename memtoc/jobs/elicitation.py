"""``memtoc elicitation-agreement``: App. D's comparison of the two closed-book protocols of one model.

The paper's primary closed book is forced (prompt A3, best guess); the permissive variant (A4) allows "UNKNOWN".
App. D reports the UNKNOWN rate of the permissive protocol and the "agreement between the two protocols on shared
questions" (0.60 to 0.90 across models), read here from the closed books of a forced and a permissive run:

- ``unknown``: the permissive closed books with no answer (``mem_absent``), over every permissive closed book;
- ``agreement``: on the (question, formulation) units both runs elicited and both answered, the share whose two
  answers match (the scorer's matcher, either way round);
- ``correctness_agreement``: on the same units, the share where both answers are right or both wrong.

Which agreement the paper computes is not spelled out; the answer agreement is our primary reading
(docs/protocol.md), the correctness agreement beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from memtoc.core.errors import MemtocError
from memtoc.core.options import opt
from memtoc.jobs import TableDocument


def _closed_books(path: str) -> dict[tuple[str, str], Mapping[str, Any]]:
    from memtoc.runs.runstore import RunStore

    recs = list(RunStore.read(path).closed_book.records())
    if not recs:
        raise MemtocError(f"{path}: no closed-book records (closed_book.jsonl is empty or missing)")
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for r in recs:
        key = str(r.get("key") or "")
        qid = str(r.get("question_id") or key.split("|")[0])
        out[(qid, str(r.get("formulation") or key.partition("|")[2]))] = r
    return out


def _rate(k: int, n: int) -> dict[str, Any]:
    return {"k": k, "n": n, "rate": k / n if n else None}


def elicitation_agreement(forced: Mapping[tuple[str, str], Mapping[str, Any]],
                          permissive: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    """The UNKNOWN rate, answer agreement and correctness agreement (module docstring) of two runs' closed books."""
    from memtoc.scoring.normalize import match_any

    unknown = sum(bool(r.get("mem_absent")) for r in permissive.values())
    shared = sorted(set(forced) & set(permissive))
    answered = [u for u in shared if not permissive[u].get("mem_absent") and not forced[u].get("mem_absent")]
    same = sum(match_any(forced[u].get("memory_span"), [permissive[u].get("memory_span")])
               or match_any(permissive[u].get("memory_span"), [forced[u].get("memory_span")]) for u in answered)
    same_correct = sum(bool(forced[u].get("memory_correct")) == bool(permissive[u].get("memory_correct"))
                       for u in answered)
    return {"n_forced": len(forced), "n_permissive": len(permissive), "n_shared": len(shared),
            "unknown": _rate(unknown, len(permissive)),
            "agreement": _rate(same, len(answered)),
            "correctness_agreement": _rate(same_correct, len(answered)),
            "forced_absent_on_shared": sum(bool(forced[u].get("mem_absent")) for u in shared)}


def format_markdown(res: Mapping[str, Any], label: str) -> str:
    def cell(d: Mapping[str, Any]) -> str:
        return "–" if d["rate"] is None else f"{d['rate']:.3f} ({d['k']}/{d['n']})"

    return "\n".join([
        "# Forced vs permissive closed-book elicitation (App. D)", "",
        "| model | UNKNOWN (permissive) | answer agreement | correctness agreement | shared |",
        "|---|---|---|---|---|",
        f"| {label} | {cell(res['unknown'])} | {cell(res['agreement'])} | {cell(res['correctness_agreement'])} | "
        f"{res['n_shared']} |", "",
        "The paper: Qwen2.5-7B-Instruct declines 104 of 107 pilot questions under the permissive prompt; agreement "
        "between the two protocols on shared questions 0.60-0.90 across models. Agreement is read on the shared "
        "questions both protocols answered.", ""])


@dataclass
class ElicitationAgreementConfig:
    """``memtoc elicitation-agreement``: App. D's UNKNOWN rate and protocol agreement from two runs' closed books."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"forced": "input-run", "permissive": "input-run", "out": "output-dir"}

    forced: str = field(default="", metadata=opt("run elicited with the forced closed book (A3)", required=True,
                                                 path=True))
    permissive: str = field(default="", metadata=opt("run of the same model elicited with the permissive closed "
                                                     "book (A4, UNKNOWN allowed)", required=True, path=True))
    label: str = field(default="model", metadata=opt("the model's name in the table"))
    out: str | None = field(default=None, metadata=opt("directory for elicitation_agreement.{json,md}", path=True))


def run_elicitation_agreement(cfg: ElicitationAgreementConfig) -> TableDocument:
    table = elicitation_agreement(_closed_books(cfg.forced), _closed_books(cfg.permissive))
    doc = TableDocument(table, format_markdown(table, cfg.label))
    if cfg.out:
        doc.write(cfg.out, "elicitation_agreement")
    return doc


__all__: Sequence[str] = ["ElicitationAgreementConfig", "elicitation_agreement", "run_elicitation_agreement"]
