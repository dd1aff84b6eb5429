"""``memtoc lens fit``, ``memtoc rank-table`` and ``memtoc probe``: how their results are shown (tyro parses
their options from the jobs' configs, :mod:`memtoc.cli.parse`)."""

from __future__ import annotations

from typing import Any


def present_lens_fit(res: Any, cfg: Any) -> int:
    """``memtoc lens fit``'s console output: the fit's notes, then where the lens (or the resumable state) is."""
    for note in res.notes:
        print(note)
    if res.complete:
        print(f"lens written to {res.path}: {res.n_used} sequences used of {res.n_planned} "
              f"({res.seconds:.1f} s this call)")
        return 0
    print(f"stopped after {res.n_done} of {res.n_planned} sequences; state in {res.path}.partial -- re-run the "
          "same command to resume")
    return 0


def present_rank_table(res: Any, cfg: Any) -> int:
    """``memtoc rank-table``'s console output: the summary tables (not the per-episode rows), the files written."""
    from probes.rank_table import to_markdown

    md = to_markdown(res.table)
    print(md.split("## Episodes")[0].rstrip())
    print("\nwritten: " + ", ".join(str(p) for p in res.files.values()))
    return 0


def present_probe(res: Any, cfg: Any) -> int:
    """``memtoc probe``'s console output: the table, the best site, the files written."""
    report, paths = res.report, res.files
    print(paths["markdown"].read_text(encoding="utf-8").rstrip())
    b = report.best()
    print(f"\nbest site {b.site}: AUROC {b.auroc_pooled:.3f} [{b.ci_low:.3f}, {b.ci_high:.3f}]")
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0


def present_patch(res: Any, cfg: Any) -> int:
    """``memtoc patch``'s console output: the top cells, the agreement, the files written."""
    from memtoc.jobs.patch import to_markdown

    print(to_markdown(res).rstrip())
    print("written: " + ", ".join(str(p) for p in res.files.values()))
    return 0


def present_features(res: Any, cfg: Any) -> int:
    """``memtoc features``: where the page is and what it shows."""
    print(f"{len(res.views)} latents -> {res.files['html']} (and {res.files['json']})")
    return 0
