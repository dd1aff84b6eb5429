"""Tests the docs cite by name (``tests/<path>.py::<test>``) exist: a table that says how a row is tested must
name a test that is there, so renaming or deleting one shows up here, not in a reader's search."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _doc_files() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test")}


def citations() -> list[tuple[Path, str, str]]:
    return [(doc, f, name) for doc in _doc_files() for f, name in CITATION.findall(doc.read_text(encoding="utf-8"))]


def test_every_cited_test_exists():
    cited = citations()
    missing = []
    for doc, f, name in cited:
        path = REPO / f
        if not path.is_file() or name not in _test_names(path):
            missing.append(f"{doc.relative_to(REPO)}: {f}::{name}")
    assert not missing, "docs cite tests that do not exist:\n" + "\n".join(missing)


def test_the_backends_table_cites_a_test_for_every_request_kind():
    text = (REPO / "docs" / "backends.md").read_text(encoding="utf-8")
    start = text.index("| request kind | hooked |")
    table = text[start:text.index("\n\n", start)].splitlines()[2:]          # the rows under the header
    kinds = [row.split("|")[1] for row in table]
    for kind in ("untreated generation", "capture", "per-request edits", "sweep", "rank table"):
        assert any(kind in k for k in kinds), kind
    for row in table:
        assert CITATION.search(row.split("|")[-2]), row      # the last column names at least one test


def test_a_missing_test_would_be_found(tmp_path):
    """The check can fail: a citation of a name the file does not define is reported."""
    f = REPO / "tests" / "test_doc_citations.py"
    assert "test_every_cited_test_exists" in _test_names(f)
    assert "test_no_such_test" not in _test_names(f)
    assert CITATION.findall("see `tests/test_doc_citations.py::test_no_such_test`") == [
        ("tests/test_doc_citations.py", "test_no_such_test")]
