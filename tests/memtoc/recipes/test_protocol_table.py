"""docs/protocol.md's recipe table is generated from the recipes: it fails when the two differ, and a
recipe without its paper lines is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtoc.core.errors import MemtocError
from memtoc.recipes import protocol_table as pt

REPO = Path(__file__).resolve().parents[3]


def test_protocol_md_table_is_the_generated_one():
    doc = REPO / "docs" / "protocol.md"
    assert pt.update(doc, pt.render()) == doc.read_text(encoding="utf-8"), \
        "docs/protocol.md differs from the recipes: python -m memtoc.recipes.protocol_table --write docs/protocol.md"
    assert pt.main([str(doc), "--check"]) == 0


def test_table_reads_family_layer_and_draws_from_the_recipe(tmp_path):
    row = pt.recipe_row("experiments/paper/table4_baseline_arms.toml")
    assert (row["family"], row["layer"]) == ("`B`", "judged (Err.: scorer)")
    row = pt.recipe_row("experiments/overreliance/policy_contrasts.toml")
    assert row["draws"] == "n_boot 10000, n_perm 20000, seed 20260918"
    # a changed recipe changes the table, so a stale docs/protocol.md fails the test above
    src = (REPO / "experiments" / "paper" / "table5_prompting_ladder.toml").read_text(encoding="utf-8")
    (tmp_path / "experiments" / "paper").mkdir(parents=True)
    (tmp_path / "experiments" / "paper" / "x.toml").write_text(src.replace('holm_family = "B"', 'holm_family = "A"'),
                                                               encoding="utf-8")
    assert pt.recipe_row("experiments/paper/x.toml", tmp_path)["family"] == "`A`"
    (tmp_path / "experiments" / "paper" / "y.toml").write_text(
        "\n".join(line for line in src.splitlines() if not line.startswith("# paper-")), encoding="utf-8")
    with pytest.raises(MemtocError, match="no '# paper-item:' line"):
        pt.recipe_row("experiments/paper/y.toml", tmp_path)


def test_every_paper_recipe_says_what_the_paper_leaves_open():
    """Issue 38: where a paper is silent, the recipe says 'paper silent; ours' (its choice, or where the choices
    are listed); every recipe of the table carries the note."""
    for rel in pt.PAPER_RECIPES:
        assert "paper silent; ours" in (REPO / rel).read_text(encoding="utf-8").lower(), rel
