"""The endpoint backend (``--backend openai``): generation through the official ``openai`` client against any
OpenAI-compatible server (vLLM's ``vllm serve``, llama.cpp, a hosted API, or this toolkit's ``memtoc serve``).

The evaluation, its resume, the scorer and the metrics stay the toolkit's, so a model served elsewhere is scored
exactly as a model loaded here; only how an answer is obtained differs:

- Greedy chat completions to the run's budget. A generic server cannot be told the FINAL-line stop, so the text
  is cut by :func:`~memtoc.backends.base.cut_at_final_line` and the kept tokens are counted from the per-token
  pieces (``logprobs``) as ``trim_ids_to_text`` counts them on hf and vllm (else ``usage.completion_tokens``).
- ``memtoc serve`` (``owned_by: memtoc``) stops at the FINAL line itself and answers the toolkit's own
  generation record; an edit is sent by name in ``extra_body`` and checked first against the spec hash its
  ``/health`` names.
- The client retries connection errors, timeouts, 429 and 5xx; what is left is one line naming the endpoint.
  Answers are appended to the job's durable log as they arrive, so a killed run never asks again.
- ``generate`` only: hooked jobs, preformatted prompts and ``--chat-template off`` are refused in one line.

The key is read from ``MEMTOC_OPENAI_API_KEY`` or ``OPENAI_API_KEY``; a local server needs none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import threading
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Mapping, Sequence

from memtoc.backends.base import ANSWERS_FILE, Generation, cut_at_final_line
from memtoc.backends.chat import Conversation, as_messages, format_conversation
from memtoc.core.backend_kinds import GENERATE
from memtoc.core.durable import JsonlLog
from memtoc.core.errors import MemtocError
from memtoc.core.fileio import sha256_json
from memtoc.core.runtime import GenerationConfig

__all__ = ["OpenAIBackend", "EndpointError", "KEY_ENVS", "ANSWERS_FILE", "load", "kept_token_count",
           "edit_spec_sha256"]

#: where the key is read from, first set wins (a local server needs none)
KEY_ENVS = ("MEMTOC_OPENAI_API_KEY", "OPENAI_API_KEY")


#: edit positions that select tokens of the tool output only (a row without one is left untreated)
TOOL_POSITIONS = ("tool_span", "from_tool_return")


class EndpointError(MemtocError):
    """An endpoint that refused, failed or could not be reached; the message is one line naming the endpoint."""


def _one_line(s: Any) -> str:
    return " ".join(str(s).split())


def edit_spec_sha256(spec: Mapping[str, Any]) -> str:
    """The hash of an edit spec without its strength (a request sets the strength): what ``memtoc serve``'s
    ``/health`` shows for each edit and what a client compares its own spec with."""
    rest = dict(spec)
    rest.pop("strength", None)
    return sha256_json(rest)


def kept_token_count(pieces: Sequence[bytes], text: str) -> int:
    """The shortest prefix of the answer's token pieces whose decoding covers ``text`` (what ``trim_ids_to_text``
    counts with a tokenizer): the tokens that produced the kept answer."""
    if not text:
        return 0
    acc = b""
    for k, piece in enumerate(pieces, 1):
        acc += piece
        if len(acc.decode("utf-8", errors="replace")) >= len(text):
            return k
    return len(pieces)


def _pieces(choice: Mapping[str, Any]) -> list[bytes] | None:
    content = ((choice.get("logprobs") or {}).get("content"))
    if not isinstance(content, list):
        return None
    out = []
    for item in content:
        raw = item.get("bytes")
        out.append(bytes(raw) if isinstance(raw, list) else str(item.get("token") or "").encode("utf-8"))
    return out


def to_generation(data: Mapping[str, Any], config: GenerationConfig, endpoint: str) -> Generation:
    """One chat completion (as a dict) as a :class:`Generation`: memtoc serve's own record where it sent one, else
    the message cut after its FINAL line, with the kept tokens counted from the per-token pieces."""
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        raise EndpointError(f"{endpoint}: the server answered no choice (an empty 'choices' list)")
    choice = choices[0]
    text = (choice.get("message") or {}).get("content")
    if not isinstance(text, str):
        raise EndpointError(f"{endpoint}: the server answered a choice without message content "
                            f"(finish_reason {choice.get('finish_reason')!r})")
    own = data.get("memtoc")
    if isinstance(own, Mapping) and own.get("text") == text:
        return Generation(text=text, n_prompt_tokens=int(own["n_prompt_tokens"]), n_new_tokens=int(own["n_new_tokens"]),
                          stop_reason=str(own["stop_reason"]), token_ids=tuple(int(t) for t in own["token_ids"]))
    usage = data.get("usage") or {}
    stop = "max_tokens" if choice.get("finish_reason") == "length" else "eos"
    full = text
    if config.stop_at_final_line:
        text, cut = cut_at_final_line(text)
        if cut:
            stop = "final_line"
    pieces = _pieces(choice)
    if pieces is not None:
        n_new = kept_token_count(pieces, text) if text != full or stop == "eos" else len(pieces)
    else:
        n_new = int(usage.get("completion_tokens") or 0)
    return Generation(text=text, n_prompt_tokens=int(usage.get("prompt_tokens") or 0), n_new_tokens=n_new,
                      stop_reason=stop)


class OpenAIBackend:
    """Chat completions from an OpenAI-compatible server, as :class:`~memtoc.backends.base.TextBackend`."""

    name = "openai"
    capabilities = frozenset({GENERATE})
    chat = True          # the server applies its own chat template to the messages
    tokenizer = None     # the server's; token counts come from its answers

    def __init__(self, client: Any, base_url: str, model: str, *, models: list[dict[str, Any]],
                 concurrency: int = 8, key_env: str | None = None, timeout: float = 600.0,
                 max_retries: int = 4) -> None:
        self.client, self.base_url, self.model = client, base_url.rstrip("/"), model
        self.models, self.concurrency, self.key_env = models, int(concurrency), key_env
        self.timeout, self.max_retries = float(timeout), int(max_retries)
        entry = next((m for m in models if m.get("id") == model), {})
        #: "memtoc" for memtoc serve (it stops at the FINAL line and takes edits by name), else "openai-compatible"
        self.server = "memtoc" if entry.get("owned_by") == "memtoc" else "openai-compatible"
        self._log: JsonlLog | None = None
        self._lock = threading.Lock()
        self._served_edits: dict[str, Any] | None = None

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def connect(cls, base_url: str | None, model: str, *, concurrency: int = 8, timeout: float = 600.0,
                max_retries: int = 4) -> "OpenAIBackend":
        """A client of ``base_url`` checked against the server's ``/v1/models`` (which names ``model``)."""
        if not base_url:
            raise MemtocError("--backend openai needs --base-url, the server's OpenAI base URL (e.g. "
                              "http://127.0.0.1:8000/v1)")
        if concurrency < 1:
            raise MemtocError(f"--concurrency must be at least 1, got {concurrency}")
        if not timeout > 0:
            raise MemtocError(f"--request-timeout must be above 0 seconds, got {timeout}")
        if max_retries < 0:
            raise MemtocError(f"--request-retries must be at least 0, got {max_retries}")
        try:
            import openai
        except ImportError:
            raise MemtocError("--backend openai needs the openai client: pip install 'memtoc[openai]'") from None
        key_env = next((k for k in KEY_ENVS if os.environ.get(k)), None)
        client = openai.OpenAI(base_url=base_url, api_key=os.environ[key_env] if key_env else "none",
                               timeout=timeout, max_retries=max_retries)
        backend = cls(client, base_url, model, models=[], concurrency=concurrency, key_env=key_env, timeout=timeout,
                      max_retries=max_retries)
        listing = backend._call(lambda: client.models.list())
        models = [m.to_dict() if hasattr(m, "to_dict") else dict(m) for m in listing.data]
        if model not in [m.get("id") for m in models]:
            have = ", ".join(str(m.get("id")) for m in models) or "none"
            raise EndpointError(f"{backend.base_url}: serves no model {model!r} (its /v1/models: {have}); --model "
                                "names the served model")
        return cls(client, base_url, model, models=models, concurrency=concurrency, key_env=key_env,
                   timeout=timeout, max_retries=max_retries)

    # -- the answer log ------------------------------------------------------------------------------------
    def keep_answers(self, path: str | Path) -> None:
        """Append every answer to the durable log at ``path`` as it arrives, and answer a request found there from
        it (a resumed run asks nothing it already has)."""
        self._log = JsonlLog(Path(path), "key")

    # -- prompts -------------------------------------------------------------------------------------------
    def format_prompt(self, conversation: Conversation) -> str:
        """What is sent, rendered as text (the server applies its own chat template; this is not that string)."""
        return format_conversation(None, conversation, chat=False)

    def preformatted(self) -> "OpenAIBackend":
        raise MemtocError("--backend openai sends chat messages; a prompt the caller rendered through a chat template "
                          "(the agent and code-executor loops) needs --backend hf or vllm")

    def generate_formatted(self, texts: Sequence[str], config: GenerationConfig, *,
                           edit: Any = None) -> list[Generation]:
        self.preformatted()
        return []

    # -- generation ----------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Conversation], config: GenerationConfig, *,
                 edit: Any = None) -> list[Generation]:
        """Greedy answers, ``--concurrency`` requests at a time, each logged as it arrives. On a failure the
        requests in flight finish (and are logged), the rest are dropped, and the first error is raised."""
        if not prompts:
            return []
        if config.sampling:
            raise MemtocError("--backend openai decodes greedily (temperature 0); sampled decoding runs on hf")
        extras = self._edit_extras(edit, len(prompts))
        messages = [as_messages(p) for p in prompts]
        keys = [sha256_json({"model": self.model, "messages": m, "max_tokens": config.max_new_tokens,
                             "stop_at_final_line": config.stop_at_final_line, "extra": dict(x)})
                for m, x in zip(messages, extras)]
        answers: dict[str, Generation] = {}
        todo: dict[str, int] = {}              # one request per distinct request (a repeated prompt is asked once)
        for i, k in enumerate(keys):
            rec = self._log.get(k) if self._log is not None else None
            if rec is not None:
                g = rec["generation"]
                answers[k] = Generation(**{**g, "token_ids": tuple(g.get("token_ids") or ())})
            else:
                todo.setdefault(k, i)
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(todo)),
                                    thread_name_prefix="memtoc-openai") as pool:
                futures: dict[Future, str] = {pool.submit(self._ask, messages[i], config, extras[i], k): k
                                              for k, i in todo.items()}
                done, pending = wait(futures, return_when=FIRST_EXCEPTION)
                failed = [f for f in done if f.exception() is not None]
                if failed:
                    for f in pending:
                        f.cancel()
                    wait(pending)
                    raise failed[0].exception()  # type: ignore[misc]
                for f, k in futures.items():
                    answers[k] = f.result()
        return [answers[k] for k in keys]

    def _ask(self, messages: list[dict[str, Any]], config: GenerationConfig, extra: Mapping[str, Any],
             key: str) -> Generation:
        body: dict[str, Any] = dict(extra)
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": config.max_new_tokens,
                                  "temperature": 0}
        if self.server == "memtoc":
            body["stop_at_final_line"] = config.stop_at_final_line
        else:
            kwargs["logprobs"] = True        # the per-token pieces count the tokens kept after the cut
        resp = self._call(lambda: self.client.chat.completions.create(**kwargs, extra_body=body or None))
        data = resp.to_dict() if hasattr(resp, "to_dict") else dict(resp)
        gen = to_generation(data, config, self.base_url)
        if self._log is not None:
            rec = {"key": key, "generation": {**dataclasses.asdict(gen), "token_ids": list(gen.token_ids)}}
            with self._lock:
                self._log.append([rec])
        return gen

    def _call(self, fn: Any) -> Any:
        """``fn()`` with the client's errors (after its retries) as one line naming the endpoint."""
        import openai

        url = self.base_url
        try:
            return fn()
        except openai.APITimeoutError:
            raise EndpointError(f"{url}: no answer within --request-timeout {self.timeout:g} s (tried "
                                f"{self.max_retries + 1} times)") from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise EndpointError(f"{url}: cannot connect ({_one_line(cause) or type(cause).__name__}; tried "
                                f"{self.max_retries + 1} times)") from None
        except openai.AuthenticationError as exc:
            raise EndpointError(f"{url}: 401 unauthorized ({_one_line(_message(exc))}); the key is read from "
                                f"{' or '.join(KEY_ENVS)}"
                                + (f" (set: {self.key_env})" if self.key_env else " (neither is set)")) from None
        except openai.NotFoundError as exc:
            raise EndpointError(f"{url}: 404 not found for model {self.model!r} ({_one_line(_message(exc))})") \
                from None
        except openai.APIStatusError as exc:
            raise EndpointError(f"{url}: HTTP {exc.status_code} ({_one_line(_message(exc))})") from None
        except openai.APIError as exc:                         # an answer the client could not read
            raise EndpointError(f"{url}: {type(exc).__name__}: {_one_line(exc)}") from None

    # -- edits, applied by memtoc serve ---------------------------------------------------------------------
    def _edit_extras(self, edit: Any, n: int) -> list[dict[str, Any]]:
        """The ``extra_body`` of each row: the edit by name and strength (and the tool span it needs), checked
        against the edits the server was started with before any request."""
        if edit is None:
            return [{} for _ in range(n)]
        self.check_edit(edit.edit)
        spec = edit.edit.spec
        name = spec.get("name")
        spans = edit.tool_spans or [None] * n
        out = []
        positions = spec.get("positions")
        for s, span in zip(edit.row_strengths(), spans):
            x: dict[str, Any] = {"edit": {"name": name, "strength": s}}
            if positions in TOOL_POSITIONS and span is None:
                x = {}               # a row without a tool output: the edit selects none of its tokens (as on hf)
            elif positions != "last_input" and span is not None:
                x["tool_span"] = [int(span[0]), int(span[1])]
            out.append(x)
        return out

    def check_edit(self, edit: Any) -> None:
        """Refuse, before any request, an edit this server cannot apply: it must be memtoc serve started with the
        same spec (strength aside)."""
        spec = edit.spec
        name = spec.get("name")
        if self.server != "memtoc":
            raise MemtocError(f"--edit: {self.base_url} is not a memtoc serve endpoint; --backend openai passes an "
                              "edit by name to `memtoc serve --edits SPEC`, which applies it (an endpoint's own model "
                              "takes no edits; use --backend hf or vllm)")
        if self._served_edits is None:
            root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
            try:
                with urllib.request.urlopen(f"{root}/health", timeout=self.timeout) as r:
                    self._served_edits = dict(json.loads(r.read().decode("utf-8")).get("edits") or {})
            except (OSError, ValueError) as exc:
                raise EndpointError(f"{root}/health: cannot read the server's edits ({_one_line(exc)})") from None
        served = self._served_edits
        if name not in served:
            have = ", ".join(sorted(served)) or "none"
            raise MemtocError(f"--edit: {self.base_url} has no edit {name!r} (its edits: {have}); start it with "
                              f"memtoc serve --edits {edit.source or 'SPEC'}")
        want = edit_spec_sha256(spec)
        if served[name].get("spec_sha256") != want:
            raise MemtocError(f"--edit: {self.base_url}'s edit {name!r} is another spec than "
                              f"{edit.source or 'this one'} (spec sha256 {served[name].get('spec_sha256')} "
                              f"there, {want} here, strength aside)")

    # -- provenance ----------------------------------------------------------------------------------------
    def provenance(self) -> dict[str, Any]:
        import openai

        return {"backend": self.name, "model": self.model, "endpoint": self.base_url, "server": self.server,
                "served_models": self.models, "api_key_env": self.key_env, "weights": None, "dtype": None,
                "device": "endpoint", "chat_template": None, "chat_template_sha256": None,
                "versions": {"openai": openai.__version__, "python": platform.python_version()}}


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return str(getattr(exc, "message", exc))


def load(spec: Any, *, hooks: bool = True) -> OpenAIBackend:
    """The ``openai`` kind's loader: a job that installs capture or edit hooks is refused before any request."""
    if hooks:
        raise MemtocError("--backend openai generates only: this job captures activations or applies edits in the "
                          "model, which runs on --backend hf or vllm (an evaluation's --edit reaches a "
                          "`memtoc serve --edits` endpoint by name)")
    if spec.chat_template is False:      # it sends chat messages: the server's template always applies
        raise MemtocError("--chat-template off (raw completion of the prompt text) is not offered by the openai "
                          "backend, which sends chat messages that the server renders through its own template; "
                          "use --backend hf or vllm for raw completion")
    return OpenAIBackend.connect(spec.base_url, spec.model, concurrency=spec.concurrency,
                                 timeout=spec.request_timeout, max_retries=spec.request_retries)
