"""``memtoc serve``: the HTTP layer over a fake backend (request checks, batching, errors) and the tiny hf model
(served tokens equal the backend's own generate with the same edit). The real-vLLM check is in
``tests/memtoc/backends/test_vllm_real.py``."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

from memtoc.backends.base import Generation
from memtoc.core.errors import MemtocError
from memtoc.core.runtime import GenerationConfig
from memtoc.jobs.serve import ServeConfig, Server, start_server
from steering.kinds.direction import DirectionEdit, save_direction_edit


def _post(url: str, body, *, raw: bytes | None = None, route: str = "/v1/generate") -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url + route, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _edit(d: int = 8, *, site: int = 1, scale: float = 1.0, positions: str = "last_input", name: str = "t"):
    u = torch.zeros(d)
    u[0] = 1.0
    return DirectionEdit.build(name=name, layers=[site], vectors={site: u}, scale={site: scale}, strength=1.0,
                               positions=positions)


class FakeBackend:
    """Answers each row with its prompt and strength; records every generate call. ``gate``: the first call waits
    for it (so the test can queue requests behind a running pass); ``fail_edited``: edited calls raise."""

    name, chat, tokenizer = "fake", False, None
    capabilities = frozenset({"generate", "edits", "row_edits"})

    def __init__(self, gate: threading.Event | None = None, fail_edited: bool = False):
        self.calls: list[tuple[list, list | None, int]] = []
        self.gate, self.fail_edited = gate, fail_edited
        self.entered = threading.Event()          # the first pass reached the gate

    def format_prompt(self, p):
        return p if isinstance(p, str) else "\n".join(m["content"] for m in p)

    def generate(self, prompts, config, *, edit=None):
        if self.gate is not None and not self.calls:
            self.calls.append(None)           # seen: the gate holds the first pass only
            self.entered.set()
            self.gate.wait()
        strengths = None if edit is None else edit.row_strengths()
        self.calls.append((list(prompts), strengths, config.max_new_tokens))
        if edit is not None and self.fail_edited:
            raise MemtocError("edit hook at site 1 ran on 0 of 1 planned rows")
        st = strengths or [None] * len(prompts)
        return [Generation(text=f"{self.format_prompt(p)}|{s}", n_prompt_tokens=3, n_new_tokens=2,
                           stop_reason="max_tokens", token_ids=(len(str(p)), 0 if s is None else int(s)))
                for p, s in zip(prompts, st)]


@pytest.fixture()
def fake_server():
    servers = []

    def make(backend=None, edits=None, **cfg):
        b = backend or FakeBackend()
        s = Server(ServeConfig(port=0, **cfg), b, {"t": _edit()} if edits is None else edits).start()
        servers.append(s)
        return s.start_engine(), b

    yield make
    for s in servers:
        s.close()


BAD = [
    ([1, 2], "body: must be a JSON object"),
    ({}, "exactly one of 'prompt'"),
    ({"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "exactly one of 'prompt'"),
    ({"prompt": ""}, "field 'prompt'"),
    ({"messages": [{"role": "user"}]}, "field 'messages[0]'"),
    ({"prompt": "a", "max_tokens": 0}, "field 'max_tokens'"),
    ({"prompt": "a", "max_tokens": "5"}, "field 'max_tokens'"),
    ({"prompt": "a", "max_token": 5}, "field 'max_token': unknown"),
    ({"prompt": "a", "stop_at_final_line": "yes"}, "field 'stop_at_final_line'"),
    ({"prompt": "a", "edit": "nope"}, "field 'edit.name': no edit 'nope'"),
    ({"prompt": "a", "edit": 3}, "field 'edit'"),
    ({"prompt": "a", "edit": {"name": "t", "strength": "big"}}, "field 'edit.strength'"),
    ({"prompt": "a", "edit": {"name": "t", "layer": 3}}, "field 'edit.layer': unknown"),
    ({"prompt": "a", "edit": {"name": "t", "direction": "up"}}, "field 'edit.direction'"),
    ({"prompt": "a", "tool_span": [0, 1]}, "field 'tool_span': only an edit reads it"),
    ({"prompt": "a", "edit": "t", "tool_span": [0, 9]}, "field 'tool_span'"),
]


@pytest.mark.parametrize("body, message", BAD, ids=[m for _, m in BAD])
def test_a_bad_body_is_a_400_naming_the_field_and_never_reaches_the_engine(fake_server, body, message):
    server, backend = fake_server()
    status, payload = _post(server.url, body)
    assert status == 400 and message in payload["error"], payload
    assert "\n" not in payload["error"] and "Traceback" not in payload["error"]
    assert backend.calls == []


def test_not_json_missing_routes_and_health(fake_server):
    server, backend = fake_server()
    assert _post(server.url, None, raw=b"{not json")[0] == 400
    with urllib.request.urlopen(server.url + "/health") as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["backend"] == "fake" and health["edits"]["t"]["layers"] == [1]
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(server.url + "/v2/nothing")
    assert exc.value.code == 404
    assert backend.calls == []


def test_an_edit_on_tool_positions_needs_a_tool_span(fake_server):
    server, _ = fake_server(edits={"span": _edit(positions="tool_span", name="span")})
    status, payload = _post(server.url, {"prompt": "abc", "edit": "span"})
    assert status == 400 and "field 'tool_span'" in payload["error"] and "tool_span positions" in payload["error"]
    status, payload = _post(server.url, {"prompt": "abc", "edit": "span", "tool_span": [1, 3]})
    assert status == 200


def test_requests_waiting_behind_a_pass_share_the_next_one_each_at_its_strength(fake_server):
    gate = threading.Event()
    server, backend = fake_server(FakeBackend(gate=gate))
    results = {}

    def send(key, body):
        results[key] = _post(server.url, body)

    first = threading.Thread(target=send, args=("first", {"prompt": "p0", "max_tokens": 4}))
    first.start()
    backend.entered.wait()                        # the first pass is running (held at the gate)
    rest = [threading.Thread(target=send, args=(k, b)) for k, b in (
        ("plain", {"prompt": "p1", "max_tokens": 4}),
        ("zero", {"prompt": "p2", "max_tokens": 4, "edit": {"name": "t", "strength": 0}}),
        ("four", {"prompt": "p2", "max_tokens": 4, "edit": {"name": "t", "strength": 4}}),
        ("tool", {"prompt": "p3", "max_tokens": 4, "edit": {"name": "t", "direction": "tool", "strength": 2}}))]
    for t in rest:
        t.start()
    with server.shared.cond:
        server.shared.cond.wait_for(lambda: len(server.shared.pending) == 4)
    gate.set()
    for t in [first, *rest]:
        t.join()
    assert all(status == 200 for status, _ in results.values()), results
    # one pass for the first request, ONE for the four queued behind it: the plain row rides at strength 0
    assert server.stats.rounds == [1, 4] and server.stats.passes == 2
    assert sorted(backend.calls[2][1]) == [-2.0, 0.0, 0.0, 4.0]
    assert results["four"][1]["text"] == "p2|4.0" and results["zero"][1]["text"] == "p2|0.0"
    assert results["tool"][1]["text"] == "p3|-2.0" and results["tool"][1]["edit"] == {"name": "t", "strength": -2.0}
    assert results["plain"][1]["edit"] is None and results["first"][1]["token_ids"] == [2, 0]


def test_a_failing_hook_is_a_500_for_its_request_only(fake_server):
    gate = threading.Event()
    server, backend = fake_server(FakeBackend(gate=gate, fail_edited=True))
    results = {}

    def send(key, body):
        results[key] = _post(server.url, body)

    threads = [threading.Thread(target=send, args=("first", {"prompt": "p0"}))]
    threads[0].start()
    backend.entered.wait()
    for k, b in (("plain", {"prompt": "p1"}), ("edited", {"prompt": "p2", "edit": "t"})):
        threads.append(threading.Thread(target=send, args=(k, b)))
        threads[-1].start()
    with server.shared.cond:
        server.shared.cond.wait_for(lambda: len(server.shared.pending) == 2)
    gate.set()
    for t in threads:
        t.join()
    assert results["first"][0] == 200 and results["plain"][0] == 200
    status, payload = results["edited"]
    assert status == 500 and payload["error"] == "edit hook at site 1 ran on 0 of 1 planned rows"


CHAT = "/v1/chat/completions"


def test_the_openai_chat_route_takes_the_edit_from_the_extra_body(fake_server):
    server, backend = fake_server()
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    status, payload = _post(server.url, {"model": "x", "messages": msgs, "max_tokens": 5, "temperature": 0,
                                         "edit": {"name": "t", "strength": 3}}, route=CHAT)
    assert status == 200, payload
    assert payload["object"] == "chat.completion" and payload["choices"][0]["message"] == {
        "role": "assistant", "content": "s\nq|3.0"}
    assert payload["choices"][0]["finish_reason"] == "length" and payload["usage"]["total_tokens"] == 5
    assert payload["memtoc"]["edit"] == {"name": "t", "strength": 3.0}
    assert backend.calls[-1] == ([msgs], [3.0], 5)
    for body, field in (({"messages": msgs, "temperature": 0.7}, "temperature"), ({"messages": msgs, "n": 2}, "n"),
                        ({"messages": msgs, "stream": True}, "stream"), ({"messages": msgs, "tools": []}, "tools"),
                        ({"model": "x"}, "messages")):
        status, payload = _post(server.url, body, route=CHAT)
        assert status == 400 and f"field '{field}'" in payload["error"]["message"], (body, payload)
    with urllib.request.urlopen(server.url + "/v1/models") as r:
        assert json.loads(r.read())["data"][0]["object"] == "model"
    assert len(backend.calls) == 1


def test_a_request_waiting_when_the_server_stops_gets_an_error_not_a_hang():
    server = Server(ServeConfig(port=0), FakeBackend(), {}).start()          # no engine loop: the request waits
    got = []
    t = threading.Thread(target=lambda: got.append(_post(server.url, {"prompt": "a"})))
    t.start()
    with server.shared.cond:
        server.shared.cond.wait_for(lambda: len(server.shared.pending) == 1)
    server.close()
    t.join()
    assert got[0][0] == 500 and "stopped before this request ran" in got[0][1]["error"]


def test_a_request_after_close_is_refused():
    server = Server(ServeConfig(port=0), FakeBackend(), {}).start().start_engine()
    url = server.url
    server.close()
    with pytest.raises(urllib.error.URLError):
        _post(url, {"prompt": "a"})


def test_checks_before_the_model_loads(tmp_path, monkeypatch):
    import memtoc.backends.factory as factory

    def refuse(*a, **k):
        raise AssertionError("the model loader was reached")

    monkeypatch.setattr(factory, "load_backend", refuse)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_direction_edit(a, _edit(576, site=3))
    save_direction_edit(b, _edit(576, site=5))
    with pytest.raises(MemtocError, match="--edits .*has the name 't'"):
        start_server(ServeConfig(port=0, edits=(str(a), str(b))))
    wide = tmp_path / "wide.json"
    save_direction_edit(wide, _edit(12, site=3, name="wide"))
    with pytest.raises(MemtocError, match="12"):           # the vector's width against the model's config
        start_server(ServeConfig(port=0, edits=(str(wide),)))


def test_the_command_refuses_a_bad_option_in_one_line_before_the_model(tmp_path, capsys, monkeypatch):
    import memtoc.backends.factory as factory
    from memtoc.cli import main

    monkeypatch.setattr(factory, "load_backend", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    for argv, needle in ((["serve", "--port", "70000"], "--port"),
                         (["serve", "--edits", str(tmp_path / "none.json")], "--edits"),
                         (["serve", "--max-batch", "0"], "--max-batch")):
        rc = main(argv)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and needle in err and len(err.splitlines()) == 1, (argv, err)


def test_served_tokens_equal_the_backends_own_generate_on_the_tiny_model(tiny_backend, tmp_path):
    """Two concurrent requests (strength 0 and 8 of one edit) over HTTP against ``backend.generate`` with the same
    bound edit, one request per call."""
    import memtoc as mt

    d = tiny_backend.site_info.d_model
    g = torch.Generator().manual_seed(0)
    u = torch.randn(d, generator=g)
    edit = DirectionEdit.build(name="push", layers=[2], vectors={2: u / u.norm()}, scale={2: 30.0}, strength=1.0)
    spec = save_direction_edit(tmp_path / "push.json", edit)
    prompt = "What is the capital of France?"
    cfg = GenerationConfig(max_new_tokens=8, stop_at_final_line=False)
    loaded = mt.load_edit(spec)
    offline = {s: tiny_backend.generate([prompt], cfg, edit=loaded.with_strength(s).bind([prompt], strengths=[s]))[0]
               for s in (0.0, 8.0)}
    untreated = tiny_backend.generate([prompt], cfg)[0]
    assert offline[0.0].token_ids == untreated.token_ids        # strength 0 is the untreated model
    assert offline[8.0].token_ids != untreated.token_ids        # the edit changes the answer (the test can fail)
    with mt.serve(backend=tiny_backend, port=0, edits=str(spec), wait=False) as server:
        got = {}

        def send(s):
            got[s] = _post(server.url, {"prompt": prompt, "max_tokens": 8, "edit": {"name": "push", "strength": s}})

        threads = [threading.Thread(target=send, args=(s,)) for s in (0.0, 8.0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for s in (0.0, 8.0):
        status, payload = got[s]
        assert status == 200, payload
        assert payload["token_ids"] == list(offline[s].token_ids) and payload["text"] == offline[s].text
        assert payload["edit"] == {"name": "push", "strength": s}


def test_the_start_line_names_every_route_and_the_edit_names_a_request_takes(tmp_path):
    """The printed start line is how a user learns the server: the OpenAI route and base URL are on it, and the
    edit names are the specs' names (a README's `--edits dir.json` serves `direction-...`, not `dir`)."""
    from memtoc.jobs.serve import listening_line

    spec = save_direction_edit(tmp_path / "dir.json", _edit(name="direction-tool_wrong-minus-tool_right-sites-1"))
    server = Server(ServeConfig(port=0, edits=(str(spec),)), FakeBackend(),
                    {"direction-tool_wrong-minus-tool_right-sites-1": _edit()}).start()
    try:
        line = listening_line(server.url, server.edits)
    finally:
        server.close()
    assert "\n" not in line and f"listening on {server.url}" in line
    for route in ("POST /v1/generate", "POST /v1/chat/completions", "GET /v1/models", "GET /health"):
        assert route in line
    assert f"OpenAI base_url {server.url}/v1" in line
    assert "edit names: direction-tool_wrong-minus-tool_right-sites-1" in line and "dir)" not in line
