"""The API reference: pdoc builds a page per package from the docstrings, and any warning fails the build."""

from __future__ import annotations

import warnings

import pytest

PACKAGES = ("memtoc", "activations", "probes", "steering")


def test_the_api_reference_builds_without_warnings(tmp_path) -> None:
    pdoc = pytest.importorskip("pdoc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the sandbox prelude runs inside the executor's subprocess only (it is not importable on its own terms)
        pdoc.pdoc(*PACKAGES, "!memtoc.tasks.codeexec._sandbox_prelude", output_directory=tmp_path)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    for pkg in PACKAGES:
        assert (tmp_path / f"{pkg}.html").is_file()
    api = (tmp_path / "memtoc" / "api.html").read_text(encoding="utf-8")
    for name in ("evaluate", "extract", "probe", "direction", "sweep", "rank_table", "compare", "function_edit"):
        assert f'id="{name}"' in api, name
