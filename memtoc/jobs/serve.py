"""The serve job (``memtoc serve``, ``mt.serve``): steered and edited generation over HTTP, through the backend seam.

Another harness (an agent framework, inspect, a notebook) evaluates a steered model by sending JSON to
``POST /v1/generate``: a prompt (or chat messages), a token budget, and optionally the name of one of the server's
edit specs (``--edits``) and its strength (or side, ``direction``). The answer is the backend's own
:class:`~memtoc.backends.base.Generation`, the tokens ``backend.generate`` gives offline. The same requests in
OpenAI's shape: ``POST /v1/chat/completions`` (greedy only; ``edit`` in the client's ``extra_body``) and
``GET /v1/models``, so an OpenAI-compatible harness evaluates the steered model unchanged.

One engine, many callers: the HTTP threads only parse and check requests; every model call runs in ONE thread
(:meth:`Server.run`) through :class:`memtoc.backends.shared_pass.SharedPass`: a pass takes every waiting request,
and requests with the same budget whose edits differ in strength only are one ``generate`` call with a strength
per row. A pass that fails is re-run one request at a time, so a failing request never takes another down.

Errors: a refused request body is HTTP 400 with one line naming the field (:class:`RequestError`); a failing model
call is HTTP 500 with the error's one line, never untreated tokens and never a traceback. Every check that needs no
weights (edit specs, their fit to the model, the backend's capabilities, the port) runs before the model loads.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, ClassVar, Iterable, Mapping

from memtoc.backends.endpoint import edit_spec_sha256
from memtoc.core.config import ModelSpec
from memtoc.core.errors import MemtocError
from memtoc.core.options import opt, option
from memtoc.core.runtime import GenerationConfig
from memtoc.jobs import is_finite

__all__ = ["ServeConfig", "ServeResult", "Server", "RequestError", "parse_request", "parse_chat_request",
           "start_server", "run_serve", "MAX_BODY_BYTES", "MAX_TOKENS"]

#: the largest request body read (bytes); a longer one is refused with 413
MAX_BODY_BYTES = 8 * 1024 * 1024
#: the largest ``max_tokens`` a request may ask for (the ``--max-new-tokens`` bound)
MAX_TOKENS = 1_048_576
#: the fields of a ``/v1/generate`` body
REQUEST_FIELDS = ("prompt", "messages", "max_tokens", "stop_at_final_line", "edit", "tool_span")
EDIT_FIELDS = ("name", "strength", "direction")


@dataclass
class ServeConfig:
    """``memtoc serve``: the model (any backend kind), where to listen, the edits requests may name."""
    PATH_ROLES: ClassVar[dict[str, str]] = {"edits": "input"}

    model_spec: ModelSpec = field(default_factory=ModelSpec)
    host: str = field(default="127.0.0.1", metadata=opt(
        "address to listen on (127.0.0.1: this machine only; the server has no authentication)"))
    port: int = field(default=8000, metadata=opt("TCP port (0: a free port, printed with the URL)", low=0,
                                                 high=65535))
    edits: tuple[str, ...] = field(default=(), metadata=opt(
        "an edit spec requests may name by its 'name' (memtoc direction / mine-features output); repeat for several",
        repeat=True, metavar="SPEC"))
    max_new_tokens: int = field(default=128, metadata=option(
        "max_new_tokens", help="generation budget of a request that gives no max_tokens"))
    max_batch: int = field(default=64, metadata=opt("requests per engine pass at most (the rest wait for the next)",
                                                    low=1, high=100_000))


class RequestError(MemtocError):
    """A request body the server refuses (HTTP 400); the message names the field."""


@dataclass(frozen=True)
class ServeRequest:
    """One checked request: the conversation, its decoding settings and its bound edit (None: untreated)."""

    prompt: Any
    config: GenerationConfig
    edit: Any = None                  # a steering.edits.BoundEdit of [prompt], or None
    edit_name: str | None = None
    strength: float | None = None


def _conversation(body: Mapping[str, Any]) -> Any:
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise RequestError("give exactly one of 'prompt' (a user message) and 'messages' (a chat conversation)")
    if has_prompt:
        if not isinstance(body["prompt"], str) or not body["prompt"]:
            raise RequestError("field 'prompt': must be a non-empty string")
        return body["prompt"]
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("field 'messages': must be a non-empty list of {\"role\", \"content\"} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"field 'messages[{i}]': must be an object with string 'role' and 'content'")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def _edit_ask(raw: Any) -> tuple[str, float | None, str | None]:
    """(name, strength, direction) of the request's ``edit`` field."""
    if isinstance(raw, str):
        return raw, None, None
    if not isinstance(raw, dict):
        raise RequestError("field 'edit': must be an edit's name or {\"name\", \"strength\", \"direction\"}")
    unknown = sorted(set(raw) - set(EDIT_FIELDS))
    if unknown:
        raise RequestError(f"field 'edit.{unknown[0]}': unknown; an edit takes {', '.join(EDIT_FIELDS)}")
    name = raw.get("name")
    if not isinstance(name, str):
        raise RequestError("field 'edit.name': must be the name of an edit the server was started with")
    strength = raw.get("strength")
    if strength is not None and not is_finite(strength):
        raise RequestError(f"field 'edit.strength': must be a finite number, got {strength!r}")
    direction = raw.get("direction")
    if direction is not None and direction not in ("memory", "tool"):
        raise RequestError(f"field 'edit.direction': must be memory or tool, got {direction!r}")
    if direction is not None and strength is not None and float(strength) < 0:
        raise RequestError("field 'edit.strength': with a direction it is a magnitude (>= 0)")
    return name, None if strength is None else float(strength), direction


