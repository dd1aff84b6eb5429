"""Questions: the unit of the benchmark, and loaders for every form a user has them in.

Forms: (a) the frozen mapping (``mapping_575.jsonl``: one row per question), (b) the release episode files
(``benchmark/{reference,paraphrase_a,paraphrase_b}.json``: 575 questions x 5 conditions, with the ToolHop
tool schemas), (c) the repair overlay (``repair_overlay_*.json``: 39 repaired near distractors), and (d) the
demo set shipped in the package (mapping schema plus ``aliases``). Every loader validates as it reads and
names the file, row and field of whatever is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import json_error_text
from memtoc.core.vocab import CONDITIONS, CONFLICT_CONDITION


_REQUIRED_MAPPING_FIELDS = ("id", "question", "gold_answer", "final_near")


@dataclass(frozen=True)
class Question:
    """One benchmark question with its gold answer and its two distractors."""

    id: str                      # "instance.hop", stable across formulations
    instance_id: int
    hop_idx: int
    qkey: str
    question: str
    gold_answer: str
    near: str
    far: str | None = None
    aliases: tuple[str, ...] = ()
    gold_kind: str = "other_string"
    family: str = "free_form"
    source: str = ""
    method: str = ""
    tool_schema: Mapping[str, Any] | None = None
    repaired: bool = False       # near distractor replaced by the repair overlay

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "instance_id": self.instance_id, "hop_idx": self.hop_idx, "qkey": self.qkey,
            "question": self.question, "gold_answer": self.gold_answer, "aliases": list(self.aliases),
            "gold_kind": self.gold_kind, "family": self.family, "final_near": self.near, "far": self.far,
            "source": self.source, "method": self.method, "repaired": self.repaired,
        }


def read_data_json(path: Path) -> Any:
    """A benchmark data file's JSON; a missing file or bad JSON is one BenchmarkDataError naming the file."""
    if not path.exists():
        raise BenchmarkDataError("file not found", path=path)
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"invalid JSON: {json_error_text(exc)}", path=path) from None


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.exists():
        raise BenchmarkDataError("file not found", path=path)
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkDataError(f"invalid JSON: {json_error_text(exc, line=False)}", path=path,
                                         row=lineno) from None
            if not isinstance(obj, dict):
                raise BenchmarkDataError("expected a JSON object", path=path, row=lineno)
            yield lineno, obj


def _text_field(row: Mapping[str, Any], name: str, path: Path, rowno: int | str, *,
                required: bool = True) -> str | None:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise BenchmarkDataError("missing or empty", path=path, row=rowno, field=name)
        return None
    if not isinstance(value, str):
        raise BenchmarkDataError(f"expected a string, got {type(value).__name__}", path=path, row=rowno, field=name)
    return value


def _split_id(qid: str, path: Path, rowno: int | str) -> tuple[int, int]:
    try:
        inst, hop = qid.split(".")
        return int(inst), int(hop)
    except ValueError:
        raise BenchmarkDataError(f"id {qid!r} is not of the form 'instance.hop'", path=path, row=rowno,
                                 field="id") from None


def _check_unique(questions: Iterable[Question], path: Path, rows: Sequence[int]) -> None:
    """Refuse a repeated question id, naming the row that repeats it and the row it first appeared on."""
    seen: dict[str, int] = {}
    for q, row in zip(questions, rows):
        if q.id in seen:
            raise BenchmarkDataError(f"duplicate question id {q.id!r} (first on row {seen[q.id]})", path=path,
                                     row=row, field="id")
        seen[q.id] = row


def load_mapping(path: str | Path) -> list[Question]:
    """Load a frozen-mapping JSONL file (the release's ``mapping_575.jsonl`` or the demo set)."""
    path = Path(path)
    questions: list[Question] = []
    rows: list[int] = []
    for lineno, row in _iter_jsonl(path):
        rows.append(lineno)
        for name in _REQUIRED_MAPPING_FIELDS:
            _text_field(row, name, path, lineno)
        qid = row["id"]
        inst, hop = _split_id(qid, path, lineno)
        aliases = row.get("aliases") or []
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise BenchmarkDataError("expected a list of strings", path=path, row=lineno, field="aliases")
        questions.append(Question(
            id=qid, instance_id=int(row.get("instance_id", inst)), hop_idx=int(row.get("hop_idx", hop)),
            qkey=row.get("qkey") or make_qkey(row["question"]), question=row["question"],
            gold_answer=row["gold_answer"], near=row["final_near"],
            far=_text_field(row, "far", path, lineno, required=False), aliases=tuple(aliases),
            gold_kind=row.get("gold_kind") or "other_string", family=row.get("family") or "free_form",
            source=row.get("source") or "", method=row.get("method") or ""))
    if not questions:
        raise BenchmarkDataError("no questions in file", path=path)
    _check_unique(questions, path, rows)
    return questions


