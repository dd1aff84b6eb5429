"""The episode loop of the agent tasks: offer the tool, validate and execute the call, feed back, score.

One *agent episode* is a MemToC episode (a question and its controlled tool return) under one tool-choice
protocol and repetition. Its conversation starts with the system prompt (plus, in the text protocol, the tool
and how to call it) and the question; the tool goes through the chat template's ``tools=`` when the template
supports it (:func:`memtoc.bench.toolchat.template_supports_tools`, the same test as the code executor's).

Phases (each a model turn; all episodes advance in lockstep, :func:`memtoc.bench.toolchat.lockstep`):

- ``decide`` (two-stage only): the reply must name ``CALL`` or ``ANSWER``
(:func:`~memtoc.tasks.agent.calls.parse_decision`);
  ``CALL`` leads to the call turn, ``ANSWER`` is an abstention (T4), anything else a parse failure (T3);
- ``call``: the turn is searched for a call (:func:`~memtoc.tasks.agent.calls.find_call`; in guided and two-stage
  stage two, and whenever decoding is constrained, the turn *must* be the call, so text without one is T2).
  A call that validates (:func:`~memtoc.tasks.agent.calls.check_call`) is *executed*: its return is the episode's
  controlled payload (``tool_output``, e.g. ``{"result": ...}``), fed back as a ``tool`` message (native) or the
  ``text_tool_return`` user message (text). A call that does not validate is not executed; its errors go back
  as ``{"error": ...}``. No call at all is T4: the turn is the answer if it has a FINAL line;
- ``answer``: the reply after the return (tools still rendered, so the prompt prefix does not change; a call
  written here is not executed); without a FINAL line the ``final`` turn asks once more.

The graded text is the last turn; it is scored by :func:`memtoc.scoring.score_response` against the tool value
and the episode's closed-book memory, so *answer agreement* is the scorer's ``followed_tool``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from memtoc.tasks.agent.calls import RawCall, check_call, engine_call, find_call, parse_decision
from memtoc.tasks.agent.protocols import AgentPrompts, load_agent_prompts
from memtoc.backends.base import GUIDED, Generation, GenerationConfig
from memtoc.backends.guided import Sampling, call_schema
from memtoc.core.config import ConfigError
from memtoc.scoring import score_response
from memtoc.bench.toolchat import lockstep, render, template_supports_tools

__all__ = ["AgentItem", "AgentSpec", "LoopSettings", "CALL_PARSER", "call_finder", "detect_tool_protocol",
           "run_agent_episodes", "resolve_decoding"]

#: the toolkit's own call parser (any JSON call object in the turn); any other name is the backend's engine parser
CALL_PARSER = "memtoc"
#: ``find(text, required, schema) -> RawCall | None``: the call of a turn (None: no attempt)
CallFinder = Callable[[str, bool, Mapping[str, Any]], "RawCall | None"]

_FINAL_RE = re.compile(r"final\s*:\s*\S", re.IGNORECASE)


@dataclass(frozen=True)
class AgentItem:
    """One replayed MemToC episode: the question, its controlled return, the model's memory, the tool schema."""

    episode_id: str
    question_id: str
    formulation: str
    question: str
    gold: str
    aliases: tuple[str, ...]
    tool_output: Mapping[str, Any]
    memory_span: str
    mem_absent: bool
    memory_correct: bool | None
    schema: Mapping[str, Any]

    @property
    def tool_value(self) -> str | None:
        return str(self.tool_output["result"]) if "result" in self.tool_output else None


@dataclass(frozen=True)
class AgentSpec:
    item: AgentItem
    protocol: str
    repetition: int = 0

    @property
    def key(self) -> str:
        return f"{self.item.episode_id}|{self.protocol}|{self.repetition}"


@dataclass(frozen=True)
class LoopSettings:
    max_new_tokens: int = 96
    batch_size: int = 8
    decoding: str = "auto"
    temperature: float = 0.0
    sample_seed: int = 0
    tool_protocol: str = "auto"      # auto | native | text
    call_parser: str = CALL_PARSER   # memtoc | the name of a serving engine's tool-call parser (vllm: hermes, ...)


def call_finder(backend: Any, parser: str = CALL_PARSER) -> CallFinder:
    """How call turns are parsed: the toolkit's own parser, or the backend's engine parser ``parser`` (vLLM's
    ``--tool-call-parser``, as a served model's calls are read), classified the same way."""
    if parser == CALL_PARSER:
        return lambda text, required, schema: find_call(text, required=required)
    make = getattr(backend, "tool_call_parser", None)
    if make is None:
        raise ConfigError(f"--tool-call-parser {parser}: the {getattr(backend, 'name', 'given')} backend has no "
                          f"engine tool-call parser (vllm has); use {CALL_PARSER}")
    parse = make(parser)
    return lambda text, required, schema: engine_call(parse(text, schema), text, required=required)