def parse_request(body: Any, *, edits: Mapping[str, Any], default_max_tokens: int,
                  format_prompt: Callable[[Any], str] | None = None) -> ServeRequest:
    """The checked request of a ``/v1/generate`` body (parsed JSON), or a :class:`RequestError` naming the field.

    ``edits``: name -> ``steering.edits.Edit`` (the server's ``--edits``); ``format_prompt``: the backend's, used to
    check that a ``tool_span`` maps onto the templated prompt before the request reaches the engine."""
    if not isinstance(body, dict):
        raise RequestError("body: must be a JSON object")
    unknown = sorted(set(body) - set(REQUEST_FIELDS))
    if unknown:
        raise RequestError(f"field '{unknown[0]}': unknown; the fields are {', '.join(REQUEST_FIELDS)}")
    prompt = _conversation(body)
    max_tokens = body.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise RequestError(f"field 'max_tokens': must be an integer from 1 to {MAX_TOKENS}, got {max_tokens!r}")
    stop = body.get("stop_at_final_line", False)
    if not isinstance(stop, bool):
        raise RequestError(f"field 'stop_at_final_line': must be true or false, got {stop!r}")
    config = GenerationConfig(max_new_tokens=max_tokens, stop_at_final_line=stop)
    span = body.get("tool_span")
    if span is not None:
        if not isinstance(prompt, str):
            raise RequestError("field 'tool_span': takes a 'prompt' (a span of its characters), not 'messages'")
        if (not isinstance(span, list) or len(span) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                    for x in span)
                or not 0 <= span[0] < span[1] <= len(prompt)):
            raise RequestError(f"field 'tool_span': must be [start, end] character offsets of the tool output in "
                               f"'prompt' (0 <= start < end <= {len(prompt)}), got {span!r}")
        span = (int(span[0]), int(span[1]))
    if body.get("edit") is None:
        if span is not None:
            raise RequestError("field 'tool_span': only an edit reads it; give 'edit' too")
        return ServeRequest(prompt, config)
    name, strength, direction = _edit_ask(body["edit"])
    if name not in edits:
        have = ", ".join(sorted(edits)) or "none (start the server with --edits SPEC)"
        raise RequestError(f"field 'edit.name': no edit {name!r} on this server; the edits are: {have}")
    edit = edits[name]
    try:
        if direction is not None:
            edit = edit.steer(direction, strength if strength is not None else abs(edit.strength))
        elif strength is not None:
            edit = edit.with_strength(strength)
    except MemtocError as exc:
        raise RequestError(f"field 'edit.direction': {exc}") from None
    if edit.positions != "last_input" and span is None:
        raise RequestError(f"field 'tool_span': edit {name!r} edits the {edit.positions} positions; give tool_span "
                           "[start, end], the tool output's characters in 'prompt'")
    if span is not None and format_prompt is not None:
        from activations.positions import PositionSpecError, user_span_in_text

        try:
            user_span_in_text(format_prompt(prompt), prompt, span)
        except PositionSpecError as exc:
            raise RequestError(f"field 'tool_span': {exc}") from None
    bound = edit.bind([prompt], None if span is None else [span], strengths=[edit.strength])
    return ServeRequest(prompt, config, bound, name, edit.strength)


