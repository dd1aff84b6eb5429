"""The transfer set of App. F.1: FaithEval-counterfactual questions joined back to ARC-Challenge, loaded from a
user-supplied JSONL file (the data itself is not shipped; ``data/transfer/sample.jsonl`` is a small
developer-authored sample in the same format, for tests). docs/transfer.md describes the row format, the two
frames (``value``: the counterfactual option's text; ``passage``: the whole passage) and the scoring.

Every row is checked as it is read; a malformed one is refused naming the file, the row (1-based line) and the
field, never skipped silently: the paper's serialization filter (answer key not among the choice labels) is a
refusal here, so the user sees which rows to drop.

Scoring (App. F.1: "the MC matcher"): :class:`TransferScorer` replaces the string matcher, which cannot serve
here (a passage names every option, so any kept-memory answer would also "follow the tool"). The option a span
names (:func:`match_choice`) decides every label; a span naming no option, or several, is *unmatched*, and
:func:`unmatched_rate` reports that share, since App. F.1 shows it can differ across arms and bias deltas.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from memtoc.core.errors import BenchmarkDataError
from memtoc.bench.questions import Question
from memtoc.scoring.abstain import is_abstain
from memtoc.scoring.extract import extract_span
from memtoc.scoring.normalize import canonical, match
from memtoc.scoring.score import MemoryStatus, outcome_label

__all__ = ["FRAMES", "TransferItem", "load_transfer", "to_questions", "match_choice", "unmatched_rate",
           "SAMPLE", "mc_outcomes", "mc_by_condition", "TransferScorer"]

from memtoc.core.vocab import TRANSFER_FRAMES as FRAMES  # noqa: E402
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "transfer" / "sample.jsonl"
_REQUIRED = ("id", "question", "choices", "answerKey", "counterfactual_answerKey", "context")
_REQUIRED_UNANSWERABLE = ("id", "question", "choices", "context")
UNANSWERABLE = "unanswerable"


@dataclass(frozen=True)
class TransferItem:
    id: str
    question: str
    choices: tuple[tuple[str, str], ...]     # (label, text)
    answer_key: str | None
    counterfactual_key: str | None
    context: str
    split: str = "counterfactual"           # or "unanswerable" (no counterfactual; abstention is right)

    def text_of(self, label: str) -> str:
        return dict(self.choices)[label]

    @property
    def unanswerable(self) -> bool:
        return self.split == UNANSWERABLE

    @property
    def gold(self) -> str:
        return self.text_of(self.answer_key) if self.answer_key else ""

    @property
    def counterfactual(self) -> str:
        return self.text_of(self.counterfactual_key) if self.counterfactual_key else ""


def _row(obj: Any, path: Path, line: int) -> TransferItem:
    def bad(msg: str, field: str) -> BenchmarkDataError:
        return BenchmarkDataError(msg, path=path, row=line, field=field)

    if not isinstance(obj, dict):
        raise bad("expected a JSON object", "row")
    split = obj.get("split", "counterfactual")
    if split not in ("counterfactual", UNANSWERABLE):
        raise bad(f"must be 'counterfactual' or 'unanswerable', got {split!r}", "split")
    unans = split == UNANSWERABLE
    required = _REQUIRED_UNANSWERABLE if unans else _REQUIRED
    for key in required:
        if key not in obj:
            raise bad("missing", key)
    for key in (k for k in required if k != "choices"):
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise bad(f"must be a non-empty string, got {obj[key]!r}", key)
    choices = obj["choices"]
    if not isinstance(choices, list) or len(choices) < 2:
        raise bad("must be a list of at least two {label, text} options", "choices")
    pairs = []
    for i, c in enumerate(choices):
        if not (isinstance(c, dict) and isinstance(c.get("label"), str) and isinstance(c.get("text"), str)
                and c["label"].strip() and c["text"].strip()):
            raise bad(f"option {i} must be {{'label': str, 'text': str}}, got {c!r}", f"choices[{i}]")
        pairs.append((c["label"].strip(), c["text"].strip()))
    labels = [p[0] for p in pairs]
    if len(set(labels)) != len(labels):
        raise bad(f"duplicate labels {labels}", "choices")
    if unans:
        if obj.get("counterfactual_answerKey") is not None:
            raise bad("an unanswerable row has no counterfactual answer", "counterfactual_answerKey")
        key = obj.get("answerKey")
        if key is not None and key not in labels:
            raise bad(f"{key!r} is not one of the choice labels {labels}", "answerKey")
        return TransferItem(id=obj["id"], question=obj["question"].strip(), choices=tuple(pairs), answer_key=key,
                            counterfactual_key=None, context=obj["context"], split=UNANSWERABLE)
    for key in ("answerKey", "counterfactual_answerKey"):
        if obj[key] not in labels:
            raise bad(f"{obj[key]!r} is not one of the choice labels {labels}", key)
    if obj["answerKey"] == obj["counterfactual_answerKey"]:
        raise bad("equals answerKey: a counterfactual must differ from the world-true answer",
                  "counterfactual_answerKey")
    texts = dict(pairs)
    gold, cf = texts[obj["answerKey"]], texts[obj["counterfactual_answerKey"]]
    if canonical(gold) == canonical(cf):   # the scorer could not tell following the tool from keeping memory
        raise bad(f"option {obj['counterfactual_answerKey']} has the same text as the answer option "
                  f"{obj['answerKey']} ({cf!r}); the counterfactual must read differently", "choices")
    return TransferItem(id=obj["id"], question=obj["question"].strip(), choices=tuple(pairs),
                        answer_key=obj["answerKey"], counterfactual_key=obj["counterfactual_answerKey"],
                        context=obj["context"])


def load_transfer(path: str | Path) -> list[TransferItem]:
    """Every row of a transfer file, checked (module docstring); ids must be unique."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchmarkDataError(f"cannot read transfer file: {exc}", path=p) from None
    items, seen = [], {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BenchmarkDataError(f"not JSON: {exc}", path=p, row=n, field="row") from None
        item = _row(obj, p, n)
        if item.id in seen:
            raise BenchmarkDataError(f"duplicate id {item.id!r} (first on row {seen[item.id]})", path=p, row=n,
                                     field="id")
        seen[item.id] = n
        items.append(item)
    if not items:
        raise BenchmarkDataError("no rows", path=p)
    return items


def to_questions(items: Sequence[TransferItem], frame: str = "value") -> list[Question]:
    """Questions for the episode builder: gold = the ARC answer, near = what the tool returns in the tool_wrong
    condition (the counterfactual option's text, or the passage in the passage frame). The gold's option label
    is its alias through :class:`TransferScorer` (the MC matcher), not through ``aliases``: the string matcher's
    character containment would let a one-letter alias match almost any answer. Question ids are ``"i.0"`` with
    ``i`` the item's row index (unanswerable items are skipped in the value frame)."""
    if frame not in FRAMES:
        raise BenchmarkDataError(f"unknown frame {frame!r}; choose from {', '.join(FRAMES)}", field="frame")
    out = []
    for i, it in enumerate(items):
        if it.unanswerable and frame != "passage":
            continue                     # no counterfactual value: the unanswerable split is passage-only
        q = it.question + "\nOptions:\n" + "\n".join(f"{label}) {text}" for label, text in it.choices)
        out.append(Question(id=f"{i}.0", instance_id=i, hop_idx=0, qkey=re.sub(r"\s+", " ", q.lower()).strip(),
                            question=q, gold_answer=it.gold or "(unanswerable)",
                            near=it.counterfactual if frame == "value" else it.context,
                            aliases=(), gold_kind="other_string", family="multiple_choice",
                            source=f"transfer:{it.id}",
                            method=f"faitheval_{it.split}_{frame}" if it.unanswerable else f"faitheval_arc_{frame}"))
    return out


_LABEL_RE = re.compile(r"^\s*(?:option\s+|answer\s*:?\s*)?[(\[]?([A-Za-z0-9])[)\].:]?(?:\s|$)", re.IGNORECASE)


def match_choice(span: str | None, choices: Iterable[tuple[str, str]]) -> str | None:
    """The option label a response span names: a leading bare/bracketed label, else exactly one option's text
    (the scorer's matcher); None when it names none or several (unmatched)."""
    choices = list(choices)
    labels = {label.upper(): label for label, _ in choices}
    text = (span or "").strip()
    m = _LABEL_RE.match(text)
    if m and m.group(1).upper() in labels:
        rest = text[m.end():].strip()
        label = labels[m.group(1).upper()]
        # "B) Mars" must agree with option B's text when a text follows
        if not rest or match(rest, dict(choices)[label]):
            return label
    hits = [label for label, t in choices if match(text, t)]
    return hits[0] if len(hits) == 1 else None


#: the option the tool argues for, per condition (tool_error / no_tool: none)
_TOOL_OPTION = {"tool_wrong": "counterfactual_key", "tool_right": "answer_key"}


@dataclass(frozen=True)
class TransferScorer:
    """The MC matcher as the transfer benchmark's scorer (module docstring, "Scoring")."""

    items: tuple[TransferItem, ...]

    def item(self, question_id: str) -> TransferItem:
        return self.items[int(str(question_id).split(".")[0])]

    def memory_status(self, question: Question, closed_book_response: str | None) -> MemoryStatus:
        """Closed-book memory by option: correct iff the span names the gold option (a bare label counts)."""
        it = self.item(question.id)
        span = extract_span(closed_book_response)
        absent = not span or is_abstain(span)
        label = None if absent else match_choice(span, it.choices)
        correct = None if absent or it.answer_key is None else label == it.answer_key
        return MemoryStatus(span=span, mem_absent=absent, memory_correct=correct)

    def rescore(self, rec: dict[str, Any]) -> dict[str, Any]:
        """A record scored by the string matcher, relabelled by option (``mc_label``: the option named)."""
        it = self.item(rec["question_id"])
        label = match_choice(rec.get("extracted"), it.choices)
        mem_label = None if rec.get("mem_absent") else match_choice(rec.get("memory_span"), it.choices)
        attr = _TOOL_OPTION.get(str(rec.get("condition")))
        tool_label = getattr(it, attr) if attr else None
        followed = tool_label is not None and label == tool_label
        kept = mem_label is not None and label == mem_label
        outcome = outcome_label(followed, kept)
        out = dict(rec)
        out.update(followed_tool=followed, kept_memory=kept, outcome=outcome, ack_proxy=followed and kept,
                   final_correct=it.answer_key is not None and label == it.answer_key,
                   neither_subtype=("abstain" if rec.get("abstain") else "other") if outcome == "neither" else None,
                   mc_label=label, mc_unmatched=label is None and not rec.get("abstain"),
                   transfer_split=it.split, transfer_item=it.id, scorer="transfer_mc")
        return out


def unmatched_rate(spans: Sequence[str | None], choices_per_span: Sequence[Iterable[tuple[str, str]]]) -> float:
    """Share of spans that match no option (or several)."""
    if not spans:
        return float("nan")
    return sum(match_choice(s, c) is None for s, c in zip(spans, choices_per_span)) / len(spans)


def mc_outcomes(records: Sequence[dict[str, Any]], items: Sequence[TransferItem]) -> dict[str, Any]:
    """Multiple-choice reading of scored evaluate records of a transfer benchmark (``question_id`` ``"i.0"`` is
    item ``i``): per record the option its extracted answer names; shares of gold, counterfactual, other and
    unmatched answers over the records. In the passage frame the scorer's ``followed_tool`` compares against the
    whole passage, so the counterfactual share here is the adoption figure of both frames."""
    counts = {"gold": 0, "counterfactual": 0, "other": 0, "unmatched": 0}
    for r in records:
        it = items[int(str(r["question_id"]).split(".")[0])]
        if it.unanswerable:
            continue                     # read by unanswerable_abstention
        label = match_choice(r.get("extracted"), it.choices)
        key = ("unmatched" if label is None else "gold" if label == it.answer_key
               else "counterfactual" if label == it.counterfactual_key else "other")
        counts[key] += 1
    n = sum(counts.values())
    return {"n": n, **{f"{k}_rate": (v / n if n else float("nan")) for k, v in counts.items()}, "counts": counts}


def unanswerable_abstention(records: Sequence[dict[str, Any]], items: Sequence[TransferItem]) -> dict[str, Any]:
    """App. F.1's abstention: the share of the unanswerable split's answers that abstain (``abstain``)."""
    sel = [r for r in records if items[int(str(r["question_id"]).split(".")[0])].unanswerable]
    k = sum(bool(r.get("abstain")) for r in sel)
    return {"n": len(sel), "k": k, "rate": k / len(sel) if sel else float("nan")}


def mc_by_condition(records: Sequence[dict[str, Any]], items: Sequence[TransferItem]) -> dict[str, Any]:
    """:func:`mc_outcomes` per condition (arm) and formulation-pooled: what ``summary.json`` and the report show
    for a transfer run, with the unmatched share beside the adoption figures (App. F.1)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(str(r.get("arm") or r.get("condition")), []).append(r)
    out = {cond: mc_outcomes(recs, items) for cond, recs in sorted(by.items())}
    if any(it.unanswerable for it in items):
        out["unanswerable_abstention"] = unanswerable_abstention(records, items)
    return out
