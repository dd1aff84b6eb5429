"""The vLLM worker extension without vLLM: fake workers (ranks, runner, a tiny Llama-shaped model) run the same
dispatcher, sessions and pickled hooks that the real engine's workers run.

What the real tier cannot show on one CPU: tensor-parallel ranks (edits on every rank, capture on rank 0),
pipeline stages (each hooks the blocks it owns, results merged), the V2 runner's refusal, a compiled engine's
refusal, and that a rank whose hooks did not run makes the pass fail instead of returning untreated tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from memtoc.backends import vllm_worker
from memtoc.backends.base import InterventionUnsupportedError
from memtoc.backends.vllm_rows import TAG, Dispatcher, RunnerV2Error

D = 8
N_LAYERS = 4


def _load_fake_vllm():
    """``benchmarks/fake_vllm.py``: the fake worker the GPU check drives too (benchmarks is no package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "fake_vllm.py"
    spec = importlib.util.spec_from_file_location("memtoc_tests_fake_vllm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fake_vllm = _load_fake_vllm()


def Model(start: int = 0, end: int = N_LAYERS) -> nn.Module:
    """Blocks ``start .. end`` of the fake Llama-shaped model (``benchmarks/fake_vllm.py``, which the GPU check
    drives on the device too)."""
    return fake_vllm.Model(D, N_LAYERS, start, end)


Worker = fake_vllm.Worker


def Runner() -> fake_vllm.Runner:
    return fake_vllm.Runner(Model())


@pytest.fixture
def ranked(monkeypatch):
    """``vllm_worker.ranks()`` answers for the worker whose method is running."""
    current = {"w": None}

    def ranks():
        w = current["w"]
        return (w.tp, w.pp) if w is not None else (0, 0)

    monkeypatch.setattr(vllm_worker, "ranks", ranks)

    def call(w, method, *args):
        current["w"] = w
        try:
            return getattr(w, method)(*args)
        finally:
            current["w"] = None
    return call


def _tag(sid: str, row: int) -> dict:
    return {TAG: {"s": [sid], "r": row}}


def _embed(n: int) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(7))


def _prefill(w: Worker, reqs, emb: torch.Tensor, *, hooked: bool = True):
    n = w.runner.schedule(reqs)
    if hooked:
        return w.model(torch.arange(n), emb[:n])
    with torch.no_grad():     # a forward that skips the hooks (a compiled graph would)
        h, r = emb[:n], None
        for layer in w.model.model.layers[w.model.model.start_layer:w.model.model.end_layer]:
            h, r = layer.forward(torch.arange(n), h, r)
        return h, r


def _reference_stream(emb: torch.Tensor, edit_at: int | None = None, delta: torch.Tensor | None = None,
                      rows: slice | None = None) -> dict[int, torch.Tensor]:
    """The stream at every site of one un-split model (site 0 = block 0's input), with an optional edit."""
    full = Model()
    out = {0: emb.clone()}
    h, r = emb.clone(), None
    for i, layer in enumerate(full.model.layers):
        h, r = layer(None, h, r)
        s = h + r
        if edit_at == i + 1:
            s = s.clone()
            s[rows] += delta
            h, r = torch.zeros_like(h), s
        out[i + 1] = s
    return out


# -- the V2 runner and compiled engines --------------------------------------------------------------------------

def test_v2_runner_is_refused_naming_the_setting():
    """The V2 runner (vllm/v1/worker/gpu/model_runner.py) keeps no input_batch and no cached request states."""
    v2 = SimpleNamespace(get_model=lambda: Model(), model_state=object(), req_states=object())
    w = Worker(Model())
    w.model_runner = v2
    info = w.memtoc_info()
    assert info["v1_runner"] is False and "VLLM_USE_V2_MODEL_RUNNER=0" in info["refusal"]
    with pytest.raises(RunnerV2Error, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        Dispatcher(Model(), "llama", v2)
    assert Worker(Model()).memtoc_info()["v1_runner"] is True


class RpcLLM:
    """A ``vllm.LLM`` whose workers answer ``memtoc_info`` as given; records what else is sent."""

    def __init__(self, infos, tokenizer):
        self.infos, self.sent, self.tokenizer = infos, [], tokenizer

    def collective_rpc(self, method, args=()):
        self.sent.append(method)
        if method == "memtoc_info":
            return self.infos
        raise AssertionError(f"{method} must not be called")

    def enqueue(self, *a, **k):
        self.sent.append("enqueue")
        raise AssertionError("no request may be sent")

    def get_tokenizer(self):
        return self.tokenizer


@pytest.mark.parametrize("info, match", [
    ({"v1_runner": False, "refusal": None, "eager": True}, "VLLM_USE_V2_MODEL_RUNNER=0"),
    ({"v1_runner": True, "eager": False}, "enforce_eager=True"),
])
def test_engines_hooks_cannot_run_in_refuse_hooked_requests_before_sending(info, match, tiny_model_dir,
                                                                         monkeypatch):
    import sys
    import types

    from transformers import AutoTokenizer

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)

    from memtoc.core.backend_kinds import TEXT_CAPABILITIES, TOOL_PARSERS
    from memtoc.core.runtime import GenerationConfig
    from memtoc.backends.vllm import VLLMBackend
    from memtoc.backends.vllm_rows import V2_REFUSAL
    from steering.kinds.direction import DirectionEdit

    if info.get("refusal", 1) is None:
        info = {**info, "refusal": V2_REFUSAL}
    llm = RpcLLM([info], AutoTokenizer.from_pretrained(tiny_model_dir))
    b = VLLMBackend(llm, device="cuda")
    assert b.capabilities == TEXT_CAPABILITIES | {TOOL_PARSERS} and match in b.hook_refusal
    u = torch.zeros(32)
    u[0] = 1.0
    edit = DirectionEdit.build(name="t", layers=[1], vectors={1: u}, scale={1: 1.0}, strength=1.0)
    with pytest.raises(InterventionUnsupportedError, match=match):
        b.generate(["Q?"], GenerationConfig(), edit=edit.bind(["Q?"]))
    assert llm.sent == ["memtoc_info"]


# -- tensor and pipeline parallel ------------------------------------------------------------------------------

def _hooks(sites=(0, 2, 4), edit_site=2, strengths=(1.0, 0.0)):
    """A capture of every token at ``sites`` and a direction edit at ``edit_site`` (a strength per request), as
    the backend pickles them: the caller-side objects."""
    from memtoc.backends.plans import CapturePlan, PositionPlan
    from memtoc.backends.vllm_plans import PlanTokenHook, TokenCapture
    from steering.kinds.direction import DirectionEdit

    cap = TokenCapture(CapturePlan(tuple(sites), rows=np.array([0, 0, 0, 1, 1]), columns=np.array([0, 1, 2, 1, 2]),
                                   token_index=np.array([0, 1, 2, 0, 1]), n_tokens=[3, 2]), D, torch.float32)
    u = torch.ones(D) / D ** 0.5
    edit = DirectionEdit.build(name="t", layers=[edit_site], vectors={edit_site: u}, scale={edit_site: 3.0},
                               positions="last_input", strength=1.0)
    mask = np.zeros((2, 3), bool)
    mask[0, 2] = mask[1, 2] = True                # the last prompt token of each (row 1 left-padded by 1)
    plan = PositionPlan(prompt_mask=mask, generated_rows=np.zeros(2, bool), n_pad=np.array([0, 1]))
    ed = PlanTokenHook(plan, edit, list(strengths), [0, 1], D)
    return cap, ed, edit


def test_tensor_parallel_edits_on_every_rank_capture_on_rank_0(ranked):
    """Two TP ranks hold replicated streams: both edit, rank 0 captures; results merge; the captured stream is
    the edited one, equal to an un-split reference."""
    cap, ed, edit = _hooks()
    workers = [Worker(Model(), tp=0), Worker(Model(), tp=1)]
    blob = vllm_worker.dumps([([2], ed), ([0, 2, 4], cap)])
    assert [ranked(w, "memtoc_open", "s1", blob) for w in workers] == [True, True]
    emb = _embed(5)
    reqs = [("a-1", _tag("s1", 0), 0, 3), ("b-2", _tag("s1", 1), 0, 2)]
    outs = [_prefill(w, reqs, emb) for w in workers]
    assert torch.equal(outs[0][0], outs[1][0])
    replies = [vllm_worker.loads(ranked(w, "memtoc_close", "s1")) for w in workers]
    assert [r["hooks"][1] is None for r in replies] == [False, True]       # capture on tp rank 0 only
    assert all(r["hooks"][0]["prompt"][2].tolist() == [1, 0] for r in replies)  # edits on both; row 1 at 0
    ed.absorb([(r, r["hooks"][0]) for r in replies], [0, 0])
    cap.absorb([(r, r["hooks"][1]) for r in replies], [0, 0])
    got = cap.result()
    delta = torch.ones(D) / D ** 0.5 * 3.0
    ref = _reference_stream(emb, edit_at=2, delta=delta, rows=slice(2, 3))     # last token of request 0
    for s in (0, 2, 4):
        assert torch.allclose(got[s], ref[s], atol=1e-6), s
    assert not torch.allclose(got[4], _reference_stream(emb)[4])


def test_a_rank_whose_hooks_did_not_run_fails_the_pass(ranked):
    """Rank 1 runs its forward without the hooks (a compiled graph): absorb raises naming the rank and site."""
    _, ed, _ = _hooks()
    workers = [Worker(Model(), tp=0), Worker(Model(), tp=1)]
    blob = vllm_worker.dumps([([2], ed)])
    for w in workers:
        ranked(w, "memtoc_open", "s2", blob)
    emb = _embed(5)
    reqs = [("a-1", _tag("s2", 0), 0, 3), ("b-2", _tag("s2", 1), 0, 2)]
    _prefill(workers[0], reqs, emb)
    _prefill(workers[1], reqs, emb, hooked=False)
    replies = [vllm_worker.loads(ranked(w, "memtoc_close", "s2")) for w in workers]
    with pytest.raises(InterventionUnsupportedError, match=r"0 of 1 planned prompt rows .* site 2 .*tp1/pp0"):
        ed.absorb([(r, r["hooks"][0]) for r in replies], [0, 0])


def test_pipeline_stages_hook_the_blocks_they_own(ranked):
    """Stage 0 owns blocks 0-1 (sites 0..2), stage 1 blocks 2-3 (sites 3, 4): each captures its sites, the caller
    merges them, and the merged stream equals the un-split model's."""
    cap, _, _ = _hooks(sites=(0, 2, 3, 4))
    full = Model()
    s0, s1 = Model(0, 2), Model(2, N_LAYERS)
    for i in range(N_LAYERS):          # the stages hold the full model's weights for their blocks
        (s0 if i < 2 else s1).model.layers[i].load_state_dict(full.model.layers[i].state_dict())
    w0, w1 = Worker(s0, pp=0), Worker(s1, pp=1)
    blob = vllm_worker.dumps([([0, 2, 3, 4], cap)])
    for w in (w0, w1):
        ranked(w, "memtoc_open", "s3", blob)
    emb = _embed(5)
    reqs = [("a-1", _tag("s3", 0), 0, 3), ("b-2", _tag("s3", 1), 0, 2)]
    h, r = _prefill(w0, reqs, emb)
    w1.runner.schedule(reqs)
    w1.model.forward(torch.arange(5), h, r)
    replies = [vllm_worker.loads(ranked(w, "memtoc_close", "s3")) for w in (w0, w1)]
    assert replies[0]["owned"] == [0, 1, 2] and replies[1]["owned"] == [3, 4]
    assert set(replies[0]["hooks"][0]) == {0, 2} and set(replies[1]["hooks"][0]) == {3, 4}
    cap.absorb([(r, r["hooks"][0]) for r in replies], [0, 0])
    ref = _reference_stream(emb)
    got = cap.result()
    for s in (0, 2, 3, 4):
        assert torch.allclose(got[s], ref[s], atol=1e-6), s


def test_untagged_requests_and_other_sessions_are_never_touched(ranked):
    """A request without the tag (untreated, maybe from the prefix cache) and one of another session keep their
    stream; a closed session leaves no hook behind."""
    _, ed, _ = _hooks(strengths=(1.0, 1.0))
    w = Worker(Model())
    ranked(w, "memtoc_open", "s4", vllm_worker.dumps([([2], ed)]))
    emb = _embed(5)
    plain = _prefill(Worker(Model()), [("x", None, 0, 3), ("y", None, 0, 2)], emb, hooked=False)
    got = _prefill(w, [("x", None, 0, 3), ("y", _tag("other", 1), 0, 2)], emb)
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
    ranked(w, "memtoc_close", "s4")
    assert not w.model.model.layers[1]._forward_hooks and not w.model.model.layers[0]._forward_pre_hooks


def test_an_unbound_edit_through_a_preformatted_view_sees_the_pass(monkeypatch, tiny_model_dir):
    """``Edit.attach`` opens its hooks on a ``preformatted()`` view while the backend itself runs the pass: both
    share the open sessions and the per-row counts the check reads."""
    from transformers import AutoTokenizer

    from memtoc.backends.vllm import VLLMBackend

    llm = RpcLLM([{"v1_runner": True, "eager": True, "refusal": None}], AutoTokenizer.from_pretrained(tiny_model_dir))
    b = VLLMBackend(llm, device="cpu")
    view = b.preformatted()
    view._sessions.append("s")
    b._fed[:] = [3, 4]
    assert b._sessions == ["s"] and view._fed == [3, 4]


# -- the engine's execution context ------------------------------------------------------------------------------

def test_staged_capture_under_inference_mode_closes_from_an_rpc_outside_it(ranked):
    """What a GPU worker does: forwards run under ``torch.inference_mode()`` (vLLM's ``execute_model``), rows are
    staged to host buffers and scattered by a later forward's flush or by ``memtoc_close``, an RPC that runs outside
    inference mode. Staging is forced on the CPU, so this is the CUDA path; over two chunked-prefill forwards the
    captured stream equals the un-split model's, and the close leaves no hook behind."""
    cap, ed, _ = _hooks(sites=(0, 2, 4), strengths=(0.0, 0.0))
    cap.stage = True
    w = Worker(Model())
    ranked(w, "memtoc_open", "s5", vllm_worker.dumps([([2], ed), ([0, 2, 4], cap)]))
    emb = _embed(5)
    with torch.inference_mode():       # chunked prefill: request a's third token arrives in the second step
        w.runner.schedule([("a-1", _tag("s5", 0), 0, 2), ("b-2", _tag("s5", 1), 0, 2)])
        w.model(torch.arange(4), emb[[0, 1, 3, 4]])
    with torch.inference_mode():
        w.runner.schedule([("a-1", _tag("s5", 0), 2, 1)])
        w.model(torch.arange(1), emb[[2]])
    worker_cap = w._memtoc_sessions["s5"][1]
    assert worker_cap.staged and {s for s, _, _ in worker_cap.staged} == {0, 2, 4}    # the staged path ran
    reply = vllm_worker.loads(ranked(w, "memtoc_close", "s5"))
    assert reply["error"] is None
    assert not w.model.model.layers[1]._forward_hooks and not w.model.model.layers[0]._forward_pre_hooks
    cap.absorb([(reply, reply["hooks"][1])], [0, 0])
    got, ref = cap.result(), _reference_stream(emb)
    for s in (0, 2, 4):
        assert torch.allclose(got[s], ref[s], atol=1e-6), s


def test_a_flush_that_raises_is_reported_and_the_session_still_closes(ranked):
    """A staged scatter that fails (here: forced) is that session's error in one line; the session is popped and
    its hooks uninstalled, and a later session on the same worker captures normally."""
    cap, _, _ = _hooks(sites=(2,))
    cap.stage = True
    w = Worker(Model())
    ranked(w, "memtoc_open", "s6", vllm_worker.dumps([([2], cap)]))
    emb = _embed(5)
    reqs = [("a-1", _tag("s6", 0), 0, 3), ("b-2", _tag("s6", 1), 0, 2)]
    with torch.inference_mode():
        _prefill(w, reqs, emb)
    worker_cap = w._memtoc_sessions["s6"][0]

    def boom():
        worker_cap.staged = []
        raise RuntimeError("scatter failed\nsecond line")

    worker_cap.flush = boom
    worker_cap.collect = boom
    reply = vllm_worker.loads(ranked(w, "memtoc_close", "s6"))
    assert reply["error"] == "RuntimeError: scatter failed" and reply["hooks"] == [None]
    d = w.memtoc_dispatcher()
    assert "s6" not in d.sessions and "s6" not in d.errors and "s6" not in w._memtoc_sessions
    assert not w.model.model.layers[1]._forward_hooks and not w.model.model.layers[0]._forward_pre_hooks
    cap2, _, _ = _hooks(sites=(2,))
    ranked(w, "memtoc_open", "s7", vllm_worker.dumps([([2], cap2)]))
    with torch.inference_mode():
        _prefill(w, [(r, _tag("s7", i), 0, n) for i, (r, _, _, n) in enumerate(reqs)], emb)
    reply = vllm_worker.loads(ranked(w, "memtoc_close", "s7"))
    cap2.absorb([(reply, reply["hooks"][0])], [0, 0])
    assert torch.allclose(cap2.result()[2], _reference_stream(emb)[2], atol=1e-6)


def test_selected_rows_are_copied_to_the_stream_device_once_per_forward():
    """``_Active.on``: on the CPU the host index is the index; on another device (``meta`` stands in for a GPU)
    it is copied there once and reused by every site of the forward."""
    from memtoc.backends.vllm_rows import TokenRows, _Active

    idx = torch.tensor([0, 2])
    a = _Active("s", None, frozenset({1}), TokenRows(torch.zeros(3, dtype=torch.long), torch.arange(3)), idx)
    assert a.on(torch.device("cpu")) is idx
    on_dev = a.on(torch.device("meta"))
    assert on_dev.device.type == "meta" and on_dev.shape == idx.shape and a.on(torch.device("meta")) is on_dev


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8 dtype")
def test_hooks_are_prepared_in_a_math_dtype_when_the_weights_are_float8():
    """An FP8 checkpoint's first parameter is float8: a hook's ``prepare`` gets float32, never a storage dtype."""
    model = Model()
    model.model.layers[0].lin.to(torch.float8_e4m3fn)
    got = []
    hook = SimpleNamespace(prepare=lambda device, dtype: got.append((device, dtype)))
    Dispatcher(model, "llama", Runner()).open("s8", [([1], hook)])
    assert got == [(torch.device("cpu"), torch.float32)]
