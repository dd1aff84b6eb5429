"""The MemToC App. C protocol: full-sequence FVU gate, per-direction flip denominators, pretrained dictionaries
mapped onto store sites by their hook names, and the paper defaults."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock, open_store
from steering.mi import MiningError
from steering.mining import MiningConfig, mine_features
from memtoc.jobs.mining import parse_sae_arg
from steering.sae import SAEError, site_hook_name, site_of_hook_name, site_of_sae, store_fvu
from memtoc.tasks.memtoc.sweep import FLIP_BAR, dev_set, flip_stats, format_markdown

D = 8


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sae(d: int = D, seed: int = 0, hook_name: str | None = None):
    """A random ReLU SAE (its reconstruction is far from perfect, so the FVU is informative)."""
    import sae_lens

    torch.manual_seed(seed)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=d, d_sae=2 * d))
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            p.normal_(0, 0.4)
    if hook_name:
        sae.cfg.metadata["hook_name"] = hook_name
    return sae


def _store(path: Path, site: int = 2, n_questions: int = 40, tokens: int = 6, seed: int = 0) -> Path:
    """One tool_wrong episode per demo question; kept_memory / followed_tool alternate (latent-free: the FVU test
    needs rows, not signal); ``tokens`` rows of kind ``all`` (token 0 a large BOS row) and one ``last_input``."""
    rng = np.random.default_rng(seed)
    with ActivationWriter.open(path, identity={"synthetic": seed}, provenance={"model_id": "synthetic"},
                               sites=[site], d_model=D, storage_dtype="float32") as w:
        for q in range(n_questions):
            out = ["kept_memory", "followed_tool"][(q // 2) % 2]
            eid = f"{q}-0-tool_wrong-v0"
            toks = rng.standard_normal((tokens, D))
            toks[0] = 40.0
            last = rng.standard_normal(D) * 3
            acts = np.vstack([toks, last[None]])
            n = tokens + 1
            index = {"episode_id": [eid] * n, "question_id": [f"{q}.0"] * n, "condition": ["tool_wrong"] * n,
                     "arm": ["tool"] * n, "formulation": ["reference"] * n,
                     "position_kind": ["all"] * tokens + ["last_input"],
                     "token_index": list(range(tokens)) + [tokens - 1], "token_id": [0] * n,
                     "token_str": [f"t{i}" for i in range(tokens)] + [f"t{tokens - 1}"],
                     "outcome": [out] * n, "kept_memory": [int(out == "kept_memory")] * n,
                     "followed_tool": [int(out == "followed_tool")] * n}
            w.append(RowBlock(episodes=[{"episode_id": eid, "n_rows": n}], index=index, acts={site: acts}))
        w.finish(planned=[])
    return path


def _direct_fvu(sae, x: np.ndarray) -> float:
    """FVU by hand: the ReLU SAE's reconstruction written out in numpy (float64)."""
    we, be = sae.W_enc.detach().double().numpy(), sae.b_enc.detach().double().numpy()
    wd, bd = sae.W_dec.detach().double().numpy(), sae.b_dec.detach().double().numpy()
    x = x.astype(np.float64)
    xh = np.maximum((x - bd) @ we + be, 0) @ wd + bd
    return float(((x - xh) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


def test_full_sequence_fvu_gate_matches_a_direct_computation(tmp_path):
    store = _store(tmp_path / "acts.h5")
    sae = _sae(hook_name=site_hook_name(2))
    sae.save_model(str(tmp_path / "sae"))
    ref = {2: {"path": str(tmp_path / "sae")}}
    res = mine_features(MiningConfig(activations=str(store), sae=ref, fit_fold="A", out=str(tmp_path / "m"),
                                     budget=0.7, min_per_class=1), log=lambda s: None)
    res_last = mine_features(MiningConfig(activations=str(store), sae=ref, fit_fold="A", out=str(tmp_path / "m2"),
                                          fvu_rows="last_input", min_per_class=1), log=lambda s: None)
    with open_store(store) as st:
        idx = st.index
        eps = set(res.report["mining_episode_ids"])
        in_eps = np.isin(idx["episode_id"].astype(str), list(eps))
        seq_rows = np.flatnonzero(in_eps & (idx["position_kind"] == "all") & (idx["token_index"] >= 1))
        last_rows = np.flatnonzero(in_eps & (idx["position_kind"] == "last_input"))
        x_seq, x_last = st.read(2, seq_rows), st.read(2, last_rows)
        x_all_eps = st.read(2, np.flatnonzero((idx["position_kind"] == "all") & (idx["token_index"] >= 1)))
    assert len(seq_rows) == 5 * len(eps) and len(eps) == 20        # fold A = the 20 even questions
    want_seq, want_last = _direct_fvu(sae, x_seq), _direct_fvu(sae, x_last)
    assert abs(want_seq - want_last) > 0.05                       # the two gates measure different rows
    assert res.spec["fvu"]["2"] == pytest.approx(want_seq, rel=1e-5)
    assert res.spec["fvu_rows"] == "sequence" and res.report["config"]["fvu_rows"] == "sequence"
    assert res_last.spec["fvu"]["2"] == pytest.approx(want_last, rel=1e-5)
    # memtoc sae fvu: full sequence (token 0 left out) by default, the last-input gate by option
    assert store_fvu(ref, store)[2]["fvu"] == pytest.approx(_direct_fvu(sae, x_all_eps), rel=1e-5)
    with open_store(store) as st:
        x_li = st.read(2, np.flatnonzero(st.index["position_kind"] == "last_input"))
    got = store_fvu(ref, store, position_kinds=("last_input",), skip_first=0)[2]["fvu"]
    assert got == pytest.approx(_direct_fvu(sae, x_li), rel=1e-5)


def test_sequence_gate_needs_full_sequence_rows(tmp_path):
    store = _store(tmp_path / "acts.h5", tokens=1)           # only a BOS row of kind "all": dropped
    sae = _sae(hook_name=site_hook_name(2))
    sae.save_model(str(tmp_path / "sae"))
    cfg = MiningConfig(activations=str(store), sae={2: {"path": str(tmp_path / "sae")}}, fit_fold="A",
                       out=str(tmp_path / "m"), min_per_class=1)
    with pytest.raises(MiningError, match="full-sequence"):
        mine_features(cfg, log=lambda s: None)
    assert not (tmp_path / "m" / "edit.json").exists()


def _rec(eid, outcome, cell="arb", cond="tool_wrong"):
    return {"episode_id": eid, "outcome": outcome, "cell": cell, "condition": cond, "question_id": "q" + eid,
            "divergence_bucket": None, "formulation": "reference", "trivial_hop": False}


def test_per_direction_flip_denominators_on_constructed_records():
    base = [_rec("1", "followed_tool"), _rec("2", "followed_tool"), _rec("3", "followed_tool"),
            _rec("4", "kept_memory"), _rec("5", "kept_memory"), _rec("6", "neither"),
            _rec("7", "followed_tool", cell="agree"), _rec("8", "followed_tool", cond="tool_right", cell="tool_gold")]
    treated = [_rec("1", "kept_memory"), _rec("2", "followed_tool"), _rec("3", "neither"),
               _rec("4", "followed_tool"), _rec("5", "kept_memory"), _rec("6", "kept_memory"),
               _rec("7", "kept_memory", cell="agree"), _rec("8", "kept_memory", cond="tool_right", cell="tool_gold")]
    st = flip_stats(base, treated, n_boot=50)
    # toward memory: over the 3 arb episodes that followed the tool at strength 0 (1 flipped)
    assert (st["toward_memory"]["k"], st["toward_memory"]["n"]) == (1, 3)
    assert st["toward_memory"]["value"] == pytest.approx(1 / 3) and st["toward_memory"]["passes_bar"]
    # toward tool: over the 2 that kept memory (1 flipped)
    assert (st["toward_tool"]["k"], st["toward_tool"]["n"]) == (1, 2) and st["toward_tool"]["value"] == 0.5
    # the older whole-cell rate divides by all 6 cell episodes (1 and 6 became kept_memory)
    assert (st["flip_to_memory"]["k"], st["flip_to_memory"]["n"]) == (2, 6)
    assert st["bar"] == FLIP_BAR == 0.15
    # below the bar
    low = flip_stats([_rec(str(i), "followed_tool") for i in range(10)],
                     [_rec("0", "kept_memory")] + [_rec(str(i), "followed_tool") for i in range(1, 10)], n_boot=20)
    assert low["toward_memory"]["value"] == 0.1 and low["toward_memory"]["passes_bar"] is False
    assert low["toward_tool"]["n"] == 0 and low["toward_tool"]["value"] is None


def test_dev_sets_of_n_per_direction_are_seeded_and_order_free():
    base = [_rec(str(i), "followed_tool") for i in range(50)] + [_rec(str(i), "kept_memory") for i in range(50, 60)]
    treated = [_rec(str(i), "kept_memory") for i in range(60)]
    st = flip_stats(base, treated, n_boot=20, dev_per_direction=40)
    assert st["toward_memory"]["n"] == 40 and st["toward_memory"]["k"] == 40
    assert st["toward_tool"]["n"] == 10 and st["toward_tool"]["k"] == 0      # fewer than 40: all of them
    ids = [str(i) for i in range(50)]
    assert dev_set(ids, 40, seed=0) == dev_set(ids[::-1], 40, seed=0) != dev_set(ids, 40, seed=1)
    assert dev_set(ids, None) == set(ids)


def test_sweep_table_shows_both_directions_with_the_bar():
    st = flip_stats([_rec("1", "followed_tool"), _rec("2", "kept_memory")],
                    [_rec("1", "kept_memory"), _rec("2", "kept_memory")], n_boot=20)
    metric = {"value": None, "n": 0, "ci_low": None, "ci_high": None}
    row = {"strength": 4.0, "spec_strength": 4.0, "n_episodes": 2, "flips": st,
           "metrics": {m: metric for m in ("retention", "correct_tool_following", "tool_error_abstention")},
           "format": {"final_line_rate": metric, "degenerate_rate": metric},
           "paired_vs_0": {m: None for m in ("retention", "correct_tool_following", "tool_error_abstention")}}
    md = format_markdown([row])
    assert "| toward_memory | toward_tool |" in md.replace("| strength | spec_strength | n ", "")
    assert "+1.000 (1/1) ✓" in md and "+0.000 (0/1) ✗" in md and "+0.15" in md


@pytest.mark.parametrize("hook,site", [
    ("blocks.24.hook_resid_post", 25),      # TransformerLens / Llama Scope / GemmaScope (sae-lens registry)
    ("blocks.24.hook_resid_pre", 24),       # the input of block 24 = the output of block 23
    ("model.layers.24", 25),                # HF module (Goodfire, EleutherAI "layers.L")
    ("layers.24", 25),
    ("model.layers.24.output", 25),
    ("blocks.0.hook_resid_pre", 0),         # the embedding output
    ("site_7", 7),
    ("layers.24.mlp", None),                # MLP output: not a residual-stream site
    ("blocks.24.hook_mlp_out", None),
    ("blocks.24.hook_resid_mid", None),
    ("blocks.24.attn.hook_z", None),
])
def test_hook_name_to_site(hook, site):
    assert site_of_hook_name(hook) == site
    if site is not None and hook.startswith("blocks.") and hook.endswith("post"):
        assert site_hook_name(site) == hook       # and back


def test_pretrained_dictionary_through_a_faked_registry_entry(tmp_path, monkeypatch):
    """``pretrained:RELEASE:SAE_ID`` without a site: sae-lens' registry loads the dictionary and its hook name gives
    the site (no network here, so the registry is a fake that serves locally saved SAEs)."""
    import sae_lens

    registry = {}
    for sae_id, hook in (("layer_1/width_16/canonical", "blocks.1.hook_resid_post"),
                         ("layers.2", "model.layers.2"), ("mlp_1", "layers.1.mlp")):
        d = tmp_path / sae_id.replace("/", "_")
        _sae(hook_name=hook).save_model(str(d))
        registry[("fake-scope", sae_id)] = d

    def from_pretrained(release, sae_id, device="cpu", **kw):
        if (release, sae_id) not in registry:
            raise ValueError(f"Release {release} not found in pretrained SAEs directory")
        return sae_lens.SAE.load_from_disk(str(registry[(release, sae_id)]), device=device)

    monkeypatch.setattr(sae_lens.SAE, "from_pretrained", staticmethod(from_pretrained))
    refs = parse_sae_arg("pretrained:fake-scope:layer_1/width_16/canonical,pretrained:fake-scope:layers.2")
    assert refs == {2: {"release": "fake-scope", "sae_id": "layer_1/width_16/canonical"},
                    3: {"release": "fake-scope", "sae_id": "layers.2"}}
    # an explicit site that contradicts the hook name is refused where the SAE is applied
    from steering.sae import check_sae_site, load_sae

    sae = load_sae({"release": "fake-scope", "sae_id": "layers.2"})
    assert site_of_sae(sae) == 3
    with pytest.raises(SAEError, match="site 3"):
        check_sae_site(sae, 4, D)
    with pytest.raises(SAEError, match="not a residual-stream site"):
        parse_sae_arg("pretrained:fake-scope:mlp_1")
    with pytest.raises(SAEError, match="cannot load the pretrained SAE"):
        parse_sae_arg("pretrained:fake-scope:nope")


def test_folder_of_trained_saes_gives_one_site_each(tmp_path):
    for s in (3, 5):
        d = tmp_path / "sae" / f"site_{s:03d}"
        _sae(hook_name=site_hook_name(s)).save_model(str(d))
        (d / "memtoc_sae.json").write_text(json.dumps({"site": s}))
    assert parse_sae_arg(str(tmp_path / "sae")) == {3: {"path": str(tmp_path / "sae" / "site_003")},
                                                    5: {"path": str(tmp_path / "sae" / "site_005")}}


def test_paper_defaults():
    from memtoc.bench.paper_protocol import protocol

    d = protocol()["sae_steering"]
    assert d["budget"] == 0.5 and d["budget_widening"] == 0.7 and d["budget_qualification"] == 0.5 and d["strengths"] == list(range(1, 13))
    assert d["dev_per_direction"] == 40 and d["fvu_threshold"] == 0.5 and d["flip_bar"] == FLIP_BAR
    assert MiningConfig(activations="", sae={}, fit_fold="A", out="").budget == d["budget"]
    from memtoc.core.config import SweepSettings

    assert SweepSettings().dev_per_direction == d["dev_per_direction"]


def test_flip_on_labelled_dev_sets_measures_the_strength_0_baseline():
    """App. C: "tool-following on kept-memory episodes rises 0.03 -> 0.28 (+0.25)". The dev set (40 episodes that
    kept memory) is picked by the LABELLING run; at strength 0 one of them follows the tool (baseline 1/40, not 0
    by construction), at the edit 11 do, so the flip is 10/40 = +0.25, paired on the same episodes."""
    labels = [_rec(str(i), "kept_memory") for i in range(40)] + [_rec(str(i), "followed_tool") for i in range(40, 60)]
    base = [_rec("0", "followed_tool")] + [_rec(str(i), "kept_memory") for i in range(1, 40)] + \
        [_rec(str(i), "followed_tool") for i in range(40, 60)]
    treated = [_rec(str(i), "followed_tool") for i in range(11)] + [_rec(str(i), "kept_memory") for i in range(11, 40)] \
        + [_rec(str(i), "followed_tool") for i in range(40, 60)]
    st = flip_stats(base, treated, n_boot=50, dev_per_direction=40, labels=labels)
    tt = st["toward_tool"]
    assert tt["n"] == 40 and tt["baseline"] == pytest.approx(1 / 40) and tt["treated"] == pytest.approx(11 / 40)
    assert tt["value"] == pytest.approx(10 / 40) and tt["passes_bar"] and tt["baseline_by_construction"] is False
    assert tt["ci_low"] <= 0.25 <= tt["ci_high"]
    # the same runs without labels: the dev set is strength 0's own kept-memory episodes, baseline 0 by construction
    st0 = flip_stats(base, treated, n_boot=50, dev_per_direction=40)
    assert st0["toward_tool"]["baseline"] == 0 and st0["toward_tool"]["baseline_by_construction"] is True
    assert st0["toward_tool"]["n"] == 39 and st0["toward_tool"]["value"] == pytest.approx(10 / 39)


def test_sae_paper_uses_the_pretrained_dictionaries_where_they_fit_and_falls_back_loudly(monkeypatch):
    """App. C's dictionaries are the default (``--sae paper``): Llama Scope at blocks 12-15 (sites 13-16) on a
    32-block Llama; on another model, or with the hub unreachable, the self-trained SAEs with a WARNING."""
    import memtoc.jobs.mining as mc
    from steering.sae import SAEError

    said = []
    monkeypatch.setattr(mc, "_store_attrs", lambda p: {"architecture": "LlamaForCausalLM", "n_layers": 32})
    refs = mc.resolve_sae_arg("paper", "acts.h5", load=lambda ref, device: None, log=said.append)
    assert refs == {s: {"release": "llama_scope_lxr_8x", "sae_id": f"l{s - 1}r_8x"} for s in (13, 14, 15, 16)}

    def offline(ref, device):
        raise SAEError("cannot load the pretrained SAE release (offline)")

    fb = mc.resolve_sae_arg("paper", "acts.h5", fallback="7=sae/site_007", load=offline, log=said.append)
    assert fb == {7: {"path": "sae/site_007"}} and "FALLBACK" in said[-1] and "offline" in said[-1]
    monkeypatch.setattr(mc, "_store_attrs", lambda p: {"architecture": "LlamaForCausalLM", "n_layers": 30})
    fb = mc.resolve_sae_arg("paper", "acts.h5", fallback="7=sae/site_007", load=lambda r, device: None,
                            log=said.append)
    assert fb == {7: {"path": "sae/site_007"}} and "32 blocks" in said[-1]
    with pytest.raises(SAEError, match="--sae-fallback"):
        mc.resolve_sae_arg("paper", "acts.h5", load=lambda r, device: None, log=said.append)
    monkeypatch.setattr(mc, "_store_attrs", lambda p: {"architecture": "Gemma2ForCausalLM", "n_layers": 42})
    refs = mc.resolve_sae_arg("paper", "acts.h5", load=lambda ref, device: None, log=said.append)
    assert refs[24] == {"release": "gemma-scope-9b-pt-res-canonical", "sae_id": "layer_23/width_16k/canonical"}
