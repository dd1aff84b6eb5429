"""The lens registry: the toy ``diagonal`` lens of docs/extending.md, registered exactly as the doc shows, run
through the rank table and ``memtoc rank-table --lens NAME=FILE`` and checked against an independent forward."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from memtoc.runs.runstore import RunStore
from probes.lenses import Lens, lens_class, lens_names, make_lenses, parse_lens_option, register_lens, unregister_lens
from probes.model import ModelParts, ProbeError
from probes.rank_table import RankTableConfig, build_rank_table

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
LENSES_INIT = ROOT / "probes" / "lenses" / "__init__.py"


def doc_block(title: str) -> str:
    m = re.search(r'```python title="' + re.escape(title) + r'"\n(.*?)```', DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/extending.md has no code block titled {title}"
    return m.group(1)


@pytest.fixture(scope="module")
def diagonal_lens():
    """Execute the doc's module as ``probes.lenses.diagonal`` (what the registration line would import)."""
    assert "diagonal" not in lens_names()
    ns = {"__name__": "probes.lenses.diagonal"}
    exec(compile(doc_block("probes/lenses/diagonal.py"), "docs/extending.md:probes/lenses/diagonal.py", "exec"), ns)
    try:
        yield ns["DiagonalLens"]
    finally:
        unregister_lens("diagonal")


def _gains(path: Path, sites, d: int, seed: int | None) -> dict[int, torch.Tensor]:
    g = torch.Generator().manual_seed(seed or 0)
    gains = {s: (torch.ones(d) if seed is None else 0.2 + 2 * torch.rand(d, generator=g)) for s in sites}
    save_file({f"site.{s}": v for s, v in gains.items()}, str(path))
    return gains


def test_registration_line_in_the_doc_matches_the_package():
    real = [ln for ln in LENSES_INIT.read_text(encoding="utf-8").splitlines() if ln.startswith("from probes.lenses import")]
    assert real == ["from probes.lenses import logit, jacobian, detached, jvp  # noqa: F401,E402  (registration on import)"]
    assert doc_block("probes/lenses/__init__.py").strip() == real[0].replace("jvp", "jvp, diagonal")


def test_builtin_lenses_and_option_parsing():
    assert lens_names()[:4] == ("logit", "jacobian", "detached", "jvp")
    assert lens_class("jacobian").needs_artifact and lens_class("detached").needs_factors
    assert not lens_class("jvp").reads_capture and not lens_class("logit").needs_artifact
    assert parse_lens_option(["jacobian=a.safetensors,logit", "detached", "logit"]) == \
        [("jacobian", "a.safetensors"), ("logit", None), ("detached", None)]
    assert parse_lens_option("jacobian,jacobian=b") == [("jacobian", "b")]
    with pytest.raises(ProbeError, match="two files"):
        parse_lens_option(["jacobian=a", "jacobian=b"])
    # --lens-file is the default file of every lens that needs one; a file for a lens that reads none is refused
    lenses = make_lenses([("logit", None), ("jacobian", None)], default_file="f.safetensors")
    assert [(ln.name, ln.file) for ln in lenses] == [("logit", None), ("jacobian", "f.safetensors")]
    with pytest.raises(ProbeError, match="needs --lens-file FILE or --lens jacobian=FILE"):
        make_lenses([("jacobian", None)])
    with pytest.raises(ProbeError, match="reads no file"):
        make_lenses([("logit", "x.safetensors")])
    with pytest.raises(ProbeError, match="unknown lens 'tuned'; choose from logit, jacobian, detached, jvp"):
        make_lenses([("tuned", None)])


def test_registry_refuses_a_second_registration_and_non_lenses(diagonal_lens):
    with pytest.raises(ValueError, match="already registered"):
        register_lens("diagonal")(type("Other", (Lens,), {}))
    with pytest.raises(TypeError, match="not a subclass"):
        register_lens("nothing")(type("NotALens", (), {}))
    assert lens_class("diagonal") is diagonal_lens and "nothing" not in lens_names()


