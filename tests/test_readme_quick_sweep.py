"""The README's quick sweep shows an effect: its direction and sweep lines, typed as written on the default model,
change at least one answer at the line's largest strength (a quick example that changes nothing shows nothing)."""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_line(start: str) -> list[str]:
    """The README's first ``memtoc`` command starting with ``start`` (continuation lines joined, comment cut)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.startswith(start):
                return shlex.split(line.split("  #", 1)[0])[1:]
    raise AssertionError(f"no README line starts with {start!r}")


@pytest.mark.slow
@pytest.mark.real_model
def test_the_readme_quick_sweep_changes_an_answer(tmp_path, monkeypatch, default_model) -> None:
    from memtoc.cli import main

    monkeypatch.chdir(tmp_path)
    # the README's store at the direction's site only (its labels are the conditions; the lines below read it)
    assert main(["extract", "--model", "default", "--benchmark", "demo", "--conditions", "tool_wrong,tool_right",
                 "--limit", "4", "--layers", "15", "--position-kinds", "last_input", "--out", "acts.h5",
                 "--no-progress"]) == 0
    direction, sweep = readme_line("memtoc direction "), readme_line("memtoc sweep ")
    assert direction[direction.index("--activations") + 1] == "acts.h5" and "--limit" in sweep
    assert main(direction) == 0
    assert main(sweep + ["--no-progress"]) == 0
    out = Path(sweep[sweep.index("--out") + 1])
    rows = list(csv.DictReader((out / "sweep.csv").open(encoding="utf-8")))
    top = max(rows, key=lambda r: float(r["strength"]))
    assert float(top["strength"]) > 0 and int(top["outcome_changed"]) > 0, rows
