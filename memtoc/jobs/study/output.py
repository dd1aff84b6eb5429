"""Write a study as ``study.md`` (readable tables), one CSV per table and ``study.json``, each atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtoc.core.errors import RunStoreError
from memtoc.core.fileio import write_json_atomic, write_records_csv_atomic, write_text_atomic
from memtoc.jobs.study.analysis import POOLED, Study
from memtoc.jobs.study.families import size_line
from memtoc.core.textfmt import markdown_table

TABLE_TITLES = {
    "paired": "Paired changes (arm - base) on common support; sign-flip p, Holm inside the declared families",
    "criterion": "Asymmetric criterion per formulation and pooled (Table 5)",
    "near_far": "Near vs far distractor (far - near), paired on the questions that have both",
    "controls": "Control arms (control - reference) within one run: error payloads vs service-unavailable, "
                "NoopTool vs no tool",
    "ztests": "Cross-model two-proportion z tests (each model on its own cell), Holm over model pairs",
    "stability": "Stability rule: an ordering holds only if it holds pooled and under every formulation",
    "rankings": "Rankings per slice",
    "model_pairs": "Paired cross-model contrasts (B - A) on common support, Holm over the declared pairs "
                   "(the base-versus-instruct family)",
}


#: what each layer is, for the line every table of a study carries
LAYER_NOTES = {
    "judged": "judged layer (the paper's, App. B): retention, the tool-following rates and case accuracy with the "
              "judge's span normalization applied (judge.jsonl); tool-error abstention and no-conflict accuracy "
              "stay the deterministic scorer's values, as in the paper",
    "deterministic": "deterministic layer: the scorer's own labels, no judge (the paper's layer for tool-error "
                     "abstention and no-conflict accuracy only)",
}


def layer_title(title: str, layer: str) -> str:
    """A table title that names the layer it reads (every paper table states its layer)."""
    return f"{title} [{layer} layer]"


def criterion_matrix(study: Study) -> list[dict[str, Any]]:
    """Table 5's layout: one row per contrast, one column per slice, cells ``met`` / ``fail[k][t]``."""
    out: dict[str, dict[str, Any]] = {}
    for r in study.criterion:
        out.setdefault(r["contrast"], {"contrast": r["contrast"]})[r["slice"]] = r["code"]
    return list(out.values())


def format_markdown(study: Study) -> str:
    s = study.settings
    judges = sorted({str((r.judge or {}).get("model")) for r in study.runs if r.judge})
    parts = [f"# MemToC study: {len(study.contrasts)} contrasts over "
             f"{len({r.model for r in study.runs})} models",
             "",
             f"Layer: {LAYER_NOTES.get(s.layer, s.layer)}" + (f"; judge {', '.join(judges)}" if judges else "")
             + ".",
             "",
             f"Holm families (--holm-family {s.family!r}, applied per slice to: {', '.join(s.holm_metrics)}):"]
    parts += [f"- `{name}`: {', '.join(members)}" for name, members in study.families.items()] or ["- none"]
    parts += [f"- {size_line(name, size)}" for name, size in study.family_sizes.items()]
    parts += ["", f"alpha {s.alpha}; bootstrap {s.n_boot} draws, sign-flip {s.n_perm} draws, seed {s.seed}; "
              f"slices: {', '.join(study.slices)} ({POOLED} = all formulations' units, clustered by question).",
              "", "## " + layer_title(TABLE_TITLES["criterion"], s.layer), "",
              "`met`, or `fail` with `k` (retention gain not significant at the Holm p) and/or `t` (significant "
              "fall in correct-tool following).", "", markdown_table(criterion_matrix(study)), ""]
    paired_cols = ["contrast", "slice", "metric", "n_common", "value_base", "value_arm", "delta", "ci_low",
                   "ci_high", "p", "family", "p_holm"]
    parts += ["## " + layer_title(TABLE_TITLES["paired"], s.layer), "", markdown_table(study.paired, paired_cols), ""]
    for key in ("near_far", "controls", "ztests", "stability", "rankings", "model_pairs"):
        parts += ["## " + layer_title(TABLE_TITLES[key], s.layer), "", markdown_table(study.tables()[key]), ""]
    n_pairs = len(study.stability)
    n_stable = sum(bool(r["stable"]) for r in study.stability)
    parts.append(f"Stable cross-model orderings: {n_stable} of {n_pairs} model pairs"
                 + (" (no cross-model ordering remains stable)." if n_pairs and not n_stable else "."))
    return "\n".join(parts) + "\n"


def write_study(study: Study, out_dir: str | Path) -> list[Path]:
    """Write ``study.md``, ``study.json`` and ``<table>.csv``; every file through a temporary file and a rename."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunStoreError(f"cannot create study output directory {out}: {exc}") from exc
    written = [out / f"{name}.csv" for name in study.tables()]
    for path, rows in zip(written, study.tables().values()):
        write_records_csv_atomic(path, rows)
    write_json_atomic(out / "study.json", study.to_dict())
    write_text_atomic(out / "study.md", format_markdown(study))
    return [*written, out / "study.json", out / "study.md"]
