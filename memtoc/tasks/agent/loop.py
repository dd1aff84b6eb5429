"""The episode loop of the agent tasks: offer the tool, validate and execute the call, feed back, score.

One *agent episode* is a MemToC episode (a question and its controlled tool return) under one tool-choice
protocol and repetition (docs/agent.md). All episodes advance in lockstep on the toolkit's one agent loop
(:func:`memtoc.tasks.loop.run_loop`); :class:`AgentPolicy` is this family's part: the two-stage ``decide`` turn is
its own phase (``CALL`` leads to the call turn, ``ANSWER`` is T4, anything else T3), ``call``/``answer``/``final``
are the loop's. A call that validates (:func:`~memtoc.tasks.agent.calls.check_call`) is *executed*: its return is
the episode's controlled payload; one that does not is answered with its errors. Where decoding is constrained
(guided, two-stage stage two) the call turn *must* be the call, so text without one is T2.

The graded text is the last turn, scored by :func:`memtoc.scoring.score_response` against the tool value and the
episode's closed-book memory, so *answer agreement* is the scorer's ``followed_tool``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from memtoc.tasks.agent.calls import RawCall, check_call, engine_call, find_call, parse_decision
from memtoc.tasks.agent.protocols import AgentPrompts, load_agent_prompts
from memtoc.backends.base import Generation
from memtoc.core.backend_kinds import GUIDED
from memtoc.backends.guided import call_schema
from memtoc.core.config import ConfigError
from memtoc.scoring import score_response
from memtoc.bench.toolchat import render, template_supports_tools
from memtoc.tasks.loop import (ANSWER, CALL, FINAL, Conversation, Decoding, Exchange, LoopPolicy, TurnRequest,
                               ask_final, run_loop, say)

__all__ = ["AgentItem", "AgentSpec", "LoopSettings", "CALL_PARSER", "call_finder", "detect_tool_protocol",
           "run_agent_episodes", "resolve_decoding"]

#: the toolkit's own call parser (any JSON call object in the turn); any other name is the backend's engine parser
CALL_PARSER = "memtoc"
#: ``find(text, required, schema) -> RawCall | None``: the call of a turn (None: no attempt)
CallFinder = Callable[[str, bool, Mapping[str, Any]], "RawCall | None"]

_FINAL_RE = re.compile(r"final\s*:\s*\S", re.IGNORECASE)
#: the two-stage protocol's first turn (CALL or ANSWER), a phase of this family's own
DECIDE = "decide"


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
    condition: str = ""                 # the episode's tool condition (tool_right, tool_wrong, ...)

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
class _Episode(Conversation):
    """An episode's conversation: the loop's common state plus the agent tasks' own."""

    decoding: str = "free"
    calls: list[dict[str, Any]] = field(default_factory=list)
    stage_one: dict[str, Any] | None = None
    mechanism: str | None = None
    executed: bool = False
    required: bool = False


def _start(spec: AgentSpec, prompts: AgentPrompts, tool_protocol: str, decoding: str) -> _Episode:
    item, schema = spec.item, spec.item.schema
    system = prompts.system if tool_protocol == "native" else prompts.text_protocol_system(schema)
    user = prompts.user.format(question=item.question)
    phase = CALL
    if spec.protocol == "guided":
        user = f"{user}\n\n{prompts.guided.format(name=schema['name'])}"
    elif spec.protocol == "two-stage":
        user = f"{user}\n\n{prompts.decide.format(name=schema['name'])}"
        phase = DECIDE
    d = resolve_decoding(decoding, spec.protocol)
    return _Episode(spec=spec, messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                    phase=phase, decoding=d, required=spec.protocol == "guided" or d == "constrained")


def _mark(state: _Episode, mechanism: str) -> None:
    if state.mechanism is None:
        state.mechanism = mechanism