def make_qkey(question: str) -> str:
    """Lower-case the question and delete every non-ASCII-alphanumeric character except spaces.

    Matches the release's observed ``qkey`` form (``Joseph-André`` -> ``josephandr``).
    """
    kept = "".join(ch for ch in question.lower() if (ch.isascii() and ch.isalnum()) or ch.isspace())
    return " ".join(kept.split())


@dataclass(frozen=True)
class ReleaseEpisodeFile:
    """What a release episode file (or overlay / sample) holds that the builder needs."""

    path: Path
    prompt_variant: int
    questions: dict[str, Question]
    near: dict[str, str] = field(default_factory=dict)
    schemas: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    episodes: list[dict[str, Any]] = field(default_factory=list)


def load_release_episodes(path: str | Path) -> ReleaseEpisodeFile:
    """Read a release episode file: ``{"summary": ..., "episodes": [...]}``.

    Validates every episode (condition known, ids unique, gold present) and collects per question the
    tool schema and the near distractor of its tool_wrong episode.
    """
    path = Path(path)
    data = read_data_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("episodes"), list):
        raise BenchmarkDataError("expected an object with an 'episodes' list", path=path, field="episodes")
    summary = data.get("summary") or {}
    variants: set[int] = set()
    questions: dict[str, Question] = {}
    near: dict[str, str] = {}
    schemas: dict[str, Mapping[str, Any]] = {}
    seen_ids: set[str] = set()
    for idx, ep in enumerate(data["episodes"]):
        if not isinstance(ep, dict):
            raise BenchmarkDataError("expected a JSON object", path=path, row=idx)
        eid = _text_field(ep, "episode_id", path, idx)
        if eid in seen_ids:
            raise BenchmarkDataError(f"duplicate episode id {eid!r}", path=path, row=idx, field="episode_id")
        seen_ids.add(eid)
        cond = ep.get("condition")
        if cond not in CONDITIONS:
            raise BenchmarkDataError(f"unknown condition {cond!r}; expected one of {', '.join(CONDITIONS)}",
                                     path=path, row=idx, field="condition")
        for name in ("question", "gold_answer"):
            _text_field(ep, name, path, idx)
        for name in ("instance_id", "hop_idx"):
            if not isinstance(ep.get(name), int):
                raise BenchmarkDataError("expected an integer", path=path, row=idx, field=name)
        if isinstance(ep.get("prompt_variant"), int):
            variants.add(ep["prompt_variant"])
        qid = f"{ep['instance_id']}.{ep['hop_idx']}"
        prov = ep.get("provenance") or {}
        if ep.get("tool_schema") is not None:
            schemas[qid] = ep["tool_schema"]
        if cond == CONFLICT_CONDITION:
            value = (ep.get("tool_output") or {}).get("result", ep.get("distractor"))
            if not isinstance(value, str) or not value:
                raise BenchmarkDataError("tool_wrong episode without a distractor value", path=path, row=idx,
                                         field="tool_output.result")
            near[qid] = value
        if qid not in questions:
            questions[qid] = Question(
                id=qid, instance_id=ep["instance_id"], hop_idx=ep["hop_idx"],
                qkey=prov.get("qkey") or make_qkey(ep["question"]), question=ep["question"],
                gold_answer=ep["gold_answer"], near="", gold_kind=ep.get("tau") or "other_string",
                family=ep.get("family") or "free_form", source=prov.get("distractor_source", ""),
                method=prov.get("distractor_method", ""))
        elif questions[qid].question != ep["question"] or questions[qid].gold_answer != ep["gold_answer"]:
            raise BenchmarkDataError(f"question {qid} has different text or gold answer across its episodes",
                                     path=path, row=idx, field="question")
    variant = summary.get("prompt_variant") if isinstance(summary.get("prompt_variant"), int) else None
    if variant is None:
        if len(variants) != 1:
            raise BenchmarkDataError(f"cannot tell the formulation: prompt_variant values {sorted(variants)}",
                                     path=path, field="prompt_variant")
        variant = variants.pop()
    questions = {qid: replace(q, near=near.get(qid, ""), tool_schema=schemas.get(qid))
                 for qid, q in questions.items()}
    return ReleaseEpisodeFile(path=path, prompt_variant=variant, questions=questions, near=near, schemas=schemas,
                              episodes=data["episodes"])


def apply_repair_overlay(questions: list[Question], overlay: ReleaseEpisodeFile) -> list[Question]:
    """Replace the near distractor of every question the overlay repairs (and take its schema)."""
    known = {q.id for q in questions}
    for qid in overlay.near:
        if qid not in known:
            raise BenchmarkDataError(f"overlay repairs question {qid}, which is not in the benchmark",
                                     path=overlay.path, row=qid, field="instance_id")
    out = []
    for q in questions:
        if q.id in overlay.near:
            q = replace(q, near=overlay.near[q.id], repaired=True,
                        tool_schema=q.tool_schema or overlay.schemas.get(q.id))
        out.append(q)
    return out