#: OpenAI chat-completion fields the server reads (``edit`` comes in a client's ``extra_body``) or accepts at the
#: value greedy decoding has; any other field is refused by name
CHAT_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "edit", "tool_span", "stop_at_final_line",
               "temperature", "top_p", "n", "stream", "seed", "user")


def parse_chat_request(body: Any, *, edits: Mapping[str, Any], default_max_tokens: int,
                       format_prompt: Callable[[Any], str] | None = None) -> ServeRequest:
    """The checked request of an OpenAI-style ``/v1/chat/completions`` body: ``messages``, ``max_tokens`` (or
    ``max_completion_tokens``) and the toolkit's ``edit``, ``tool_span`` and ``stop_at_final_line`` (a client's
    ``extra_body``, as ``memtoc evaluate --backend openai`` sends them); greedy only."""
    if not isinstance(body, dict):
        raise RequestError("body: must be a JSON object")
    unknown = sorted(set(body) - set(CHAT_FIELDS))
    if unknown:
        raise RequestError(f"field '{unknown[0]}': not supported here; the fields are {', '.join(CHAT_FIELDS)}")
    for name, allowed, want in (("temperature", 0, "0 (the server decodes greedily)"), ("top_p", 1, "1"),
                                ("n", 1, "1"), ("stream", False, "false (no streaming)")):
        value = body.get(name)
        if value is None:
            continue
        ok = value is False if isinstance(allowed, bool) else is_finite(value) and float(value) == allowed
        if not ok:
            raise RequestError(f"field '{name}': must be {want}, got {value!r}")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RequestError("field 'max_completion_tokens': give it or 'max_tokens', not both")
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    generic = {"messages": body.get("messages"), "max_tokens": budget, "edit": body.get("edit"),
               "stop_at_final_line": body.get("stop_at_final_line", False)}
    if generic["messages"] is None:
        raise RequestError("field 'messages': required")
    if body.get("tool_span") is not None:      # a span of the one user message's characters, as /v1/generate's
        msgs = generic["messages"]
        if not (isinstance(msgs, list) and len(msgs) == 1 and isinstance(msgs[0], dict)
                and msgs[0].get("role") == "user"):
            raise RequestError("field 'tool_span': takes one user message (a span of its characters)")
        generic = {**generic, "messages": None, "prompt": msgs[0].get("content"), "tool_span": body["tool_span"]}
    return parse_request(generic, edits=edits, default_max_tokens=default_max_tokens, format_prompt=format_prompt)


def _chat_response(gen: Any, req: ServeRequest, model: str) -> dict[str, Any]:
    """An OpenAI chat completion (plus the toolkit's ``memtoc`` record: token ids, stop reason, edit)."""
    import time
    import uuid

    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                         "finish_reason": "length" if gen.stop_reason == "max_tokens" else "stop"}],
            "usage": {"prompt_tokens": gen.n_prompt_tokens, "completion_tokens": gen.n_new_tokens,
                      "total_tokens": gen.n_prompt_tokens + gen.n_new_tokens},
            "memtoc": _response(gen, req)}


def _response(gen: Any, req: ServeRequest) -> dict[str, Any]:
    return {"text": gen.text, "token_ids": [int(t) for t in gen.token_ids], "n_prompt_tokens": gen.n_prompt_tokens,
            "n_new_tokens": gen.n_new_tokens, "stop_reason": gen.stop_reason,
            "edit": None if req.edit is None else {"name": req.edit_name, "strength": req.strength}}


