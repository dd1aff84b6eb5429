"""SAEs through sae-lens: FVU, training on a synthetic store, save/reload, loading errors, the `memtoc sae` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock
from memtoc.cli import main
from steering.sae import (SAEError, check_sae_site, encode, fit_sae, fvu, load_sae, read_sae_meta, site_hook_name,
                          site_of_hook_name, store_fvu, train_sae)


@pytest.fixture(autouse=True)
def _one_thread():
    """Small matrices on a shared 2-core machine: one torch thread is an order of magnitude faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def low_rank_store(path, *, n_eps=30, tokens=24, d=32, rank=6, sites=(1, 2), seed=0):
    """Activations that are sparse non-negative combinations of ``rank`` directions plus an offset and noise."""
    rng = np.random.default_rng(seed)
    basis = {s: rng.standard_normal((rank, d)) * 3 for s in sites}
    offset = {s: rng.standard_normal(d) for s in sites}
    with ActivationWriter.open(path, identity={"synthetic": seed}, provenance={"model_id": "synthetic"},
                               sites=list(sites), d_model=d, storage_dtype="float32") as w:
        for e in range(n_eps):
            n = tokens + 1
            coef = np.maximum(rng.standard_normal((n, rank)) - 0.5, 0) * rng.exponential(1.0, (n, rank))
            acts = {s: coef @ basis[s] + offset[s] + 0.01 * rng.standard_normal((n, d)) for s in sites}
            eid = f"{e}-0-tool_wrong-v0"
            index = {"episode_id": [eid] * n, "question_id": [f"{e}.0"] * n, "condition": ["tool_wrong"] * n,
                     "arm": ["tool"] * n, "formulation": ["reference"] * n,
                     "position_kind": ["all"] * tokens + ["last_input"],
                     "token_index": list(range(tokens)) + [tokens - 1], "token_id": [0] * n,
                     "token_str": [f"t{i}" for i in range(tokens)] + [f"t{tokens - 1}"]}
            w.append(RowBlock(episodes=[{"episode_id": eid, "n_rows": n}], index=index, acts=acts))
        w.finish(planned=[])
    return path


def random_standard_sae(d_in=12, d_sae=20, seed=0, hook_name=None):
    import sae_lens

    torch.manual_seed(seed)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=d_in, d_sae=d_sae))
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            p.normal_(0, 0.5)
    if hook_name:
        sae.cfg.metadata["hook_name"] = hook_name
    return sae


def test_fvu_matches_a_direct_numpy_computation():
    sae = random_standard_sae()
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((300, 12)) * 2 + 1).astype(np.float32)
    W_enc, b_enc = sae.W_enc.detach().numpy().astype(np.float64), sae.b_enc.detach().numpy().astype(np.float64)
    W_dec, b_dec = sae.W_dec.detach().numpy().astype(np.float64), sae.b_dec.detach().numpy().astype(np.float64)
    z = np.maximum((x - b_dec) @ W_enc + b_enc, 0)               # standard SAE: apply_b_dec_to_input, ReLU
    x_hat = z @ W_dec + b_dec
    want = ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert fvu(sae, x) == pytest.approx(want, rel=1e-5)
    assert fvu(sae, x, batch_size=7) == pytest.approx(want, rel=1e-5)      # batching does not change it
    np.testing.assert_allclose(encode(sae, x), z, rtol=1e-4, atol=1e-4)
    # a perfect reconstruction has FVU 0; the mean alone has FVU 1
    assert 0 < want
    with pytest.raises(SAEError, match="at least 2"):
        fvu(sae, x[:1])


def test_training_lowers_fvu_saves_and_reloads_identically(tmp_path):
    store = low_rank_store(tmp_path / "acts.h5")
    from activations.store import open_store

    with open_store(store) as st:
        x = st.read(1, st.select(position_kind="all"))
    # an untrained SAE explains nothing useful; training brings FVU far down
    sae0, _ = fit_sae(x, d_sae=64, k=8, steps=1, batch_size=64, lr=1e-6, seed=0)
    before = fvu(sae0, x)
    sae, trainer = fit_sae(x, d_sae=64, k=8, steps=300, batch_size=128, lr=3e-3, seed=0)
    after = fvu(sae, x)
    assert before > 0.3 and after < 0.05, (before, after)
    sae.save_inference_model(str(tmp_path / "fit"))
    back = load_sae({"path": str(tmp_path / "fit")})
    np.testing.assert_allclose(encode(back, x), encode(sae, x), rtol=1e-4, atol=1e-4)
    assert fvu(back, x) == pytest.approx(after, rel=1e-3)

    out = train_sae(store, 1, out_dir=tmp_path / "sae", d_sae=64, k=8, steps=300, batch_size=128, lr=3e-3, seed=0,
                    log=lambda s: None)
    meta = read_sae_meta(out)
    assert meta["site"] == 1 and meta["hook_name"] == "blocks.0.hook_resid_post" and meta["d_in"] == 32
    assert meta["d_sae"] == 64 and meta["steps"] == 300 and meta["seed"] == 0
    assert meta["store"]["model_id"] == "synthetic" and meta["store"]["identity_sha256"]
    assert meta["fvu_train"] < 0.05 and meta["fvu_val"] < 0.1 and meta["n_val_rows"] > 0
    a, b = load_sae({"path": str(out)}), load_sae({"path": "sae"}, base_dir=tmp_path)     # relative to base_dir
    assert a.cfg.metadata.hook_name == "blocks.0.hook_resid_post"
    np.testing.assert_array_equal(encode(a, x), encode(b, x))
    # the saved FVU is the reloaded SAE's FVU on the same training rows (episode split reproduced by the seed)
    rep = store_fvu({1: {"path": str(out)}}, store, position_kinds=["all"], skip_first=1)
    assert rep[1]["n_rows"] == meta["n_train_rows"] + meta["n_val_rows"]
    assert rep[1]["fvu"] < 0.1 and rep[1]["l0"] == pytest.approx(8.0)
    # same seed -> same weights; the refusal to overwrite
    again = train_sae(store, 1, out_dir=tmp_path / "sae2", d_sae=64, k=8, steps=300, batch_size=128, lr=3e-3, seed=0,
                      log=lambda s: None)
    assert (again / "sae_weights.safetensors").read_bytes() == (out / "sae_weights.safetensors").read_bytes()
    with pytest.raises(SAEError, match="not empty"):
        train_sae(store, 1, out_dir=out, d_sae=64, k=8, steps=2, log=lambda s: None)
    with pytest.raises(SAEError, match="site 3 is not stored"):
        train_sae(store, 3, out_dir=tmp_path / "x", steps=2, log=lambda s: None)
    with pytest.raises(SAEError, match="0 rows of position kind"):
        train_sae(store, 1, out_dir=tmp_path / "x", steps=2, position_kinds=["tool_span"], log=lambda s: None)


