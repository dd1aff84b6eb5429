"""The remaining jobs as ``mt.*`` functions (``memtoc.api.more_jobs``) write what their commands write: the README's
SAE chain (extract with full sequences -> sae train -> mine-features), judge -> ack export, report and study.
Tiny random model throughout."""

from __future__ import annotations

import json
import warnings

import pytest

import memtoc as mt

SMALL = {"limit": 4, "max_new_tokens": 6, "conditions": "tool_wrong,tool_right", "progress": False}


@pytest.fixture(scope="module")
def runs(tiny_backend, tmp_path_factory):
    root = tmp_path_factory.mktemp("more")
    base = mt.evaluate(backend=tiny_backend, out=root / "base", **SMALL)
    edit = mt.vector_edit([1.0] * tiny_backend.parts.d_model, layers=[2], strength=2.0)
    arm = mt.evaluate(backend=tiny_backend, out=root / "arm", edit=edit, **SMALL)
    return root, base, arm


def test_the_sae_chain_runs_on_a_full_sequence_extraction(tiny_backend, runs) -> None:
    pytest.importorskip("sae_lens")
    root, base, _ = runs
    acts = mt.extract(backend=tiny_backend, out=root / "acts.h5", limit=4, conditions="tool_wrong,tool_right",
                      layers="2", positions="last_input,all", run=base, progress=False)
    sae = mt.sae_train(acts, layers=2, out=root / "sae", steps=20, d_sae=16, k=4)
    assert any(f.suffix == ".safetensors" for f in sae.files)
    # the random tiny model neither follows nor keeps: mining gets as far as its behaviour check, which names it
    from steering.mi import MiningError

    with pytest.raises(MiningError, match="too few episodes of each behaviour in fold A"):
        mt.mine_features(acts, sae=f"2={sae.path}", fit_fold="A", run=base, out=root / "mine", fvu_threshold=10.0)


def test_judge_then_ack_export(tiny_model_dir, runs, tmp_path) -> None:
    _, base, _ = runs
    judged = mt.judge(base, judge_model=str(tiny_model_dir), device="cpu", progress=False)
    assert judged.path.name == "judge.jsonl" and judged.path.read_text().strip()
    recs = [json.loads(x) for x in judged.path.read_text().splitlines()]
    assert recs and all("verdict" in r for r in recs)
    # the random tiny model has no arbitration episodes to annotate: the export reads the judge file, says so
    from memtoc.core.errors import MemtocError

    with pytest.raises(MemtocError, match="nothing to annotate"):
        mt.ack_export(base, sheet=tmp_path / "ack.csv", detector="llm")
    assert not (tmp_path / "ack.csv").exists()


def test_report_and_study(runs, tmp_path) -> None:
    _, base, arm = runs
    rep = mt.report(base, out=tmp_path / "rep")
    assert [f.name for f in rep.files] == ["report.html", "report.md"] and all(f.stat().st_size for f in rep.files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = mt.study(base, arms=[arm], out=tmp_path / "study", n_boot=50, n_perm=50)
    assert st.files and any(f.suffix == ".md" for f in st.files)


def test_a_keyword_outside_its_value_set_is_refused_naming_it(runs) -> None:
    _, base, _ = runs
    with pytest.raises(mt.APIError, match=r"cell='bogus' is not one of agree, arb, .*all"):
        mt.rank_table(base, cell="bogus")
