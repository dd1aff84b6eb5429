"""The lens registry: the tuned lens of docs/extending.md (an affine translator per site, read from a safetensors
file), registered exactly as the doc shows, run through the rank table and ``memtoc rank-table --lens NAME=FILE``
and checked against an independent forward."""

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
from probes.rank_table import RankTableConfig, build_rank_table, lens_vectors

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
LENSES_INIT = ROOT / "probes" / "lenses" / "__init__.py"


def doc_block(title: str) -> str:
    m = re.search(r'```python title="' + re.escape(title) + r'"\n(.*?)```', DOC.read_text(encoding="utf-8"), re.S)
    assert m, f"docs/extending.md has no code block titled {title}"
    return m.group(1)


@pytest.fixture(scope="module")
def tuned_lens():
    """Execute the doc's module as ``probes.lenses.tuned`` (what the registration line would import)."""
    assert "tuned" not in lens_names()
    ns = {"__name__": "probes.lenses.tuned"}
    exec(compile(doc_block("probes/lenses/tuned.py"), "docs/extending.md:probes/lenses/tuned.py", "exec"), ns)
    try:
        yield ns["TunedLens"]
    finally:
        unregister_lens("tuned")


def _translators(path: Path, sites, d: int, seed: int | None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Write a translator file: identity (seed None: the logit lens) or a random ``A = I + noise``, ``b``."""
    g = torch.Generator().manual_seed(seed or 0)
    out = {}
    for s in sites:
        if seed is None:
            out[s] = (torch.eye(d), torch.zeros(d))
        else:
            out[s] = (torch.eye(d) + 0.3 * torch.randn(d, d, generator=g), 0.5 * torch.randn(d, generator=g))
    tensors = {}
    for s, (A, b) in out.items():
        tensors[f"site.{s}.weight"], tensors[f"site.{s}.bias"] = A, b
    save_file(tensors, str(path))
    return out


def test_the_doc_claims_two_files_and_its_registration_line_matches_the_package():
    real = [ln for ln in LENSES_INIT.read_text(encoding="utf-8").splitlines() if ln.startswith("from probes.lenses import")]
    assert real == ["from probes.lenses import logit, jacobian, detached, jvp  # noqa: F401,E402  (registration on import)"]
    assert doc_block("probes/lenses/__init__.py").strip() == real[0].replace("jvp", "jvp, tuned")
    section = DOC.read_text(encoding="utf-8").split("## Add a new lens")[1].split("\n## ")[0]
    assert re.findall(r'```python title="([^"]+)"', section) == ["probes/lenses/tuned.py", "probes/lenses/__init__.py"]
    assert "**Files touched: 2** (`probes/lenses/tuned.py`, new; `probes/lenses/__init__.py`, one line)" in section
    assert not (LENSES_INIT.parent / "tuned.py").exists()


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
    with pytest.raises(ProbeError, match="unknown lens 'bogus'; choose from logit, jacobian, detached, jvp"):
        make_lenses([("bogus", None)])


def test_registry_refuses_a_second_registration_and_non_lenses(tuned_lens):
    with pytest.raises(ValueError, match="already registered"):
        register_lens("tuned")(type("Other", (Lens,), {}))
    with pytest.raises(TypeError, match="not a subclass"):
        register_lens("nothing")(type("NotALens", (), {}))
    assert lens_class("tuned") is tuned_lens and "nothing" not in lens_names()


def test_the_tuned_lens_decodes_a_x_plus_b_through_the_final_norm_and_head(tuned_lens, tiny_backend, arb_run,
                                                                           tmp_path):
    """The logits the rank table decodes at each site equal ``lm_head(norm(A x + b))`` with ``x`` read from a plain
    ``output_hidden_states`` forward, and the model's own logits at the last site."""
    model, tok = tiny_backend.model, tiny_backend.tokenizer
    parts = ModelParts.of(model, len(tok))
    L, d = parts.n_layers, parts.d_model
    sites = [1, 2, L]
    trans = _translators(tmp_path / "t.safetensors", sites[:-1], d, seed=5)
    lens = make_lenses([("tuned", str(tmp_path / "t.safetensors"))])[0]
    lens.load(parts, sites)
    eps = RunStore.read(arb_run).episodes.records()
    prompts = [e["prompt"] for e in eps[:3]]
    got = lens_vectors(tiny_backend, parts, prompts, sites, [lens])["tuned"]
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            out = model(**tiny_backend.encode([prompt]), output_hidden_states=True)
            for s in sites:
                if s == L:     # hidden_states[L] is final-normed: every lens reads the model's own output there
                    want = out.logits[0, -1]
                else:
                    A, b = trans[s]
                    want = model.lm_head(model.model.norm(A @ out.hidden_states[s][0, -1] + b))
                torch.testing.assert_close(parts.unembed(got[s][i:i + 1])[0, :want.shape[0]], want,
                                           rtol=1e-4, atol=1e-4)


def test_the_tuned_lens_ranks_match_an_independent_computation(tuned_lens, tiny_backend, arb_run, tmp_path):
    model, tok = tiny_backend.model, tiny_backend.tokenizer
    parts = ModelParts.of(model, len(tok))
    L, d = parts.n_layers, parts.d_model
    sites = [1, 2, 3]
    # identity translators: the tuned lens is the logit lens
    _translators(tmp_path / "eye.safetensors", sites, d, None)
    eye = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), layers=sites,
                                                         lens=[f"tuned={tmp_path / 'eye.safetensors'}"]))
    assert eye.meta["lenses"] == ["logit", "tuned"] and eye.meta["lens_file"] == str(tmp_path / "eye.safetensors")
    for row in eye.episodes:
        assert row["lenses"]["tuned"] == row["lenses"]["logit"]
    # random translators: the rank of the answer token under norm(A x + b) read from a plain forward
    trans = _translators(tmp_path / "t.safetensors", sites, d, seed=3)
    table = build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), layers=sites, lens=["tuned"],
                                                           lens_file=str(tmp_path / "t.safetensors"), batch_size=3))
    eps = {r["episode_id"]: r for r in RunStore.read(arb_run).episodes.records()}
    assert len(table.episodes) == 4
    n_differ = 0
    for row in table.episodes:
        with torch.no_grad():
            out = model(**tiny_backend.encode([eps[row["episode_id"]]["prompt"]]), output_hidden_states=True)
            for s in sites:
                if s == L:
                    z = out.logits[0, -1]
                else:
                    A, b = trans[s]
                    z = model.lm_head(model.model.norm(A @ out.hidden_states[s][0, -1] + b))
                want = 1 + int((z[:len(tok)] > z[row["answer_token_id"]]).sum())
                assert row["lenses"]["tuned"]["ranks_by_site"][str(s)] == want, s
        n_differ += row["lenses"]["tuned"]["ranks_by_site"] != row["lenses"]["logit"]["ranks_by_site"]
    assert n_differ >= 1                            # the translators matter