class AgentPolicy(LoopPolicy[_Episode]):
    """The agent tasks on the shared loop (:mod:`memtoc.tasks.loop`): one call turn, the call validated and
    answered with the episode's controlled payload (or the rejection), then the answer turn; the two-stage
    decision is this family's own phase."""

    max_rounds = 1
    after_last_call = ANSWER

    def __init__(self, backend: Any, settings: LoopSettings, prompts: AgentPrompts, tool_protocol: str,
                 find: CallFinder) -> None:
        self.backend, self.settings, self.prompts = backend, settings, prompts
        self.tool_protocol, self.find = tool_protocol, find
        self.final_prompt = prompts.final

    def start(self, spec: AgentSpec) -> _Episode:
        return _start(spec, self.prompts, self.tool_protocol, self.settings.decoding)

    def request(self, conv: _Episode, step: int) -> TurnRequest:
        schema = conv.spec.item.schema
        tools = [schema] if self.tool_protocol == "native" else None
        text = render(self.backend.tokenizer, conv.messages, chat=self.backend.chat, tools=tools)
        constrained = conv.phase == CALL and conv.decoding == "constrained"
        # a turn's seed: the sample seed, the repetition and the lockstep step (the row's prompt text joins it
        # in generate_guided), the same whatever the batch size
        return TurnRequest(text, schema=call_schema(schema) if constrained else None,
                           stop_at_final_line=conv.phase in (ANSWER, FINAL),
                           seed=self.settings.sample_seed * 1_000_003 + conv.spec.repetition * 7919 + step)

    def turn_record(self, conv: _Episode, gen: Generation, request: TurnRequest) -> dict[str, Any]:
        return {"phase": conv.phase, "text": gen.text, "n_prompt_tokens": gen.n_prompt_tokens,
                "n_new_tokens": gen.n_new_tokens, "stop_reason": gen.stop_reason,
                "constrained": request.schema is not None, "seed": request.seed}

    def own_turn(self, conv: _Episode, gen: Generation) -> bool:
        """The two-stage decision: ``CALL`` leads to the call turn, ``ANSWER`` is T4, anything else T3."""
        if conv.phase != DECIDE:
            return False
        text = gen.text
        decision = parse_decision(text)
        conv.stage_one = {"raw": text, "decision": decision}
        say(conv, text)
        if decision == "call":
            conv.messages.append({"role": "user",
                                  "content": self.prompts.call_now.format(name=conv.spec.item.schema["name"])})
            conv.phase, conv.required = CALL, True
            return True
        _mark(conv, "T3" if decision is None else "T4")
        ask_final(self, conv)
        return True

    def find_call(self, conv: _Episode, text: str) -> RawCall | None:
        return self.find(text, conv.required, conv.spec.item.schema)

    def no_call(self, conv: _Episode) -> None:
        _mark(conv, "T4")

    def execute(self, conv: _Episode, call: RawCall, text: str | None) -> Exchange:
        """Validate the call; a valid one returns the episode's payload, any other the rejection."""
        item = conv.spec.item
        check = check_call(call, item.schema)
        conv.calls.append({"raw": call.raw, "parsed": call.parsed, "name": call.name, "arguments": call.arguments,
                           **check.to_dict()})
        if check.valid:
            conv.executed = True
            payload = json.dumps(dict(item.tool_output), ensure_ascii=False)
        else:
            _mark(conv, check.mechanism or "schema")
            errors = "; ".join(e["message"] for e in check.errors)
            payload = json.dumps({"error": self.prompts.call_rejected.format(errors=errors)}, ensure_ascii=False)
        native = self.tool_protocol == "native" and call.parsed and isinstance(call.arguments, dict)
        return Exchange(native=native, content=call.prefix if native else str(text), name=call.name,
                        arguments=call.arguments, tool=item.schema["name"], result=payload)

    def text_return(self, result: str) -> str:
        return self.prompts.text_tool_return.format(payload=result)

    def is_answer(self, text: str) -> bool:
        return bool(_FINAL_RE.search(text))

    def record(self, conv: _Episode) -> dict[str, Any]:
        spec, item = conv.spec, conv.spec.item
        score = score_response(conv.final_text, gold=item.gold, tool_value=item.tool_value,
                               memory_span=item.memory_span if not item.mem_absent else "", aliases=item.aliases,
                               tool_conditioned=True)
        return {"key": spec.key, "episode_id": item.episode_id, "question_id": item.question_id,
                "formulation": item.formulation, "condition": item.condition, "protocol": spec.protocol,
                "repetition": spec.repetition,
                "tool_protocol": self.tool_protocol, "decoding": conv.decoding, "tool_name": item.schema["name"],
                "tool_value": item.tool_value, "memory_span": item.memory_span,
                "memory_correct": item.memory_correct, "stage_one": conv.stage_one, "calls": conv.calls,
                "executed": conv.executed, "mechanism": None if conv.executed else (conv.mechanism or "T4"),
                "final_text": conv.final_text, "agreement": score.followed_tool, "score": score.to_dict(),
                "turns": conv.turns, "messages": conv.messages}


def run_agent_episodes(backend: Any, specs: Sequence[AgentSpec], settings: LoopSettings, *,
                       prompts: AgentPrompts | None = None,
                       on_done: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Run the agent episodes in lockstep on the shared loop (:func:`memtoc.tasks.loop.run_loop`); returns one
    record per spec (module docstring), in order."""
    if not specs:
        return []
    prompts = prompts or load_agent_prompts()
    tool_protocol = detect_tool_protocol(backend.tokenizer, backend.chat, specs[0].item.schema,
                                         settings.tool_protocol)
    policy = AgentPolicy(backend, settings, prompts, tool_protocol, call_finder(backend, settings.call_parser))
    needs_guided = settings.temperature > 0 or any(resolve_decoding(settings.decoding, s.protocol) == "constrained"
                                                   for s in specs)
    if needs_guided and GUIDED not in getattr(backend, "capabilities", ()):
        raise ConfigError(f"constrained or sampled decoding needs a backend with {GUIDED!r} decoding (hf, vllm)")
    decoding = Decoding(max_new_tokens=settings.max_new_tokens, batch_size=settings.batch_size,
                        temperature=settings.temperature, sampler="guided")
    return run_loop(policy, backend, specs, decoding, on_done=on_done)