def test_toy_lens_ranks_match_an_independent_computation(diagonal_lens, tiny_backend, arb_run, tmp_path):
    model, tok = tiny_backend.model, tiny_backend.tokenizer
    parts = ModelParts.of(model, len(tok))
    L, d = parts.n_layers, parts.d_model
    sites = [1, 2, 3]
    # all gains 1: the diagonal lens is the logit lens
    _gains(tmp_path / "ones.safetensors", sites, d, None)
    ones = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), sites=sites,
                                                          lenses=[f"diagonal={tmp_path / 'ones.safetensors'}"]))
    assert ones.meta["lenses"] == ["logit", "diagonal"] and ones.meta["lens_file"] == str(tmp_path / "ones.safetensors")
    for row in ones.episodes:
        assert row["lenses"]["diagonal"] == row["lenses"]["logit"]
    # random gains: the rank of the answer token under norm(g * x) read from a plain output_hidden_states forward
    gains = _gains(tmp_path / "g.safetensors", sites, d, seed=3)
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), sites=sites, lenses=["diagonal"],
                                                           lens_file=str(tmp_path / "g.safetensors"), batch_size=3))
    eps = {r["episode_id"]: r for r in RunStore.read(arb_run).episodes.records()}
    assert len(table.episodes) == 4
    n_differ = 0
    for row in table.episodes:
        with torch.no_grad():
            out = model(**tiny_backend.encode([eps[row["episode_id"]]["prompt"]]), output_hidden_states=True)
            for s in sites:
                if s == L:      # hidden_states[L] is final-normed: every lens reads the model's own output there
                    z = out.logits[0, -1]
                else:
                    z = model.lm_head(model.model.norm(gains[s] * out.hidden_states[s][0, -1]))
                want = 1 + int((z[:len(tok)] > z[row["answer_token_id"]]).sum())
                assert row["lenses"]["diagonal"]["ranks_by_site"][str(s)] == want, s
        n_differ += row["lenses"]["diagonal"]["ranks_by_site"] != row["lenses"]["logit"]["ranks_by_site"]
    assert n_differ >= 1                            # the gains matter


def test_toy_lens_artifact_is_checked_against_the_model(diagonal_lens, tiny_backend, arb_run, tmp_path):
    d = ModelParts.of(tiny_backend.model).d_model
    save_file({"site.1": torch.ones(d + 1), "site.2": torch.ones(d)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ProbeError, match=r"site.1 of shape \[%d\]" % d):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), sites=[1, 2],
                                                       lenses=[f"diagonal={tmp_path / 'bad.safetensors'}"]))
    with pytest.raises(ProbeError, match="needs --lens-file FILE or --lens diagonal=FILE"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lenses=["diagonal"]))
    with pytest.raises(ProbeError, match="cannot read lens file"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lenses=[f"diagonal={tmp_path / 'none'}"]))


def test_cli_lens_name_equals_file(diagonal_lens, tiny_model_dir, tiny_backend, arb_run, tiny_lens, tmp_path, capsys):
    from memtoc.cli import main

    d = ModelParts.of(tiny_backend.model).d_model
    _gains(tmp_path / "g.safetensors", [2, 3], d, seed=1)
    out = tmp_path / "rt"
    assert main(["rank-table", "--model", str(tiny_model_dir), "--run", str(arb_run), "--layers", "2-3",
                 "--lens", f"diagonal={tmp_path / 'g.safetensors'}", "--lens", f"jacobian={tiny_lens},detached",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "## diagonal lens" in printed and "## jacobian lens" in printed
    meta = json.loads((out / "rank_table.json").read_text())["meta"]
    assert meta["lenses"] == ["logit", "diagonal", "jacobian", "detached"]
    assert meta["lens_files"] == {"diagonal": str(tmp_path / "g.safetensors"), "jacobian": str(tiny_lens)}
    # lens_file / lens_meta describe the first artifact (kept for readers of the one-lens format)
    assert meta["lens_file"] == str(tmp_path / "g.safetensors") and meta["lens_meta"] is None
    # an unknown lens on the command line: one line naming the registered lenses, exit 2
    assert main(["rank-table", "--model", str(tiny_model_dir), "--run", str(arb_run), "--lens", "tuned",
                 "--out", str(tmp_path / "x"), "--device", "cpu", "--no-progress"]) == 2
    assert "unknown lens 'tuned'" in capsys.readouterr().err and "diagonal" in lens_names()