def resolve_decoding(decoding: str, protocol: str) -> str:
    """"constrained" or "free" for a protocol's call turns ("auto": constrained only for guided)."""
    if decoding == "auto":
        return "constrained" if protocol == "guided" else "free"
    return decoding


def detect_tool_protocol(tokenizer: Any, chat: bool, schema: Mapping[str, Any], requested: str = "auto") -> str:
    detected = "native" if chat and template_supports_tools(tokenizer, schema) else "text"
    if requested == "native" and detected != "native":
        raise ConfigError("the chat template does not support tools=; use the text protocol")
    return detected if requested == "auto" else requested


@dataclass
class _State:
    spec: AgentSpec
    messages: list[dict[str, Any]]
    phase: str
    decoding: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    stage_one: dict[str, Any] | None = None
    mechanism: str | None = None
    executed: bool = False
    final_text: str = ""
    required: bool = False
    pending: dict[str, Any] = field(default_factory=dict)   # the request of the turn being generated


def _start(spec: AgentSpec, prompts: AgentPrompts, tool_protocol: str, decoding: str) -> _State:
    item, schema = spec.item, spec.item.schema
    system = prompts.system if tool_protocol == "native" else prompts.text_protocol_system(schema)
    user = prompts.user.format(question=item.question)
    phase = "call"
    if spec.protocol == "guided":
        user = f"{user}\n\n{prompts.guided.format(name=schema['name'])}"
    elif spec.protocol == "two-stage":
        user = f"{user}\n\n{prompts.decide.format(name=schema['name'])}"
        phase = "decide"
    d = resolve_decoding(decoding, spec.protocol)
    return _State(spec=spec, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                  phase=phase, decoding=d, required=spec.protocol == "guided" or d == "constrained")


def _mark(state: _State, mechanism: str) -> None:
    if state.mechanism is None:
        state.mechanism = mechanism


def _ask_final(state: _State, prompts: AgentPrompts) -> None:
    state.messages.append({"role": "user", "content": prompts.final})
    state.phase = "final"


