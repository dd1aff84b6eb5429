"""The quickstart notebook (``examples/quickstart.ipynb``): committed without outputs, and it runs top to bottom
on the embedded default model (the same cells a reader runs; nbclient, the notebook's own kernel). A file of its own,
so pytest-xdist's ``--dist loadfile`` can run it beside the README snippet (tests/test_examples.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def test_the_committed_notebook_has_no_outputs() -> None:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert dirty == [], f"cells {dirty} carry outputs: strip them (jupyter nbconvert --clear-output --inplace)"


@pytest.mark.real_model
def test_the_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch, default_model) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # the kernel imports this checkout, and the jobs' temporary directories land under tmp_path
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    nbclient.NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    noise = [o.text for o in outputs if o.output_type == "stream" and "IProgress not found" in o.text]
    assert noise == [], "tqdm's notebook bars need ipywidgets (the notebook extra)"
    warned = [o.text for o in outputs if o.output_type == "stream" and "FRAME FALLBACK" in o.text]
    assert warned == [], "the demo set has its own tool schemas: no frame fallback"
    assert any(o.output_type == "display_data" and "image/png" in o.get("data", {}) for o in outputs)  # the plot
