"""Preference pairs and SFT examples, built from the benchmark itself.

Per question and formulation there are two balanced tool-return conditions:

- ``tool_wrong``: the tool returned the NEAR distractor; the gold answer is preferred and the returned value
  rejected (keep a correct answer against a plausible wrong tool).
- ``tool_right``: the tool returned the gold answer; it is preferred and the near distractor rejected. The
  counterweight: without it the cheapest way to win the first condition is to ignore every tool.

Far distractors are never read here, so the far arm stays a held-out evaluation condition. Prompts are the
benchmark's own with-tool prompts (same frame and formulation as ``memtoc evaluate``) through the backend's prompt
formatter, so the model is trained on exactly the strings it is evaluated on. The completion is
``COMPLETION_FORMAT.format(answer=...) == "FINAL: " + answer`` followed by the tokenizer's EOS
(:mod:`memtoc.jobs.finetune.tokens`); SFT uses the preferred completion, its loss on the completion tokens only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from memtoc.bench.episodes import build_episode
from memtoc.core.errors import MemtocError
from memtoc.core.fileio import sha256_json, write_json_atomic, write_jsonl_atomic
from memtoc.bench.prompts import load_prompt_set
from memtoc.bench.questions import Question

#: The completion every training target uses (the scorer reads the FINAL line).
COMPLETION_FORMAT = "FINAL: {answer}"
#: The two training conditions, in the order pairs are written per question.
TRAIN_CONDITIONS: tuple[str, ...] = ("tool_wrong", "tool_right")
PAIRS_SCHEMA = "memtoc-finetune-pairs-v1"


def completion_text(answer: str) -> str:
    """The target string for an answer (without the EOS token, which tokenization appends)."""
    return COMPLETION_FORMAT.format(answer=answer)


@dataclass(frozen=True)
class PreferencePair:
    """One training prompt with its preferred (``chosen``) and dispreferred (``rejected``) completion.

    ``prompt`` is the formatted string the model conditions on (chat template applied); ``user_prompt`` the
    benchmark's with-tool prompt before formatting. SFT uses ``prompt`` + ``chosen``.
    """

    pair_id: str
    question_id: str
    instance_id: int
    formulation: str
    condition: str                  # tool_wrong | tool_right
    user_prompt: str
    prompt: str
    tool_value: str
    chosen_answer: str
    rejected_answer: str
    chosen: str
    rejected: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PreferencePair":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def build_pairs(questions: Iterable[Question], format_prompt: Callable[[str], str], *,
                formulations: Sequence[str] = ("reference",), frame: str = "tool-no-schema") -> list[PreferencePair]:
    """Two pairs (tool_wrong, tool_right) per question and formulation, ordered formulation -> question -> condition.

    ``format_prompt`` is the backend's formatter (``HFBackend.format_prompt``). A question whose near distractor
    equals its gold answer has no conflict to learn from and is refused (the benchmark never has one).
    """
    prompts = load_prompt_set()
    out: list[PreferencePair] = []
    for formulation in formulations:
        for q in questions:
            if not q.near or q.near == q.gold_answer:
                raise MemtocError(f"question {q.id}: near distractor {q.near!r} is empty or equals the gold answer")
            for cond in TRAIN_CONDITIONS:
                ep = build_episode(q, cond, formulation, frame=frame, prompts=prompts)
                assert ep is not None and ep.tool_value is not None
                # Both conditions prefer the gold and reject the near value; only the tool return differs.
                chosen, rejected = q.gold_answer, q.near
                out.append(PreferencePair(
                    pair_id=f"{q.id}|{formulation}|{cond}", question_id=q.id, instance_id=q.instance_id,
                    formulation=formulation, condition=cond, user_prompt=ep.prompt, prompt=format_prompt(ep.prompt),
                    tool_value=ep.tool_value, chosen_answer=chosen, rejected_answer=rejected,
                    chosen=completion_text(chosen), rejected=completion_text(rejected)))
    return out


def pairs_sha256(pairs: Sequence[PreferencePair]) -> str:
    """Content hash of a training set (every field of every pair, in order): the adapter records it."""
    return sha256_json({"schema": PAIRS_SCHEMA, "completion_format": COMPLETION_FORMAT,
                        "pairs": [p.to_dict() for p in pairs]})


@dataclass(frozen=True)
class PairSet:
    """Pairs plus where they came from; ``sha256`` is :func:`pairs_sha256` of ``pairs``."""

    pairs: list[PreferencePair]
    meta: dict[str, Any]

    @property
    def sha256(self) -> str:
        return self.meta["sha256"]

    @property
    def question_ids(self) -> list[str]:
        return list(dict.fromkeys(p.question_id for p in self.pairs))


def make_pair_set(pairs: list[PreferencePair], **meta: Any) -> PairSet:
    return PairSet(pairs=pairs, meta={"schema_version": PAIRS_SCHEMA, "n_pairs": len(pairs),
                                      "n_questions": len({p.question_id for p in pairs}),
                                      "completion_format": COMPLETION_FORMAT,
                                      "conditions": list(TRAIN_CONDITIONS), **meta, "sha256": pairs_sha256(pairs)})


def write_pair_set(path: str | Path, pair_set: PairSet) -> Path:
    """``path`` (a .jsonl) plus ``path.meta.json`` with the hash, each written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl_atomic(path, [p.to_dict() for p in pair_set.pairs])
    write_json_atomic(path.with_name(path.name + ".meta.json"), pair_set.meta)
    return path


def read_pair_set(path: str | Path) -> PairSet:
    """Read a pair file and check its recorded hash against the content."""
    path = Path(path)
    if not path.exists():
        raise MemtocError(f"{path}: pair file not found")
    pairs = [PreferencePair.from_dict(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()
             if line.strip()]
    meta_path = path.with_name(path.name + ".meta.json")
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    digest = pairs_sha256(pairs)
    if meta.get("sha256") not in (None, digest):
        raise MemtocError(f"{path}: content hash {digest[:12]} differs from the recorded {meta['sha256'][:12]} "
                          "(edited after it was written?)")
    meta = {**meta, "sha256": digest}
    return PairSet(pairs=pairs, meta=meta)
