"""Feature dashboards (steering.dashboard, memtoc features) on a store with planted latents.

Latent 3 (memory side) fires on the question word "what" and latent 7 (tool side) on the tool value's token;
the last input rows carry the labels' signal so mining selects both. The page must show each latent's peak on
its own token, its activation concentrated in its own span, and render in a real browser.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from activations.store import ActivationWriter, RowBlock
from memtoc.cli import main
from steering.mining import MiningConfig, mine_features
from steering.sae import site_hook_name

D, MEM, TOOL, SITE = 16, 3, 7, 2
PNG_SIG = b"\x89PNG\r\n\x1a\n"


def identity_sae(root: Path) -> Path:
    import sae_lens

    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=D, d_sae=D))
    with torch.no_grad():
        sae.W_enc.copy_(torch.eye(D))
        sae.W_dec.copy_(torch.eye(D))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    sae.cfg.metadata["hook_name"] = site_hook_name(SITE)
    sae.save_model(str(root))
    return root


def store(path: Path, *, tool_span: bool = True) -> Path:
    rng = np.random.default_rng(0)
    words = ["<s>", "Q:", "what", "year", "Tool:", "1850", ".", "A:"]
    with ActivationWriter.open(path, identity={"synthetic": 1}, provenance={"model_id": "synthetic"}, sites=[SITE],
                               d_model=D, storage_dtype="float32") as w:
        for q in range(40):
            out = ["kept_memory", "followed_tool"][(q // 2) % 2]
            eid = f"{q}-0-tool_wrong-v0"
            toks = np.abs(rng.standard_normal((len(words), D))) * 0.05
            toks[2, MEM] = 4.0 + q / 50                      # "what": the question span
            toks[5, TOOL] = 5.0 + q / 50                     # "1850": the tool value
            last = np.abs(rng.standard_normal(D)) * 0.05
            last[MEM if out == "kept_memory" else TOOL] = 3.0
            span = [5] if tool_span else []
            acts = np.vstack([toks, toks[span], last[None]])
            n = len(words) + len(span) + 1
            index = {"episode_id": [eid] * n, "question_id": [f"{q}.0"] * n, "condition": ["tool_wrong"] * n,
                     "arm": ["tool"] * n, "formulation": ["reference"] * n,
                     "position_kind": ["all"] * len(words) + ["tool_span"] * len(span) + ["last_input"],
                     "token_index": list(range(len(words))) + span + [len(words) - 1],
                     "token_id": list(range(len(words))) + span + [len(words) - 1],
                     "token_str": words + ["1850"] * len(span) + ["A:"], "outcome": [out] * n,
                     "kept_memory": [int(out == "kept_memory")] * n, "followed_tool": [int(out == "followed_tool")] * n}
            w.append(RowBlock(episodes=[{"episode_id": eid, "n_rows": n}], index=index, acts={SITE: acts}))
        w.finish(planned=[])
    return path


@pytest.fixture(scope="module")
def mined(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dash")
    acts = store(root / "acts.h5")
    cfg = MiningConfig(activations=str(acts), sae={SITE: {"path": str(identity_sae(root / "sae"))}}, fit_fold="A",
                       out=str(root / "mined"), budget=0.5, seed=0, fvu_threshold=1.0)
    mine_features(cfg, log=lambda s: None)
    return root / "mined"


def test_each_latent_peaks_on_its_own_token_and_span(mined, tmp_path) -> None:
    import memtoc as mt

    res = mt.features(mined, out=tmp_path / "f", contexts=3, window=3)
    views = {v.feature: v for v in res.views}
    assert {MEM, TOOL} <= set(views)
    tool, mem = views[TOOL], views[MEM]
    assert tool.contexts[0]["tokens"][tool.contexts[0]["peak"]][0] == "1850"
    assert mem.contexts[0]["tokens"][mem.contexts[0]["peak"]][0] == "what"
    assert tool.by_span["tool value"]["mean"] > 10 * max(tool.by_span["question"]["mean"], 1e-3)
    assert mem.by_span["question"]["mean"] > 10 * max(mem.by_span["tool value"]["mean"], 1e-3)
    assert tool.side == "tool" and mem.side == "memory" and tool.mi > 0
    assert len(tool.contexts) == 3 and all(len(c["tokens"]) <= 7 for c in tool.contexts)
    page = res.files["html"].read_text(encoding="utf-8")
    assert f"id='f{SITE}-{TOOL}'" in page and "<script" not in page
    assert json.loads(res.files["json"].read_text())["features"][0]["site"] == SITE


def test_without_tool_span_rows_the_spans_are_unknown_and_the_page_says_so(tmp_path) -> None:
    """A store extracted without ``tool_span`` rows cannot split a tool-conditioned prompt: its tokens are
    'unknown', never silently 'question' (the tool latent's peak token would count as question side)."""
    import memtoc as mt

    acts = store(tmp_path / "acts.h5", tool_span=False)
    cfg = MiningConfig(activations=str(acts), sae={SITE: {"path": str(identity_sae(tmp_path / "sae"))}},
                       fit_fold="A", out=str(tmp_path / "mined"), budget=0.5, seed=0, fvu_threshold=1.0)
    mine_features(cfg, log=lambda s: None)
    res = mt.features(tmp_path / "mined", out=tmp_path / "f", contexts=3, window=3)
    tool = {v.feature: v for v in res.views}[TOOL]
    assert tool.by_span["question"]["n_tokens"] == 0 and tool.by_span["tool value"]["n_tokens"] == 0
    assert tool.by_span["unknown"]["n_tokens"] == 40 * 7          # every token but the attention sink
    assert tool.unsplit_episodes == 40
    page = res.files["html"].read_text(encoding="utf-8")
    assert "Spans not split for 40 episode(s)" in page and "span: unknown" in page


def test_the_command_refuses_a_directory_that_is_no_mining_run(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["features", "--mining", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "not a mining directory" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install chromium) - headless render skipped")
def test_the_page_renders_in_headless_chromium(mined, tmp_path) -> None:
    assert main(["features", "--mining", str(mined), "--out", str(tmp_path / "f")]) == 0
    shot = tmp_path / "features.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--window-size=1100,1400", f"--screenshot={shot}",
                    (tmp_path / "f" / "features.html").resolve().as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.read_bytes().startswith(PNG_SIG) and shot.stat().st_size > 10_000


def test_a_span_without_tokens_is_written_as_null_not_nan():
    """A span or condition with no tokens has no mean (NaN): features.json writes null, which strict JSON takes."""
    import json

    from steering.dashboard import FeatureView

    view = FeatureView(site=2, feature=7, side="memory", role="remove", mi=0.1, mi_rank=1,
                       by_span={"tool value": {"mean": float("nan"), "firing": float("nan"), "n_tokens": 0},
                                "question": {"mean": 0.5, "firing": 0.25, "n_tokens": 4}})
    d = view.to_dict()
    assert d["by_span"]["tool value"] == {"mean": None, "firing": None, "n_tokens": 0}
    assert d["by_span"]["question"] == {"mean": 0.5, "firing": 0.25, "n_tokens": 4}
    json.dumps(d, allow_nan=False)