def test_standard_architecture_trains_too(tmp_path):
    store = low_rank_store(tmp_path / "acts.h5", n_eps=12)
    out = train_sae(store, 2, out_dir=tmp_path / "std", architecture="standard", d_sae=48, l1_coefficient=0.5,
                    steps=200, batch_size=64, lr=3e-3, log=lambda s: None)
    meta = read_sae_meta(out)
    assert meta["architecture"] == "standard" and json.loads((out / "cfg.json").read_text())["architecture"] == \
        "standard"
    assert meta["fvu_train"] < 0.2


def test_sites_and_hook_names():
    assert site_hook_name(0) == "blocks.0.hook_resid_pre" and site_hook_name(13) == "blocks.12.hook_resid_post"
    for s in (0, 1, 7):
        assert site_of_hook_name(site_hook_name(s)) == s
    assert site_of_hook_name("blocks.3.hook_resid_pre") == 3 and site_of_hook_name("layers.3") == 4
    assert site_of_hook_name("blocks.3.hook_mlp_out") is None
    sae = random_standard_sae(hook_name="blocks.1.hook_resid_post")
    check_sae_site(sae, 2, 12)
    with pytest.raises(SAEError, match="site 2, not site 3"):
        check_sae_site(sae, 3, 12)
    with pytest.raises(SAEError, match="width 16"):
        check_sae_site(sae, 2, 16)
    with pytest.raises(SAEError, match="not a residual-stream site"):
        check_sae_site(random_standard_sae(hook_name="blocks.1.hook_mlp_out"), 2, 12)


def test_load_errors_name_the_directory_and_the_release(tmp_path, monkeypatch):
    with pytest.raises(SAEError, match="not an SAE directory saved by sae-lens"):
        load_sae({"path": str(tmp_path)})
    with pytest.raises(SAEError, match="needs 'path'"):
        load_sae({"sae_id": "x"})
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)         # this machine has no hub: fail fast, do not retry
    with pytest.raises(SAEError, match="gemma-scope-2b-pt-res-canonical.*layer_12/width_16k/canonical"):
        load_sae({"release": "gemma-scope-2b-pt-res-canonical", "sae_id": "layer_12/width_16k/canonical"})


def test_sae_cli_train_and_fvu(tmp_path, capsys):
    store = low_rank_store(tmp_path / "acts.h5", n_eps=12)
    assert main(["sae", "train", "--activations", str(store), "--layers", "1-2", "--d-sae", "48", "--k", "6",
                 "--steps", "150", "--batch-size", "64", "--lr", "3e-3", "--threads", "1",
                 "--out", str(tmp_path / "saes")]) == 0
    out = capsys.readouterr().out
    assert f"--sae 1={tmp_path / 'saes' / 'site_001'},2={tmp_path / 'saes' / 'site_002'}" in out
    assert read_sae_meta(tmp_path / "saes" / "site_002")["site"] == 2
    # a bare directory: its own site; the gate passes
    assert main(["sae", "fvu", "--sae", str(tmp_path / "saes" / "site_001"), "--activations", str(store),
                 "--position-kinds", "all", "--out", str(tmp_path / "fvu.json")]) == 0
    text = capsys.readouterr().out
    rep = json.loads((tmp_path / "fvu.json").read_text())
    assert list(rep) == ["1"] and rep["1"]["fvu"] < 0.5 and "pass" in text
    # an SAE applied at the wrong site is refused; forced, it fails the gate (exit status 1)
    assert main(["sae", "fvu", "--sae", str(tmp_path / "saes" / "site_001"), "--activations", str(store),
                 "--layers", "2"]) == 2
    assert "trained on site 1" in capsys.readouterr().err
    assert main(["sae", "fvu", "--sae", f"2={tmp_path / 'saes' / 'site_001'}", "--activations", str(store),
                 "--allow-other-site", "--threshold", "0.2"]) == 1
    assert "FAIL" in capsys.readouterr().out
