"""The one pre-load check (memtoc.jobs.preflight): each config's declared options against the model's shape read
from its config alone, with no weights; a loaded backend given instead leaves only the syntax to check."""

from __future__ import annotations

import json

import pytest

from memtoc.core.values import build_config
from memtoc.jobs.extract import ExtractConfig
from memtoc.jobs.lens_fit import LensFitConfig
from memtoc.jobs.preflight import KINDS, PreloadError, check_before_load, preload_fields
from memtoc.jobs.rank_table import RankTableJobConfig


@pytest.fixture()
def model(tmp_path):
    """A model directory holding only its config: 4 blocks (sites 0..4), width 16."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 16}))
    return d


def _lens(path, **meta) -> None:
    header = json.dumps({"__metadata__": {"format": "memtoc-jacobian-lens-v1", "complete": "true", **meta}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def test_every_declared_kind_is_known() -> None:
    for cls in (ExtractConfig, RankTableJobConfig, LensFitConfig):
        assert set(preload_fields(cls).values()) <= set(KINDS) | {"model"}


@pytest.mark.parametrize("layers, ok", [("all", True), ("last", True), ("0-4", True), ("4", True), ("5", False),
                                        ("-1", False), ("bogus", False), ("", False), ("3-1", False)])
def test_extract_sites_against_the_models_depth(model, tmp_path, layers, ok) -> None:
    cfg = build_config(ExtractConfig, {"model": str(model), "layers": layers, "out": str(tmp_path / "a.h5")})
    if ok:
        assert check_before_load(cfg).n_sites == 5
    else:
        with pytest.raises(PreloadError, match="^--layers"):
            check_before_load(cfg)


def test_a_loaded_backend_leaves_the_syntax_only(model, tmp_path) -> None:
    """Site 99 may exist in the backend given; 'bogus' exists in none."""
    cfg = build_config(ExtractConfig, {"model": str(model), "layers": "99", "out": str(tmp_path / "a.h5")})
    assert check_before_load(cfg, loaded=True) is None
    with pytest.raises(PreloadError, match="--layers '99'"):
        check_before_load(cfg)
    cfg = build_config(ExtractConfig, {"model": str(model), "layers": "bogus", "out": str(tmp_path / "a.h5")})
    with pytest.raises(PreloadError, match="bad layer"):
        check_before_load(cfg, loaded=True)


def test_rank_table_lenses_read_from_their_header(model, tmp_path) -> None:
    run = tmp_path / "run"

    def cfg(**kw):
        return build_config(RankTableJobConfig, {"model": str(model), "run": str(run), "out": str(tmp_path / "rt"),
                                                 **kw})

    good, other, partial = tmp_path / "good.safetensors", tmp_path / "other.safetensors", tmp_path / "p.safetensors"
    _lens(good, n_layers="4", d_model="16")
    _lens(other, n_layers="30", d_model="16")
    _lens(partial, complete="false")
    check_before_load(cfg(lens=[f"jacobian={good}"]))
    for lens, needle in ((f"jacobian={other}", "n_layers 30"), (f"jacobian={partial}", "unfinished"),
                         ("bogus", "unknown lens"), (f"jacobian={tmp_path / 'none'}", "not found"),
                         (f"jacobian={model / 'config.json'}", "not a safetensors file"), ("jacobian", "needs")):
        with pytest.raises(PreloadError, match=needle):
            check_before_load(cfg(lens=[lens]))
    for layers in ("9", "5", "x-2"):      # the band's sites run 0..L, as the job resolves them after loading
        with pytest.raises(PreloadError, match=f"^--layers '{layers}'"):
            check_before_load(cfg(lens=["logit"], layers=layers))
    check_before_load(cfg(lens=["logit"], layers="0-4"))


def test_lens_fit_corpus_and_band(model, tmp_path) -> None:
    def cfg(**kw):
        return build_config(LensFitConfig, {"model": str(model), "out": str(tmp_path / "l.safetensors"), **kw})

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a line\n", encoding="utf-8")
    for ok in ({}, {"corpus": "quick"}, {"corpus": str(corpus)}, {"layers": "default"}, {"layers": "1-3"}):
        check_before_load(cfg(**ok))
    with pytest.raises(PreloadError, match="^--corpus"):
        check_before_load(cfg(corpus=str(tmp_path / "missing.txt")))
    with pytest.raises(PreloadError, match="^--layers"):
        check_before_load(cfg(layers="7"))


def test_a_missing_model_path_or_a_corrupt_gguf_is_one_line(tmp_path) -> None:
    from memtoc.core.errors import MemtocError

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    for spec, needle in ((str(fake), "truncated or corrupt GGUF header"), (str(tmp_path / "nowhere"), "nowhere")):
        cfg = build_config(ExtractConfig, {"model": spec, "out": str(tmp_path / "a.h5")})
        with pytest.raises(MemtocError, match=needle) as info:
            check_before_load(cfg)
        assert len(str(info.value).splitlines()) == 1
