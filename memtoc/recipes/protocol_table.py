"""docs/protocol.md's table of paper recipes, generated from the recipes so it cannot drift from them.

Each paper recipe carries its row in comment lines (the recipe format has no free top-level keys):
``# paper-item:`` (the paper's table or section), ``# paper-status:`` (what runs here and what does not), and,
when the recipe itself cannot say it, ``# paper-family:``, ``# paper-layer:``, ``# paper-draws:``. The family,
layer and draws are otherwise read from the recipe's statistics step (``holm_family``, ``score_layer``,
``n_boot`` / ``n_perm`` / ``seed``).

``python -m memtoc.recipes.protocol_table --write docs/protocol.md`` rewrites the block between the markers;
``--check`` exits 1 when the file differs (the test suite runs the same comparison).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Sequence

from memtoc.core.errors import MemtocError

REPO = Path(__file__).resolve().parents[2]
BEGIN = "<!-- protocol-table:begin (generated: python -m memtoc.recipes.protocol_table --write docs/protocol.md) -->"
END = "<!-- protocol-table:end -->"
#: the recipes that reproduce a paper result, in table order
PAPER_RECIPES: tuple[str, ...] = (
    "experiments/paper/table1_finetuning.toml", "experiments/paper/table4_baseline_arms.toml",
    "experiments/paper/table5_prompting_ladder.toml", "experiments/paper/controls.toml",
    "experiments/paper/protocol_ablation_switch.toml", "experiments/paper/distractor_distance.toml",
    "experiments/sae_steering.toml", "experiments/transfer.toml", "experiments/rank_table.toml",
    "experiments/codeexec_main_table.toml", "experiments/codeexec_probe_and_steer.toml",
    "experiments/overreliance/policy_contrasts.toml", "experiments/analyses/app_g_tool_choice.toml",
    "experiments/analyses/permissive_sensitivity.toml", "experiments/analyses/seed_robustness.toml",
    "experiments/analyses/presentation_formats.toml", "experiments/analyses/reverse_transfer.toml",
    "experiments/analyses/scale_70b.toml", "experiments/analyses/base_vs_instruct.toml",
)
_STATS_COMMANDS = (("study",), ("transfer-table",), ("codeexec", "policy-contrasts"))
_META = re.compile(r"^#\s*paper-(item|status|family|layer|draws):\s*(.+?)\s*$")


def recipe_meta(path: Path) -> dict[str, str]:
    """The ``# paper-KEY:`` comment lines of a recipe (a key may continue on the next ``paper-KEY:`` line)."""
    meta: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _META.match(line)
        if m:
            meta[m.group(1)] = f"{meta[m.group(1)]} {m.group(2)}" if m.group(1) in meta else m.group(2)
    return meta


def recipe_row(rel: str, root: Path = REPO) -> dict[str, str]:
    """One table row: paper item, recipe, family, layer, draws/seed, status."""
    from memtoc.recipes.experiment import load_recipe

    path = root / rel
    meta = recipe_meta(path)
    for key in ("item", "status"):
        if key not in meta:
            raise MemtocError(f"{rel}: no '# paper-{key}:' line (docs/protocol.md's table is built from it)")
    recipe = load_recipe(path)
    stats = [st for st in recipe.steps if tuple(st.command) in _STATS_COMMANDS]
    args: dict[str, Any] = dict(stats[-1].args) if stats else {}
    family = meta.get("family") or (f"`{args['holm_family']}`" if "holm_family" in args else "–")
    layer = meta.get("layer") or args.get("score_layer") or "–"
    if "draws" in meta:
        draws = meta["draws"]
    else:
        parts = [f"{k} {args.get(k, recipe.defaults.get(k))}" for k in ("n_boot", "n_perm", "seed")
                 if args.get(k, recipe.defaults.get(k)) is not None]
        draws = ", ".join(parts) or "job defaults"
    return {"item": meta["item"], "recipe": f"`{rel}`", "family": family, "layer": str(layer), "draws": draws,
            "status": meta["status"]}


def render(rels: Sequence[str] = PAPER_RECIPES, root: Path = REPO) -> str:
    rows = [recipe_row(rel, root) for rel in rels]
    lines = [BEGIN, "| paper item | recipe | family | layer | draws / seed | status |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['item']} | {r['recipe']} | {r['family']} | {r['layer']} | {r['draws']} | {r['status']} |"
              for r in rows]
    return "\n".join([*lines, END])


def update(doc: Path, table: str) -> str:
    """``doc``'s text with the generated block replaced by ``table``."""
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise MemtocError(f"{doc}: no generated-table markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + table + tail


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m memtoc.recipes.protocol_table [DOC] [--write | --check]`` (no parser: the recipe layer builds
    none; the words are few)."""
    args = list(sys.argv[1:] if argv is None else argv)
    write, check = "--write" in args, "--check" in args
    rest = [x for x in args if x not in ("--write", "--check")]
    if (write and check) or len(rest) > 1 or any(x.startswith("-") for x in rest):
        print("usage: python -m memtoc.recipes.protocol_table [DOC] [--write | --check]", file=sys.stderr)
        return 2
    doc = Path(rest[0] if rest else REPO / "docs" / "protocol.md")
    if not (write or check):
        print(render())
        return 0
    new = update(doc, render())
    if write:
        doc.write_text(new, encoding="utf-8")
    elif new != doc.read_text(encoding="utf-8"):
        print(f"{doc}: the recipes' table differs; run python -m memtoc.recipes.protocol_table --write {doc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
