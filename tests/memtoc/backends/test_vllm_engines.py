"""The real-vLLM tier, other engine builds: the uniprocess engine, and an engine that compiles its forward.

The module tier (``test_vllm_real.py``) runs vLLM's default, the multiprocess engine. Here each test builds its own
engine (20-90 s on two cores): the uniprocess engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) must capture and edit
exactly as the multiprocess one; an engine built with ``enforce_eager=False`` runs compiled graphs that skip Python
hooks, so it must refuse an edit in one line before sending it -- never return untreated tokens for an edit (its
graphs are compiled with dynamo's eager backend: inductor's code generation takes minutes here and tests nothing of
ours).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from memtoc.core.runtime import GenerationConfig  # noqa: E402

pytestmark = pytest.mark.vllm_real

PROMPTS = ["What is the capital of France? Answer with FINAL: <city>.", "Name the largest planet of the solar system."]


def _edit(d: int):
    from steering.kinds.direction import DirectionEdit

    u = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return DirectionEdit.build(name="rand", layers=[8], vectors={8: u / u.norm()}, scale={8: 40.0},
                               positions="last_input", strength=1.0)


def _load(**kw):
    from memtoc.backends.vllm import VLLMBackend

    return VLLMBackend.load("default", device="cpu", dtype="float32", **kw)


@pytest.fixture(scope="module")
def hf():
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    return load_backend(ModelSpec(model="default", backend="hf", dtype="float32", device="cpu"))


def test_uniprocess_engine_captures_and_edits_as_hf(hf, monkeypatch):
    from activations.capture import ResidualCapture

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    v = _load()
    try:
        assert v.workers and v.hook_refusal is None
        caps = {}
        for name, b in (("hf", hf), ("vllm", v)):
            caps[name] = ResidualCapture([0, 12, 24], "last_input,all", prompts=PROMPTS)
            b.forward(PROMPTS, capture=caps[name])
        for s in (0, 12, 24):
            x, y = caps["hf"].values[s].double(), caps["vllm"].values[s].double()
            assert float(((x - y).norm(dim=-1) / x.norm(dim=-1)).max()) < 1e-4, s
        e = _edit(hf.site_info.d_model)
        cfg = GenerationConfig(max_new_tokens=16)
        got = v.generate(PROMPTS * 2, cfg, edit=e.bind(PROMPTS * 2, None, strengths=[0, 0, 1, 1]))
        want = hf.generate(PROMPTS, cfg) + hf.generate(PROMPTS, cfg, edit=e.bind(PROMPTS))
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
    finally:
        del v


def test_compiled_engine_refuses_edits_in_one_line(hf):
    from memtoc.backends.base import InterventionUnsupportedError

    # torch.compile with dynamo's eager backend: the compiled path vLLM takes for enforce_eager=False (the refusal
    # reads that setting), without inductor's C++ code generation (137 s on two cold cores, nothing of ours)
    v = _load(enforce_eager=False, compilation_config={"backend": "eager"})
    try:
        assert "capture" not in v.capabilities and "enforce_eager" in v.hook_refusal
        e = _edit(hf.site_info.d_model)
        with pytest.raises(InterventionUnsupportedError, match="enforce_eager=True") as err:
            v.generate(PROMPTS, GenerationConfig(max_new_tokens=8), edit=e.bind(PROMPTS))
        assert "\n" not in str(err.value)
        plain = v.generate(PROMPTS, GenerationConfig(max_new_tokens=8))       # untreated requests still run
        assert all(g.n_new_tokens > 0 for g in plain)
    finally:
        del v
