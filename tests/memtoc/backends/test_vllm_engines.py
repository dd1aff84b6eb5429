"""The real-vLLM tier, other engine builds: the engine of a job that only generates, and the uniprocess engine.

The module tier (``test_vllm_real.py``) runs vLLM's default, the multiprocess engine, built eager for hooked jobs.
Here each test builds its own engine (20-90 s on two cores), on the installed build's device (``engine_platform``):
a plain ``evaluate --backend vllm`` engine is compiled (``enforce_eager=False``: torch.compile, and CUDA graphs on a
GPU), answers as hf does, and refuses an edit in one line before sending it -- never untreated tokens for an edit
(on CPU its graphs are compiled by dynamo with its eager backend, ``VLLM_CPU_CI_ENV=1``, vLLM's own CPU-CI switch:
inductor's C++ code generation takes minutes here and tests nothing of ours); the uniprocess engine
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) must capture and edit exactly as the multiprocess one.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from memtoc.core.runtime import GenerationConfig  # noqa: E402
from memtoc.core.config import EpisodeSelection, JobSettings, ModelSpec

pytestmark = pytest.mark.vllm_real

PROMPTS = ["What is the capital of France? Answer with FINAL: <city>.", "Name the largest planet of the solar system."]


def _edit(d: int):
    from steering.kinds.direction import DirectionEdit

    u = torch.randn(d, generator=torch.Generator().manual_seed(0))
    return DirectionEdit.build(name="rand", layers=[8], vectors={8: u / u.norm()}, scale={8: 40.0},
                               positions="last_input", strength=1.0)


def _load(platform, **kw):
    from memtoc.backends.vllm import VLLMBackend

    return VLLMBackend.load("default", device=platform.device, dtype=platform.dtype, **kw)


@pytest.fixture(scope="module")
def hf(engine_platform):
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    return load_backend(ModelSpec(model="default", backend="hf", dtype=engine_platform.dtype,
                                  device=engine_platform.device))


@pytest.mark.slow       # minutes on two cores (dynamo traces the whole model); `make test-slow` runs it
def test_a_plain_evaluate_engine_is_compiled_and_refuses_edits_in_one_line(hf, engine_platform, tmp_path,
                                                                            monkeypatch):
    """``evaluate --backend vllm`` without an edit only generates: its engine, built by the job through the one
    factory, compiles its forward (``enforce_eager`` False in the engine's model config, a compilation mode other
    than NONE); its greedy tokens agree with hf's; an edit sent to it anyway is refused in one line, before it is
    sent."""
    import vllm.envs
    from vllm.config import CompilationMode

    from memtoc.backends.base import InterventionUnsupportedError
    from memtoc.tasks.evaluation import open_evaluation
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    if engine_platform.device == "cpu":
        monkeypatch.setenv("VLLM_CPU_CI_ENV", "1")      # dynamo's eager backend instead of inductor's codegen
        getattr(vllm.envs, "disable_envs_cache", lambda: None)()   # an earlier in-process engine froze the envs
    cfg = EvaluationConfig(
        selection=EpisodeSelection(benchmark="demo", limit=1, formulations="reference"),
        job=JobSettings(progress=False, out=str(tmp_path / "run")),
        model_spec=ModelSpec(backend="vllm", device=engine_platform.device, dtype=engine_platform.dtype))
    _, v, _, _ = open_evaluation(cfg, log=lambda s: None)
    try:
        vc = v.llm.llm_engine.vllm_config
        assert vc.model_config.enforce_eager is False
        assert vc.compilation_config.mode != CompilationMode.NONE
        if engine_platform.device == "cpu":
            assert vc.compilation_config.backend == "eager"    # the switch took: dynamo without inductor
        assert "capture" not in v.capabilities and "enforce_eager" in v.hook_refusal
        e = _edit(hf.site_info.d_model)
        with pytest.raises(InterventionUnsupportedError, match="enforce_eager=True") as err:
            v.generate(PROMPTS, GenerationConfig(max_new_tokens=8), edit=e.bind(PROMPTS))
        assert "\n" not in str(err.value)
        cfg = GenerationConfig(max_new_tokens=16)
        plain = v.generate(PROMPTS, cfg)                                      # untreated requests run compiled
        assert all(g.n_new_tokens > 0 for g in plain) and engine_platform.agree(plain, hf.generate(PROMPTS, cfg))
    finally:
        del v


def test_uniprocess_engine_captures_and_edits_as_hf(hf, engine_platform, monkeypatch):
    from activations.capture import ResidualCapture

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    v = _load(engine_platform)
    try:
        assert v.workers and v.hook_refusal is None
        assert v.llm.llm_engine.vllm_config.model_config.enforce_eager is True       # built for hooks
        caps = {}
        for name, b in (("hf", hf), ("vllm", v)):
            caps[name] = ResidualCapture([0, 12, 24], "last_input,all", prompts=PROMPTS)
            b.forward(PROMPTS, capture=caps[name])
        for s in (0, 12, 24):
            x, y = caps["hf"].values[s].double().cpu(), caps["vllm"].values[s].double().cpu()
            assert float(((x - y).norm(dim=-1) / x.norm(dim=-1)).max()) < engine_platform.capture_rtol, s
        e = _edit(hf.site_info.d_model)
        cfg = GenerationConfig(max_new_tokens=16)
        got = v.generate(PROMPTS * 2, cfg, edit=e.bind(PROMPTS * 2, None, strengths=[0, 0, 1, 1]))
        want = hf.generate(PROMPTS, cfg) + hf.generate(PROMPTS, cfg, edit=e.bind(PROMPTS))
        assert engine_platform.agree(got, want)
    finally:
        del v
