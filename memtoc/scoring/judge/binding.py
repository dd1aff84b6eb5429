"""A judge file belongs to one run: what the judged layer checks before it vouches for a number.

A judge record is matched to the run by ``request_id``, which says nothing about *which* run's answer was
judged: a file copied from another model's run (or edited) has the same ids with other answers. So every record
must carry this run's ``run_identity_sha256``, judge this run's span for its request (``span_sha256``, or the
``answer`` text of older files), belong to a request this run has, and give the verdict its own stored reply
gives (:func:`check_verdicts`); :class:`Coverage` measures how many of the run's requests have a record, and a
partial pass is refused by the judged layer unless the caller allows it (then it is marked).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from memtoc.core.errors import RunStoreError
from memtoc.scoring.judge.requests import REQUEST_KINDS, request_id, request_specs


def span_sha256(text: str | None) -> str:
    return hashlib.sha256((text or "").encode("utf-8")).hexdigest()


def run_identity_sha256(run_dir: str | Path) -> str | None:
    """The ``identity_sha256`` of the run directory's ``run.json`` (None where there is none to read)."""
    try:
        info = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info.get("identity_sha256") if isinstance(info, dict) else None


@dataclass
class Coverage:
    """How much of the run's judge requests the file answers."""

    n_requests: int
    n_judged: int
    missing: dict[str, int] = field(default_factory=dict)   # kind -> requests without a record

    @property
    def partial(self) -> bool:
        return self.n_judged < self.n_requests

    def to_dict(self) -> dict[str, Any]:
        return {"n_requests": self.n_requests, "n_judged": self.n_judged, "partial": self.partial,
                "missing": dict(self.missing)}

    def text(self) -> str:
        miss = ", ".join(f"{k} {v}" for k, v in self.missing.items() if v)
        return (f"{self.n_judged} of {self.n_requests} judge requests judged"
                + (f" (missing: {miss})" if miss else ""))


def expected_spans(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """request_id -> (kind, span) of every judge request this run has (the ids of
    :func:`memtoc.scoring.judge.requests.build_requests`, which do not depend on the prompt text)."""
    return {request_id(kind, key): (kind, answer) for kind, key, *_, answer in request_specs(records)}


def check_judge_file(judge: Mapping[str, Mapping[str, Any]], records: Iterable[Mapping[str, Any]], *,
                     run_dir: str | Path, path: str | Path) -> Coverage:
    """Refuse judge records that are not this run's (module docstring); return the pass's coverage."""
    want = expected_spans(records)
    run_id = run_identity_sha256(run_dir)
    for rid, rec in judge.items():
        rec_run = rec.get("run_identity_sha256")
        if rec_run is not None and run_id is not None and rec_run != run_id:
            raise RunStoreError(f"{path}: record {rid!r} was judged on another run (run identity {rec_run[:12]}, "
                                f"{run_dir} has {run_id[:12]}); judge this run with `memtoc judge {run_dir}`")
        if rid not in want:
            raise RunStoreError(f"{path}: record {rid!r} is not a judge request of the run {run_dir} (another run's "
                                "judge file, or a run that changed since); judge this run again into a new file")
        kind, span = want[rid]
        got = rec.get("span_sha256")
        same = got == span_sha256(span) if got is not None else (rec.get("answer") or "") == span
        if rec.get("kind") != kind or not same:
            raise RunStoreError(f"{path}: record {rid!r} judged another answer than the run's ({kind} span "
                                f"{span[:40]!r}); the file belongs to another run or was edited")
    check_verdicts(judge, path)
    missing = {k: sum(1 for rid, (kind, _) in want.items() if kind == k and rid not in judge) for k in REQUEST_KINDS}
    return Coverage(n_requests=len(want), n_judged=sum(rid in judge for rid in want), missing=missing)


def parse_settings(rec: Mapping[str, Any]) -> dict[str, Any]:
    """The reply-parsing settings a record was judged with: its own ``parse`` block, or (older files) the shipped
    judge prompts' when the record's ``prompts_sha256`` is theirs, else the release's defaults (12 words,
    ``ABSTAIN``, quotes and asterisks stripped: :func:`memtoc.scoring.judge.rules.parse_extraction`)."""
    own = rec.get("parse")
    if isinstance(own, Mapping):
        return dict(own)
    from memtoc.scoring.judge.prompts import load_judge_prompts

    shipped = load_judge_prompts(None)
    if (rec.get("judge") or {}).get("prompts_sha256") == shipped.sha256:
        return {"max_words": shipped.max_words, "abstain_token": shipped.abstain_token,
                "strip_chars": shipped.strip_chars}
    return {}


def check_verdicts(judge: Mapping[str, Mapping[str, Any]], path: str | Path) -> None:
    """Every stored verdict is the one its stored reply gives, and every stored answer text is the one hashed.

    The judged layer applies ``verdict``; re-deriving it from ``reply`` with the same parser means an edited
    verdict (or an edited answer text, which the span hash alone would not reveal) cannot change a metric."""
    from memtoc.scoring.judge.rules import parse_record

    for rid, rec in judge.items():
        answer, digest = rec.get("answer"), rec.get("span_sha256")
        if answer is not None and digest is not None and span_sha256(answer) != digest:
            raise RunStoreError(f"{path}: record {rid!r}: its answer text {str(answer)[:40]!r} is not the span it "
                                "was judged on (span_sha256 differs); the record was edited")
        if "verdict" not in rec or rec.get("kind") not in REQUEST_KINDS:
            raise RunStoreError(f"{path}: record {rid!r} has no verdict or an unknown kind {rec.get('kind')!r}")
        settings = {} if rec["kind"] == "ack" else parse_settings(rec)
        derived = parse_record(rec, **settings)
        if derived != rec["verdict"]:
            raise RunStoreError(f"{path}: record {rid!r}: its verdict {rec['verdict']!r} is not what its reply "
                                f"gives ({derived!r}); the record was edited")