class _Handler(BaseHTTPRequestHandler):
    """``GET /health``, ``POST /v1/generate``; every answer is JSON, every error one line in ``{"error"}``."""

    server_version = "memtoc-serve"
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_one_request(self) -> None:
        """http.server's request loop, with an error no route expected answered as a one-line 500 (never a dropped
        connection and a traceback)."""
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - the caller gets one line; the server keeps serving
            self.close_connection = True
            try:
                self._send(500, {"error": f"{type(exc).__name__}: {_one_line(str(exc))}"})
            except OSError:
                pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        app: Server = self.server.app  # type: ignore[attr-defined]
        route = self.path.split("?")[0]
        if route == "/health":
            self._send(200, app.health())
        elif route == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": app.model_name, "object": "model",
                                                         "owned_by": "memtoc"}]})
        else:
            self._send(404, {"error": f"no route GET {self.path}; try GET /health or POST /v1/generate"})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        app: Server = self.server.app  # type: ignore[attr-defined]
        route = self.path.split("?")[0]
        if route not in ("/v1/generate", "/v1/chat/completions"):
            self._send(404, {"error": f"no route POST {self.path}; try POST /v1/generate or /v1/chat/completions"})
            return
        try:
            n = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send(411, {"error": "body: a Content-Length header is needed"})
            return
        if not 0 <= n <= MAX_BODY_BYTES:
            self.close_connection = True
            self._send(413, {"error": f"body: {n} bytes; at most {MAX_BODY_BYTES}"})
            return
        raw = self.rfile.read(n)
        status, payload = app.answer(raw, chat=route == "/v1/chat/completions")
        if status != 200 and route == "/v1/chat/completions":     # the error shape OpenAI clients read
            payload = {"error": {"message": payload["error"], "type": "invalid_request_error" if status == 400 else
                                 "server_error", "code": status}}
        self._send(status, payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        app: Server = self.server.app  # type: ignore[attr-defined]
        if app.access_log:
            app.log(f"{self.address_string()} {format % args}")


class Server:
    """A started server: the HTTP threads answer at :attr:`url`; :meth:`run` (or :meth:`start_engine`) runs the
    model calls. ``close()`` stops both (a context manager does it at exit)."""

    def __init__(self, cfg: ServeConfig, backend: Any, edits: Mapping[str, Any], *,
                 log: Callable[[str], None] | None = None, access_log: bool = False) -> None:
        from memtoc.backends.shared_pass import SharedPass

        self.cfg, self.backend, self.edits = cfg, backend, dict(edits)
        self.log = log or (lambda s: print(s, file=sys.stderr))
        self.access_log = access_log
        self.shared = SharedPass(backend, 0)
        self._stop = threading.Event()
        try:
            self.httpd = ThreadingHTTPServer((cfg.host, cfg.port), _Handler)
        except OSError as exc:
            raise MemtocError(f"--host {cfg.host} --port {cfg.port}: cannot listen there ({exc.strerror or exc})") \
                from None
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        # a 0.1 s poll: close() waits for the loop to notice (the default 0.5 s made every close take about that)
        self._http = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                      name="memtoc-serve-http", daemon=True)
        self._engine: threading.Thread | None = None
        self._closed = False

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
        return f"http://{host}:{self.port}"

    @property
    def stats(self) -> Any:
        """What the engine did (:class:`memtoc.backends.shared_pass.PassStats`): passes, rows, requests per pass."""
        return self.shared.stats

    def start(self) -> "Server":
        """Start answering HTTP (requests wait until :meth:`run` or :meth:`start_engine` runs the model)."""
        self._http.start()
        return self

    def run(self) -> None:
        """Run the model calls in this thread until :meth:`close` (from another thread or a signal)."""
        self.shared.serve_queue(self._stop, max_calls=self.cfg.max_batch, isolate=True)

    def start_engine(self) -> "Server":
        """Run the model calls in a thread of their own (a notebook; the command line runs them in its main thread)."""
        self._engine = threading.Thread(target=self.run, name="memtoc-serve-engine", daemon=True)
        self._engine.start()
        return self

    def close(self) -> None:
        """Stop the engine loop (waiting requests get an error) and the HTTP server; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.shared.stop(self._stop)
        if self._http.is_alive():
            self.httpd.shutdown()
        self.httpd.server_close()
        if self._engine is not None and self._engine is not threading.current_thread():
            self._engine.join()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the request path (HTTP threads) ---------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "stopping" if self._stop.is_set() else "ok", "backend": self.backend.name,
                "capabilities": sorted(self.backend.capabilities),
                "edits": {name: {"kind": e.kind, "layers": list(e.layers), "positions": e.positions,
                                 "strength": e.strength, "toward": e.toward, "spec_sha256": edit_spec_sha256(e.spec)}
                          for name, e in self.edits.items()}}

    @property
    def model_name(self) -> str:
        return str(self.cfg.model_spec.model)

    def answer(self, raw: bytes, *, chat: bool = False) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON payload) of one ``/v1/generate`` body (``chat``: a ``/v1/chat/completions`` body)."""
        from memtoc.backends.shared_pass import SharedCall

        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            return 400, {"error": f"body: not JSON ({str(exc).splitlines()[0]})"}
        try:
            req = (parse_chat_request if chat else parse_request)(
                body, edits=self.edits, default_max_tokens=self.cfg.max_new_tokens,
                format_prompt=self.backend.format_prompt)
        except RequestError as exc:
            return 400, {"error": str(exc)}
        try:
            gens = self.shared.submit(SharedCall([req.prompt], req.config, req.edit))
        except KeyboardInterrupt:
            return 503, {"error": "the server was interrupted while this request ran"}
        except MemtocError as exc:
            return 500, {"error": _one_line(str(exc))}
        except Exception as exc:  # noqa: BLE001 - a failing model call: one line to the caller, not a traceback
            self.log(f"memtoc serve: a request failed: {type(exc).__name__}: {_one_line(str(exc))}")
            return 500, {"error": f"{type(exc).__name__}: {_one_line(str(exc))}"}
        if chat:
            return 200, _chat_response(gens[0], req, self.model_name)
        return 200, _response(gens[0], req)


