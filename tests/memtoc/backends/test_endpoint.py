"""``--backend openai``: evaluation through the openai client against ``memtoc serve`` (the tiny model: records equal
``--backend hf`` untreated and edited; a kill -9 mid-run resumes without asking again) and against a stdlib fake
server (the FINAL-line cut and token count from logprobs, retries, and one line naming the endpoint for every bad
endpoint, with what was answered kept). One test does the same on the default model. The real vLLM server check is
``test_vllm_real.py::test_evaluate_through_vllm_serve_equals_the_vllm_backend``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

pytest.importorskip("openai")

import memtoc as mt  # noqa: E402
from memtoc.backends.base import Generation  # noqa: E402
from memtoc.backends.endpoint import EndpointError, kept_token_count  # noqa: E402
from memtoc.backends.factory import load_backend  # noqa: E402
from memtoc.core.values import build_config  # noqa: E402
from memtoc.core.errors import MemtocError  # noqa: E402
from memtoc.core.runtime import ModelSpec  # noqa: E402
from memtoc.jobs.evaluate import EvaluationConfig, run_evaluate  # noqa: E402
from steering.kinds.direction import DirectionEdit, save_direction_edit  # noqa: E402

#: one question, the reference formulation, a short budget: 1 closed-book + 6 tool-pass requests
RUN = dict(benchmark="demo", limit=1, formulations="reference", max_new_tokens=8, progress=False)


def _quiet(s: str) -> None:
    pass


def _content(msgs: list) -> str:
    return msgs[-1]["content"] if isinstance(msgs, list) else msgs


class Counting:
    """The tiny hf backend behind memtoc serve, counting every prompt it answers; ``hold_at``: the request with
    that number (1-based) waits for ``release`` (set ``reached`` first), so a test can kill the client meanwhile."""

    def __init__(self, backend, hold_at: int | None = None):
        self.inner, self.hold_at = backend, hold_at
        self.name, self.chat, self.tokenizer = backend.name, backend.chat, backend.tokenizer
        self.capabilities = backend.capabilities
        self.seen: Counter = Counter()
        self.order: list[str] = []      # prompts in the order they were answered
        self.n = 0
        self.reached, self.release = threading.Event(), threading.Event()

    def format_prompt(self, p):
        return self.inner.format_prompt(p)

    @property
    def site_info(self):
        return self.inner.site_info

    def generate(self, prompts, config, *, edit=None):
        for _ in prompts:
            self.n += 1
            if self.hold_at is not None and self.n == self.hold_at:
                self.reached.set()
                self.release.wait()
        out = self.inner.generate(prompts, config, edit=edit)
        for p in prompts:
            self.seen[_content(p)] += 1
            self.order.append(_content(p))
        return out


@pytest.fixture(scope="module")
def push_spec(tiny_backend, tmp_path_factory):
    """A direction edit on the tool output's tokens that changes the tiny model's answers."""
    d = tiny_backend.site_info.d_model
    u = torch.randn(d, generator=torch.Generator().manual_seed(0))
    edit = DirectionEdit.build(name="push", layers=[2], vectors={2: u / u.norm()}, scale={2: 30.0}, strength=1.0,
                               positions="tool_span")
    return save_direction_edit(tmp_path_factory.mktemp("edit") / "push.json", edit)


@pytest.fixture(scope="module")
def hf_runs(tiny_backend, push_spec, tmp_path_factory):
    """The reference: ``--backend hf`` on the tiny model, untreated and edited."""
    root = tmp_path_factory.mktemp("hf")
    plain = run_evaluate(build_config(EvaluationConfig, {**RUN, "out": str(root / "plain")}), backend=tiny_backend,
                         log=_quiet)
    edited = run_evaluate(build_config(EvaluationConfig, {**RUN, "out": str(root / "edited"), "edit": str(push_spec)}),
                          backend=tiny_backend, log=_quiet)
    return plain.records, edited.records


def _openai_cfg(url: str, out: Path, **kw) -> EvaluationConfig:
    return build_config(EvaluationConfig, {**RUN, **kw, "out": str(out), "backend": "openai", "base_url": url + "/v1",
                                           "model": "default"})


def test_records_through_memtoc_serve_equal_hf_untreated_and_edited(tiny_backend, push_spec, hf_runs, tmp_path):
    """The records of ``evaluate --backend openai`` against memtoc serve equal ``--backend hf``'s record for record;
    with ``--edit`` (a tool_span edit, passed by name in extra_body) equal to hf's edited run."""
    plain, edited = hf_runs
    assert [r["response"] for r in plain] != [r["response"] for r in edited]     # the edit changes answers
    counting = Counting(tiny_backend)
    with mt.serve(backend=counting, port=0, edits=str(push_spec), wait=False) as server:
        got = run_evaluate(_openai_cfg(server.url, tmp_path / "plain", concurrency=3), log=_quiet)
        asked = Counter(counting.seen)
        got_edited = run_evaluate(_openai_cfg(server.url, tmp_path / "edited", edit=str(push_spec)), log=_quiet)
    assert got.records == plain
    assert got_edited.records == edited
    info = json.loads((tmp_path / "plain" / "run.json").read_text())
    prov = info["provenance"]
    assert prov["backend"] == "openai" and prov["endpoint"] == server.url + "/v1" and prov["server"] == "memtoc"
    assert [m["id"] for m in prov["served_models"]] == ["default"]
    prompts = {r["prompt"] for r in plain} | {r["closed_book_prompt"] for r in plain}
    assert set(asked) == prompts and set(asked.values()) == {1}     # one request per distinct prompt
    assert len((tmp_path / "plain" / "answers.jsonl").read_text().splitlines()) == len(prompts)


