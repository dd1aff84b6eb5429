"""Validation of the embedded demo set (memtoc/data/demo): schema, keys, distractor hygiene, folds.

Loads the files with `json` only, so the check does not depend on any toolkit loader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DEMO_DIR = Path(__file__).resolve().parents[3] / "memtoc" / "data" / "demo"
QUESTIONS = DEMO_DIR / "questions.jsonl"
FOLDS = DEMO_DIR / "folds.json"

KEYS = [
    "id", "instance_id", "hop_idx", "qkey", "question", "gold_answer", "aliases", "gold_kind",
    "family", "final_near", "far", "source", "method", "validation_status", "validation_note",
]
ALLOWED_KINDS = {"person", "place", "year", "date", "work", "organization", "other_string"}
MAY_BE_EMPTY = {"aliases", "validation_note"}
ARTICLES = {"a", "an", "the"}


def _load_rows() -> list[dict]:
    with QUESTIONS.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _load_folds() -> dict:
    with FOLDS.open(encoding="utf-8") as fh:
        return json.load(fh)


ROWS = _load_rows()


def _qkey(question: str) -> str:
    """Lower-case, drop every character that is not an ASCII letter, digit or space, collapse."""
    return " ".join(re.sub(r"[^a-z0-9 ]", "", question.lower()).split())


def _forms(text: str) -> set[str]:
    """Normalised forms of an answer string used for the substring checks.

    Lower-cased; non-alphanumerics either removed or turned into spaces (scorers differ on
    hyphens: "Moby-Dick" -> "mobydick" / "moby dick"); each with and without English articles.
    """
    out = set()
    for repl in ("", " "):
        s = "".join(c if (c.isalnum() or c.isspace()) else repl for c in text.lower())
        words = s.split()
        out.add(" ".join(words))
        out.add(" ".join(w for w in words if w not in ARTICLES))
    return {f for f in out if f}


def _overlaps(a: str, b: str) -> bool:
    """True if some normalised form of one string is a substring of some form of the other."""
    return any(x in y or y in x for x in _forms(a) for y in _forms(b))


def test_row_count_and_ids():
    assert len(ROWS) == 60
    ids = [r["id"] for r in ROWS]
    assert len(set(ids)) == 60
    assert sorted(r["instance_id"] for r in ROWS) == list(range(60))
    for r in ROWS:
        assert isinstance(r["instance_id"], int) and r["hop_idx"] == 0
        assert r["id"] == f"{r['instance_id']}.{r['hop_idx']}"


def test_qkeys_unique():
    qkeys = [r["qkey"] for r in ROWS]
    assert len(set(qkeys)) == len(qkeys)


def test_file_is_utf8_without_ascii_escapes():
    text = QUESTIONS.read_text(encoding="utf-8")
    assert "\\u" not in text  # written with ensure_ascii=False
    assert len(text.splitlines()) == 60


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_row_schema(row):
    assert list(row) == KEYS
    for key in KEYS:
        value = row[key]
        if key in MAY_BE_EMPTY:
            assert value is not None
            continue
        assert value is not None and value != "", key
    assert isinstance(row["aliases"], list)
    assert all(isinstance(a, str) and a.strip() for a in row["aliases"])
    assert row["validation_note"] == ""
    assert row["question"].endswith("?")
    assert row["qkey"] == _qkey(row["question"])
    assert row["gold_kind"] in ALLOWED_KINDS
    assert row["family"] == "free_form"
    assert row["source"] == "demo_authored" and row["method"] == "demo_authored"
    assert row["validation_status"] == "PASS"
    for key in ("gold_answer", "final_near", "far"):
        assert isinstance(row[key], str) and row[key] == row[key].strip()
    if row["gold_kind"] == "year":
        for key in ("gold_answer", "final_near", "far"):
            assert re.fullmatch(r"\d{3,4}", row[key]), (key, row[key])


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_distractors_are_clean(row):
    gold, near, far = row["gold_answer"], row["final_near"], row["far"]
    assert len({gold.lower(), near.lower(), far.lower()}) == 3
    accepted = [gold, *row["aliases"]]
    for distractor in (near, far):
        assert distractor.lower() not in {a.lower() for a in accepted}
        for answer in accepted:
            assert not _overlaps(distractor, answer), (distractor, answer)
    assert not _overlaps(near, far), (near, far)


def test_kind_mix():
    counts: dict[str, int] = {}
    for r in ROWS:
        counts[r["gold_kind"]] = counts.get(r["gold_kind"], 0) + 1
    assert counts["person"] == 20
    assert counts["place"] == 15
    assert counts["year"] == 10
    assert counts["date"] == 5
    assert counts["work"] == 5
    assert counts.get("organization", 0) + counts.get("other_string", 0) == 5


def test_folds_partition_ids():
    folds = _load_folds()
    assert folds["schema_version"] == "memtoc-demo-folds-v1"
    assert folds["seed"] == 0
    assert set(folds["folds"]) == {"A", "B"}
    a, b = folds["folds"]["A"], folds["folds"]["B"]
    assert len(a) == len(set(a)) == 30
    assert len(b) == len(set(b)) == 30
    assert not set(a) & set(b)
    assert set(a) | set(b) == {r["id"] for r in ROWS}
    # Similar kind mix in both folds.
    kind = {r["id"]: r["gold_kind"] for r in ROWS}
    for k in ALLOWED_KINDS:
        na = sum(kind[i] == k for i in a)
        nb = sum(kind[i] == k for i in b)
        assert abs(na - nb) <= 1, (k, na, nb)