def _one_line(s: str) -> str:
    return " ".join(s.split())


@dataclass
class ServeResult:
    """A server that has stopped: where it listened and what its engine did."""

    url: str
    stats: Any


def load_edits(paths: Any) -> dict[str, Any]:
    """name -> edit of every ``--edits`` spec (read and validated, no model); two specs of one name are refused."""
    from steering import load_edit

    out: dict[str, Any] = {}
    where: dict[str, str] = {}
    for p in paths or ():
        edit = load_edit(p)
        if edit.name in out:
            raise MemtocError(f"--edits {p}: another spec ({where[edit.name]}) has the name {edit.name!r}; requests "
                              "name edits by it, so give each its own")
        out[edit.name], where[edit.name] = edit, str(p)
    return out


def start_server(cfg: ServeConfig, *, backend: Any = None, log: Callable[[str], None] | None = None) -> Server:
    """Check everything that needs no weights, load the model (unless ``backend`` is given), and start answering
    HTTP at ``cfg.host:cfg.port``; the model calls run once :meth:`Server.run` or :meth:`Server.start_engine` runs."""
    from memtoc.core.backend_kinds import EDITS, backend_kind

    edits = load_edits(cfg.edits)
    if backend is None:
        if edits and EDITS not in backend_kind(cfg.model_spec.backend).capabilities:
            raise MemtocError(f"--edits: the {cfg.model_spec.backend} backend applies no edits; use --backend hf "
                              "or vllm")
        from memtoc.tasks.validate import check_edit_for_model

        for e in edits.values():
            check_edit_for_model(e, cfg.model_spec.model)   # sites and width against the model's config, no weights
        from memtoc.backends.factory import load_backend

        backend = load_backend(cfg.model_spec, hooks=bool(edits))     # unedited: generation only, compiled
    if edits and EDITS not in backend.capabilities:
        raise MemtocError(f"--edits: this {backend.name} backend applies no edits now "
                          f"({getattr(backend, 'hook_refusal', None) or 'its capabilities lack edits'})")
    return Server(cfg, backend, edits, log=log).start()


def listening_line(url: str, edits: Iterable[str]) -> str:
    """The line a started server prints: its URL, every route (the OpenAI client's base URL is ``URL/v1``) and
    the names a request's ``edit`` takes (the specs' ``name`` fields, not their file names)."""
    return (f"memtoc serve: listening on {url} (POST /v1/generate, POST /v1/chat/completions, GET /v1/models, "
            f"GET /health; OpenAI base_url {url}/v1; edit names: {', '.join(edits) or 'none'})")


def run_serve(cfg: ServeConfig, *, backend: Any = None, log: Callable[[str], None] | None = None) -> ServeResult:
    """Serve until interrupted (Ctrl-C, SIGTERM): the URL is printed on stdout once the server listens, and the
    model calls run in this thread (the one that loaded the engine)."""
    import signal

    server = start_server(cfg, backend=backend, log=log)
    print(listening_line(server.url, server.edits), flush=True)
    previous = None
    if threading.current_thread() is threading.main_thread():
        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return ServeResult(server.url, server.stats)
