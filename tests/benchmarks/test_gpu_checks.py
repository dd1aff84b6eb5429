"""``benchmarks/gpu_checks.py``'s staged-capture check on CPU (staging forced, as the GPU runs it): it passes on
the capture code as it is, and fails, naming the error, when capture buffers are made inside the forward's
inference mode and written outside it (the bug a GPU hit when vLLM ran its forwards under inference mode)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checks():
    sys.path.insert(0, str(REPO / "benchmarks"))          # gpu_checks imports its sibling fake_vllm when run
    try:
        import gpu_checks

        yield gpu_checks
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_capture_through_the_fake_worker_passes(checks, dtype):
    r = checks.check_staged_capture("cpu", dtype, 64)
    assert r["ok"], r
    for name in ("tp2", "pp2"):
        run = r["runs"][name]
        assert run["exact"] and run["staged_each_forward"] == [True, True] and run["edit_reached_capture"]
    assert [x["captured"] for x in r["runs"]["tp2"]["replies"]] == [[0, 2, 4], []]     # rank 0 captures
    assert [x["captured"] for x in r["runs"]["pp2"]["replies"]] == [[0, 2], [3, 4]]     # each stage its sites


def test_staged_capture_fails_on_buffers_made_in_inference_mode(checks, monkeypatch):
    from memtoc.backends.vllm_plans import TokenCapture

    def made_in_the_forward(self, site):
        if site not in self.values:
            self.values[site] = torch.zeros((self.n_slots, self.d_model), dtype=self.dtype)
            self.filled[site] = torch.zeros(self.n_slots, dtype=torch.bool)
        return self.values[site], self.filled[site]

    monkeypatch.setattr(TokenCapture, "_buffers", made_in_the_forward)
    monkeypatch.setattr(TokenCapture, "prepare", lambda self, device, dtype: None)
    r = checks.check_staged_capture("cpu", torch.float32, 64)
    assert not r["ok"]
    assert all("inference tensor" in r["runs"][n]["error"] for n in ("tp2", "pp2"))


@pytest.fixture(scope="module")
def small(checks):
    """The check's random model on CPU with two prompts (one with a tool output, one without)."""
    b = checks.build_backend("cpu", torch.float32, 0)
    ps, spans = checks.prompts(2)
    site = b.parts.n_layers // 2
    return b, ps, spans, site, checks.read_plain(b, ps, site)


def test_the_edit_checks_fail_when_the_edit_adds_the_wrong_amount(checks, small, monkeypatch):
    from steering.kinds import sae_clamp
    from steering.kinds.direction import DirectionEdit

    b, ps, spans, site, plain = small
    assert checks.check_direction(b, ps, spans, site, 16.0, plain)["ok"]
    assert checks.check_sae_clamp(b, ps, spans, site, plain)["ok"]
    right = DirectionEdit.delta
    monkeypatch.setattr(DirectionEdit, "delta", lambda self, s: 2 * right(self, s))
    bad = checks.check_direction(b, ps, spans, site, 16.0, plain)
    assert not bad["ok"] and not bad["positions"]["last_input"]["site_exact"]
    clamp = sae_clamp.clamp_delta
    monkeypatch.setattr(sae_clamp, "clamp_delta", lambda *a: 1.01 * clamp(*a))
    bad = checks.check_sae_clamp(b, ps, spans, site, plain)
    assert not bad["ok"] and bad["max_abs"] > 0 and bad["unplanned_unchanged"]