def test_the_tuned_lens_file_is_checked_against_the_model(tuned_lens, tiny_backend, arb_run, tmp_path):
    d = ModelParts.of(tiny_backend.model).d_model
    save_file({"site.1.weight": torch.eye(d + 1), "site.1.bias": torch.zeros(d + 1),
               "site.2.weight": torch.eye(d), "site.2.bias": torch.zeros(d)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ProbeError, match=r"site.1.weight \[%d, %d\] and site.1.bias \[%d\]" % (d, d, d)):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), layers=[1, 2],
                                                       lens=[f"tuned={tmp_path / 'bad.safetensors'}"]))
    save_file({"site.1.weight": torch.eye(d)}, str(tmp_path / "nobias.safetensors"))
    with pytest.raises(ProbeError, match="site.1.bias"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), layers=[1],
                                                       lens=[f"tuned={tmp_path / 'nobias.safetensors'}"]))
    with pytest.raises(ProbeError, match="needs --lens-file FILE or --lens tuned=FILE"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=["tuned"]))
    with pytest.raises(ProbeError, match="cannot read lens file"):
        build_rank_table(tiny_backend, RankTableConfig(run=str(arb_run), lens=[f"tuned={tmp_path / 'none'}"]))


def test_cli_lens_name_equals_file(tuned_lens, tiny_model_dir, tiny_backend, arb_run, tiny_lens, tmp_path, capsys):
    from memtoc.cli import main

    d = ModelParts.of(tiny_backend.model).d_model
    _translators(tmp_path / "t.safetensors", [2, 3], d, seed=1)
    out = tmp_path / "rt"
    assert main(["rank-table", "--model", str(tiny_model_dir), "--run", str(arb_run), "--layers", "2-3",
                 "--lens", f"tuned={tmp_path / 't.safetensors'}", "--lens", f"jacobian={tiny_lens},detached",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "## tuned lens" in printed and "## jacobian lens" in printed
    meta = json.loads((out / "rank_table.json").read_text())["meta"]
    assert meta["lenses"] == ["logit", "tuned", "jacobian", "detached"]
    assert meta["lens_files"] == {"tuned": str(tmp_path / "t.safetensors"), "jacobian": str(tiny_lens)}
    # lens_file / lens_meta describe the first artifact (kept for readers of the one-lens format)
    assert meta["lens_file"] == str(tmp_path / "t.safetensors") and meta["lens_meta"] is None
    # an unknown lens on the command line: one line naming the registered lenses, exit 2
    assert main(["rank-table", "--model", str(tiny_model_dir), "--run", str(arb_run), "--lens", "bogus",
                 "--out", str(out / "x"), "--device", "cpu", "--no-progress"]) == 2
    assert "unknown lens 'bogus'" in capsys.readouterr().err and "tuned" in lens_names()
