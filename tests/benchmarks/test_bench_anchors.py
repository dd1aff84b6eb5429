"""``benchmarks/bench_anchors.py`` at tiny sizes on a tiny random model: every row's outputs agree between this
toolkit and TransformerLens, nnsight and transformers (agreement only: no timing is asserted)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

from benchmarks import bench_anchors  # noqa: E402

TINY = ["--rounds", "1", "--n-capture", "4", "--batch-size", "2", "--n-pairs", "1", "--n-steer", "2",
        "--n-sweep", "1", "--new-tokens", "4", "--site", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("anchors") / "anchors.json"
    return bench_anchors.main(["--model", str(tiny_model_dir), *TINY, "--out", str(out)]), out


def test_every_row_agrees_with_every_anchor(result) -> None:
    res, out = result
    assert set(res["rows"]) == set(bench_anchors.ROWS) and res["agree"] is True
    cap = res["rows"]["capture"]["agreement"]
    assert set(cap) == {f"{a}:{m}" for a in bench_anchors.ANCHORS for m in ("last_input", "all")}
    assert all(v["ok"] and v["max_rel_diff"] <= bench_anchors.CAPTURE_ATOL for v in cap.values())
    patch = res["rows"]["patch"]
    assert set(patch["agreement"]) == {"tl", "nnsight"}
    assert patch["sizes"]["cells_per_pair"][0] == 3 * 3          # 3 blocks x 3 roles of the tiny model
    assert all(v["cells"] == 9 and v["max_abs_diff"] <= bench_anchors.PATCH_ATOL for v in patch["agreement"].values())
    steer = res["rows"]["steer"]["agreement"]
    assert all(v["identical_rows"] == v["rows"] == 2 for v in steer.values())
    sweep = res["rows"]["sweep"]["agreement"]
    assert all(set(v["identical_rows_per_strength"]) == {"0", "2", "4", "8"} and v["ok"] for v in sweep.values())
    table = out.with_suffix(".md").read_text()
    for work in ("capture all", "capture last_input", "patch", "steer", "sweep"):
        assert f"| {work} |" in table
    assert "transformer_lens 3." in table and "nnsight 0." in table


def test_a_wrong_effect_is_a_disagreement(tiny_model_dir, monkeypatch) -> None:
    """The patching check compares every cell: one effect off by 1e-3 fails it."""
    from memtoc.backends.hf import HFBackend
    from probes import patching

    real = patching.exact_patching

    def off(*a, **k):
        res = real(*a, **k)
        res.effects["blocks.1.hook_resid_post"]["final"] += 1e-3
        return res

    monkeypatch.setattr(patching, "exact_patching", off)
    m = bench_anchors.Models(HFBackend.load(str(tiny_model_dir), device="cpu", dtype="float32"), ("nnsight",))
    args = bench_anchors.argparse.Namespace(n_pairs=1, rounds=1, patch_every=1)
    res = bench_anchors.row_patch(m, args)
    assert res.agree is False and res.agreement["nnsight"]["max_abs_diff"] == pytest.approx(1e-3, rel=1e-2)