def _feed_back(state: _State, raw: Any, payload: str, tool_protocol: str, prompts: AgentPrompts,
               text: str) -> None:
    """The call and its return as messages (native: tool_calls + tool message; text: the turn + a user turn)."""
    name = state.spec.item.schema["name"]
    if tool_protocol == "native" and raw.parsed and isinstance(raw.arguments, dict):
        call_id = f"call{len(state.calls)}"
        state.messages.append({"role": "assistant", "content": raw.prefix, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": raw.name, "arguments": raw.arguments}}]})
        state.messages.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": payload})
    else:
        state.messages.append({"role": "assistant", "content": text})
        state.messages.append({"role": "user", "content": prompts.text_tool_return.format(payload=payload)})


def _advance(state: _State, gen: Generation, request: Mapping[str, Any], tool_protocol: str,
             prompts: AgentPrompts, find: CallFinder) -> None:
    text = gen.text
    state.turns.append({"phase": state.phase, "text": text, "n_prompt_tokens": gen.n_prompt_tokens,
                        "n_new_tokens": gen.n_new_tokens, "stop_reason": gen.stop_reason,
                        "constrained": request["schema"] is not None, "seed": request.get("seed")})
    item = state.spec.item
    if state.phase == "decide":
        decision = parse_decision(text)
        state.stage_one = {"raw": text, "decision": decision}
        state.messages.append({"role": "assistant", "content": text})
        if decision == "call":
            state.messages.append({"role": "user", "content": prompts.call_now.format(name=item.schema["name"])})
            state.phase, state.required = "call", True
            return
        _mark(state, "T3" if decision is None else "T4")
        _ask_final(state, prompts)
        return
    if state.phase == "call":
        raw = find(text, state.required, item.schema)
        if raw is None:
            _mark(state, "T4")
            state.messages.append({"role": "assistant", "content": text})
            if _FINAL_RE.search(text):
                state.final_text, state.phase = text, "done"
            else:
                _ask_final(state, prompts)
            return
        check = check_call(raw, item.schema)
        state.calls.append({"raw": raw.raw, "parsed": raw.parsed, "name": raw.name, "arguments": raw.arguments,
                            **check.to_dict()})
        if check.valid:
            state.executed = True
            payload = json.dumps(dict(item.tool_output), ensure_ascii=False)
        else:
            _mark(state, check.mechanism or "schema")
            errors = "; ".join(e["message"] for e in check.errors)
            payload = json.dumps({"error": prompts.call_rejected.format(errors=errors)}, ensure_ascii=False)
        _feed_back(state, raw, payload, tool_protocol, prompts, text)
        state.phase = "answer"
        return
    state.messages.append({"role": "assistant", "content": text})
    if state.phase == "answer" and not _FINAL_RE.search(text):
        _ask_final(state, prompts)
        return
    state.final_text, state.phase = text, "done"


def _record(state: _State, tool_protocol: str) -> dict[str, Any]:
    spec, item = state.spec, state.spec.item
    score = score_response(state.final_text, gold=item.gold, tool_value=item.tool_value,
                           memory_span=item.memory_span if not item.mem_absent else "", aliases=item.aliases,
                           tool_conditioned=True)
    return {"key": spec.key, "episode_id": item.episode_id, "question_id": item.question_id,
            "formulation": item.formulation, "protocol": spec.protocol, "repetition": spec.repetition,
            "tool_protocol": tool_protocol, "decoding": state.decoding, "tool_name": item.schema["name"],
            "tool_value": item.tool_value, "memory_span": item.memory_span, "memory_correct": item.memory_correct,
            "stage_one": state.stage_one, "calls": state.calls, "executed": state.executed,
            "mechanism": None if state.executed else (state.mechanism or "T4"),
            "final_text": state.final_text, "agreement": score.followed_tool, "score": score.to_dict(),
            "turns": state.turns, "messages": state.messages}


def run_agent_episodes(backend: Any, specs: Sequence[AgentSpec], settings: LoopSettings, *,
                       prompts: AgentPrompts | None = None,
                       on_done: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run the agent episodes in lockstep; returns one record per spec (module docstring), in order."""
    if not specs:
        return []
    prompts = prompts or load_agent_prompts()
    tool_protocol = detect_tool_protocol(backend.tokenizer, backend.chat, specs[0].item.schema,
                                         settings.tool_protocol)
    find = call_finder(backend, settings.call_parser)
    states = [_start(s, prompts, tool_protocol, settings.decoding) for s in specs]
    needs_guided = settings.temperature > 0 or any(s.decoding == "constrained" for s in states)
    if needs_guided and GUIDED not in getattr(backend, "capabilities", ()):
        raise ConfigError(f"constrained or sampled decoding needs a backend with {GUIDED!r} decoding (hf, vllm)")
    rounds = [0]

    def request(i: int) -> dict[str, Any]:
        st = states[i]
        tools = [st.spec.item.schema] if tool_protocol == "native" else None
        text = render(backend.tokenizer, st.messages, chat=backend.chat, tools=tools)
        constrained = st.phase == "call" and st.decoding == "constrained"
        st.pending = {"text": text, "schema": call_schema(st.spec.item.schema) if constrained else None,
                      "stop": st.phase in ("answer", "final"),
                      "seed": settings.sample_seed * 1_000_003 + st.spec.repetition * 7919 + rounds[0]}
        return st.pending

    def generate(chunk: list[int], reqs: list[dict[str, Any]]) -> list[Generation]:
        rounds[0] += 1
        out: list[Generation | None] = [None] * len(reqs)
        groups: dict[tuple[bool, bool, int], list[int]] = {}
        for j, r in enumerate(reqs):
            guided = r["schema"] is not None or settings.temperature > 0
            groups.setdefault((guided, r["stop"], r["seed"] if settings.temperature > 0 else 0), []).append(j)
        for (guided, stop, seed), js in groups.items():
            cfg = GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_at_final_line=stop)
            texts = [reqs[j]["text"] for j in js]
            if guided:
                gens = backend.generate_guided(texts, cfg, schemas=[reqs[j]["schema"] for j in js],
                                               sampling=Sampling(settings.temperature, seed))
            else:
                gens = backend.generate_formatted(texts, cfg)
            for j, g in zip(js, gens):
                out[j] = g
        return [g for g in out if g is not None]

    records: dict[int, dict[str, Any]] = {}

    def finish(done: list[int]) -> None:
        batch = [records.setdefault(i, _record(states[i], tool_protocol)) for i in done]
        if on_done is not None:
            on_done(batch)

    lockstep(len(states), done=lambda i: states[i].phase == "done", request=request, generate=generate,
             advance=lambda i, g: _advance(states[i], g, states[i].pending, tool_protocol, prompts, find),
             batch_size=settings.batch_size, finish=finish)
    return [records[i] for i in range(len(states))]
