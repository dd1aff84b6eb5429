"""The vocabulary has one source: ``memtoc/core/vocab.py``.

An AST walk over every package fails when a vocabulary tuple (conditions, formulations, interventions, frames,
closed-book modes, cells, outcomes, behaviours, code-executor conditions / policies / splits) is defined
anywhere else, either under one of the vocabulary's names or as a literal with the same members (a hard-coded
``choices=("none", "warn", ...)`` in a parser).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from memtoc.core import vocab

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("memtoc", "activations", "probes", "steering", "benchmarks")
NAMES = {"CONDITIONS", "ALL_CONDITIONS", "FORMULATIONS", "INTERVENTIONS", "FRAMES", "CLOSED_BOOK_MODES", "CELLS",
         "OUTCOMES", "BEHAVIOURS", "POLICIES", "QUESTION_SETS", "TOOL_CONDITIONS", "CORRUPTED_CONDITIONS",
         "FIRST_CALLS", "PROTOCOLS", "ABLATIONS", "PROMPT_ARMS"}
#: Every vocabulary tuple with at least three members, as a set (order-free: a reordered copy is still a copy).
VALUES = {frozenset(v): k for k, v in vars(vocab).items()
          if k.isupper() and isinstance(v, tuple) and len(v) >= 3}


def _sources() -> list[Path]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    return [p for p in files if p != REPO / "memtoc" / "core" / "vocab.py"]


def _literal_strings(node: ast.AST) -> frozenset[str] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return frozenset(e.value for e in node.elts)  # type: ignore[attr-defined]
    return None


def copies_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                # a sequence under a vocabulary name (a dict, e.g. a label encoding, is not a vocabulary)
                if name in NAMES and isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.BinOp, ast.Subscript)):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name} defined outside memtoc.core.vocab")
        members = _literal_strings(node)
        if members is not None and members in VALUES:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: a literal copy of vocab.{VALUES[members]}")
    return found


def test_vocabulary_is_defined_only_in_the_vocab_module():
    problems = [msg for p in _sources() for msg in copies_in(p)]
    assert problems == []


def test_the_walk_finds_a_copy(tmp_path):
    """The check itself can fail: a module that redefines CONDITIONS or hard-codes the interventions."""
    src = ('CONDITIONS = ("a", "b")\n'
           'def f(p):\n    p.add_argument("--x", choices=("abstain-and-flag", "none", "warn", "source-priority"))\n')
    probe = tmp_path / "probe.py"
    probe.write_text(src)
    global REPO
    old = REPO
    REPO = tmp_path
    try:
        found = copies_in(probe)
    finally:
        REPO = old
    assert len(found) == 2 and "CONDITIONS defined" in found[0] and "vocab.INTERVENTIONS" in found[1]


@pytest.mark.parametrize("module, name", [("memtoc.bench.questions", "CONDITIONS"), ("memtoc.scoring.metrics", "CONDITIONS"),
                                          ("memtoc.scoring.metrics", "FORMULATIONS"), ("memtoc.bench.prompts", "FORMULATIONS"),
                                          ("memtoc.tasks.codeexec.conditions", "CONDITIONS")])
def test_modules_use_the_one_tuple(module, name):
    import importlib

    value = getattr(importlib.import_module(module), name)
    assert any(value is v for v in vars(vocab).values())


def test_prompt_file_and_vocabulary_agree():
    from memtoc.bench.prompts import load_prompt_set

    ps = load_prompt_set()
    assert tuple(ps.interventions) == vocab.INTERVENTIONS
    assert tuple(ps.ablations) == vocab.ABLATIONS
    assert ps.prompt_arms == vocab.PROMPT_ARMS
    assert tuple(ps.formulations) == vocab.FORMULATIONS
    for spec in ps.formulations.values():
        assert set(spec["frames"]) == set(vocab.FRAMES)
        assert {k.removeprefix("closed_book_") for k in spec if k.startswith("closed_book_")} == \
            set(vocab.CLOSED_BOOK_MODES)