@pytest.mark.real_model
def test_records_through_memtoc_serve_equal_hf_on_the_default_model(default_backend, tmp_path):
    """The same equality on the embedded default model (one question, ``tool_wrong``): ``evaluate --backend openai``
    against ``memtoc serve`` gives ``--backend hf``'s records, FINAL-line stop included."""
    run = dict(RUN, conditions="tool_wrong", max_new_tokens=32)
    want = run_evaluate(build_config(EvaluationConfig, {**run, "out": str(tmp_path / "hf")}), backend=default_backend,
                        log=_quiet)
    with mt.serve(backend=default_backend, port=0, wait=False) as server:
        got = run_evaluate(_openai_cfg(server.url, tmp_path / "openai", **run), log=_quiet)
    assert len(want.records) == 1 and got.records == want.records


def _cli(url: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "memtoc.cli", "evaluate", "--backend", "openai", "--base-url", url + "/v1",
            "--model", "default", "--out", str(out), "--benchmark", "demo", "--limit", "1", "--formulations",
            "reference", "--max-new-tokens", "8", "--no-progress", *extra]


def test_a_killed_run_resumes_without_asking_again_for_an_answered_episode(tiny_backend, hf_runs, tmp_path):
    """kill -9 while the 4th request is at the server (three answered and logged: the closed book and two tool
    prompts of a batch of four, so no tool record is written yet); the rerun gives hf's records, the server answered
    each logged prompt once, and only the prompt in flight at the kill was sent again."""
    plain, _ = hf_runs
    counting = Counting(tiny_backend, hold_at=4)
    out = tmp_path / "run"
    with mt.serve(backend=counting, port=0, wait=False) as server:
        proc = subprocess.Popen(_cli(server.url, out, "--concurrency", "1", "--batch-size", "4"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        reached = False
        while proc.poll() is None and not reached:
            reached = counting.reached.wait(0.1)
        assert reached, proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert len((out / "answers.jsonl").read_text().splitlines()) == 3
        assert not (out / "episodes.jsonl").exists()
        counting.release.set()                 # the held request is answered to a client that is gone
        while len(counting.order) < 4:
            time.sleep(0.01)
        again = run_evaluate(_openai_cfg(server.url, out, concurrency=1, batch_size=4), log=_quiet)
    assert again.records == plain
    answered, held = counting.order[:3], counting.order[3]
    assert all(counting.seen[p] == 1 for p in answered)
    assert counting.seen[held] == 2
    assert sorted(counting.seen.values()) == [1] * (len(counting.seen) - 1) + [2]


# -- a stdlib fake server: every bad endpoint ------------------------------------------------------------------

ANSWER = "Let me think.\nFINAL: Paris\nand some words past the line"


class Fake:
    """An OpenAI-compatible fake: ``mode`` says how chat requests are answered after the first ``ok_first`` (which
    are answered well): ``ok``, ``401``, ``404``, ``empty`` (no choice), ``slow`` (longer than the client waits),
    ``503once`` (a 503 then answers)."""

    def __init__(self, mode: str = "ok", ok_first: int = 0):
        self.mode, self.ok_first = mode, ok_first
        self.posts: list[str] = []
        self.answered: Counter = Counter()
        self.gets = 0
        self.release_slow = threading.Event()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, status, payload, headers=()):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.gets += 1
                self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model",
                                                             "owned_by": "someone"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                fake.posts.append(prompt)
                mode = "ok" if len(fake.posts) <= fake.ok_first else fake.mode
                if mode == "503once" and fake.posts.count(prompt) == 1:
                    return self._send(503, {"error": {"message": "busy"}}, [("retry-after-ms", "10")])
                if mode == "401":
                    return self._send(401, {"error": {"message": "Incorrect API key provided"}})
                if mode == "404":
                    return self._send(404, {"error": {"message": "The model `fake-model` does not exist"}})
                if mode == "slow":
                    fake.release_slow.wait()           # longer than the client waits: answered at close
                fake.answered[prompt] += 1
                pieces = [ANSWER[i:i + 3] for i in range(0, len(ANSWER), 3)]
                choices = [] if mode == "empty" else [{
                    "index": 0, "finish_reason": "length",
                    "message": {"role": "assistant", "content": ANSWER},
                    "logprobs": {"content": [{"token": p, "logprob": 0.0, "bytes": list(p.encode()),
                                              "top_logprobs": []} for p in pieces]}}]
                self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model",
                                 "choices": choices,
                                 "usage": {"prompt_tokens": 11, "completion_tokens": len(pieces),
                                           "total_tokens": 11 + len(pieces)}})

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass                                    # a client that left: nothing to say

        self.httpd = Quiet(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release_slow.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def fake():
    servers = []

    def make(mode="ok", ok_first=0):
        servers.append(Fake(mode, ok_first))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _fake_cfg(url: str, out: Path, **kw) -> EvaluationConfig:
    return build_config(EvaluationConfig, {**RUN, "max_new_tokens": 64, "request_retries": 0, "request_timeout": 0.5,
                                           **kw, "out": str(out), "backend": "openai", "base_url": url,
                                           "model": "fake-model"})


def test_the_final_line_cut_and_the_kept_tokens_come_from_the_logprob_pieces(fake, tmp_path):
    """A generic server generates to the budget: the text is cut after the FINAL line as every backend cuts it,
    and the kept tokens are the pieces covering the cut text (not the server's completion count)."""
    f = fake("ok")
    res = run_evaluate(_fake_cfg(f.url, tmp_path / "run", concurrency=4), log=_quiet)
    kept = "Let me think.\nFINAL: Paris\n"
    assert {r["response"] for r in res.records} == {kept}
    assert {r["stop_reason"] for r in res.records} == {"final_line"}
    assert {r["n_new_tokens"] for r in res.records} == {-(-len(kept) // 3)}     # 3-character pieces
    assert {r["n_prompt_tokens"] for r in res.records} == {11}
    assert kept_token_count([b"FI", b"NAL", b": \xc3", b"\xa9\n", b"more"], "FINAL: \u00e9\n") == 4


def test_a_503_is_retried_with_backoff(fake, tmp_path):
    f = fake("503once")
    res = run_evaluate(_fake_cfg(f.url, tmp_path / "run", request_retries=2), log=_quiet)
    assert len(res.records) == 6
    assert set(Counter(f.posts).values()) == {2}                   # each prompt: the 503, then its answer
    assert set(f.answered.values()) == {1}


def _refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("mode,needle", [("refused", "cannot connect"), ("401", "401 unauthorized"),
                                         ("404", "404 not found for model 'fake-model'"),
                                         ("empty", "no choice"), ("slow", "no answer within --request-timeout")])
def test_a_bad_endpoint_is_one_line_naming_it_and_answers_are_kept(mode, needle, fake, tmp_path):
    """Refused connection, 401, 404 for the model, an empty choice, a server slower than the timeout: one line
    naming the endpoint. The closed-book answer (answered before the failure) is kept: the rerun against a
    working server asks only for the rest."""
    out = tmp_path / "run"
    if mode == "refused":
        url = _refused_url()
        with pytest.raises(EndpointError) as err:
            run_evaluate(_fake_cfg(url, out), log=_quiet)
        assert not out.exists()                   # refused when the backend loads (/v1/models), nothing written
    else:
        f = fake(mode, ok_first=1)
        url = f.url
        with pytest.raises(EndpointError) as err:
            run_evaluate(_fake_cfg(url, out, concurrency=1), log=_quiet)
        logged = (out / "answers.jsonl").read_text().splitlines()
        assert len(logged) == 1                                   # the first request, answered, is kept
        good = fake("ok")
        again = run_evaluate(_fake_cfg(good.url, out, concurrency=1), log=_quiet)
        assert len(again.records) == 6 and f.posts[0] not in good.posts
    msg = str(err.value)
    assert needle in msg and url in msg and "\n" not in msg, msg


def test_the_cli_says_a_bad_endpoint_in_one_line(tmp_path, capsys):
    from memtoc.cli import main

    url = _refused_url()
    rc = main(["evaluate", "--backend", "openai", "--base-url", url, "--model", "m", "--out", str(tmp_path / "r"),
               "--limit", "1", "--request-retries", "0", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and url in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_capture_and_edits_are_refused_before_any_request(fake, push_spec, tmp_path):
    """A job that hooks the model (extract, sweep) is refused by the loader, and an edit for a server that is not
    memtoc serve by the backend, both before any chat request; a missing --base-url names the option."""
    f = fake("ok")
    with pytest.raises(MemtocError, match="generates only"):
        load_backend(ModelSpec(backend="openai", base_url=f.url, model="fake-model"), hooks=True)
    assert f.gets == 0 and f.posts == []
    with pytest.raises(MemtocError, match="not a memtoc serve endpoint"):
        run_evaluate(_fake_cfg(f.url, tmp_path / "run", edit=str(push_spec)), log=_quiet)
    assert f.posts == []
    with pytest.raises(MemtocError, match="--base-url"):
        load_backend(ModelSpec(backend="openai", model="fake-model"), hooks=False)
    with pytest.raises(MemtocError, match="openai backend"):
        load_backend(ModelSpec(backend="hf", base_url=f.url), hooks=False)


def test_an_edit_the_server_was_not_started_with_is_refused_before_any_request(tiny_backend, push_spec, tmp_path):
    """No edit of that name, or one of that name from another spec (another scale): refused before any request."""
    counting = Counting(tiny_backend)
    with mt.serve(backend=counting, port=0, wait=False) as server:
        with pytest.raises(MemtocError, match="has no edit 'push'"):
            run_evaluate(_openai_cfg(server.url, tmp_path / "run", edit=str(push_spec)), log=_quiet)
    other = mt.load_edit(push_spec)
    other = DirectionEdit.build(name="push", layers=[2], vectors={2: other.vectors[2]}, scale={2: 5.0}, strength=1.0,
                                positions="tool_span")
    other_spec = save_direction_edit(tmp_path / "other" / "push.json", other)
    with mt.serve(backend=counting, port=0, edits=str(other_spec), wait=False) as server:
        with pytest.raises(MemtocError, match="is another spec"):
            run_evaluate(_openai_cfg(server.url, tmp_path / "run2", edit=str(push_spec)), log=_quiet)
    assert counting.n == 0


def test_an_answer_found_in_the_log_is_never_asked(fake, tmp_path):
    """The backend's own rule, without a job: a second backend on the same log asks nothing."""
    from memtoc.core.runtime import GenerationConfig

    f = fake("ok")
    spec = ModelSpec(backend="openai", base_url=f.url, model="fake-model", request_retries=0)
    cfg = GenerationConfig(max_new_tokens=16)
    one = load_backend(spec, hooks=False)
    one.keep_answers(tmp_path / "answers.jsonl")
    first = one.generate(["a", "b"], cfg)
    two = load_backend(spec, hooks=False)
    two.keep_answers(tmp_path / "answers.jsonl")
    assert two.generate(["b", "a"], cfg) == first[::-1]
    assert sorted(f.posts) == ["a", "b"]
    assert isinstance(first[0], Generation)


def test_the_key_comes_from_the_environment_only(fake, monkeypatch):
    f = fake("ok")
    monkeypatch.setenv("MEMTOC_OPENAI_API_KEY", "sk-test")
    backend = load_backend(ModelSpec(backend="openai", base_url=f.url, model="fake-model"), hooks=False)
    prov = backend.provenance()
    assert prov["api_key_env"] == "MEMTOC_OPENAI_API_KEY" and "sk-test" not in json.dumps(prov)
    assert backend.client.api_key == "sk-test"
    assert os.environ["MEMTOC_OPENAI_API_KEY"] == "sk-test"


def test_chat_template_off_is_refused_before_any_request(fake, tmp_path, capsys):
    """The backend sends chat messages (the server applies its own template), so ``--chat-template off`` (raw
    completion) cannot be honoured: one line naming the option and the backend, before /v1/models is read and
    before the run folder exists; auto and on still load."""
    from memtoc.cli import main

    f = fake("ok")
    with pytest.raises(MemtocError, match="--chat-template off .* openai backend") as err:
        load_backend(ModelSpec(backend="openai", base_url=f.url, model="fake-model", chat_template=False),
                     hooks=False)
    assert "\n" not in str(err.value) and f.gets == 0
    out = tmp_path / "run"
    rc = main(["evaluate", "--backend", "openai", "--base-url", f.url, "--model", "fake-model", "--chat-template",
               "off", "--out", str(out), "--limit", "1", "--no-progress"])
    msg = capsys.readouterr().err.strip()
    assert rc != 0 and "--chat-template off" in msg and len(msg.splitlines()) == 1, msg
    assert f.gets == 0 and f.posts == [] and not out.exists()
    for mode in (None, True):
        load_backend(ModelSpec(backend="openai", base_url=f.url, model="fake-model", chat_template=mode), hooks=False)
