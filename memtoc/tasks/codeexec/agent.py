"""The agent loop of the corrupted code-executor family: model turn, real execution, (corrupted) return, answer.

One *trial* is one problem in one condition under one policy (docs/codeexec.md, "Agent protocol"): at most
``max_tool_rounds`` tool rounds, each call run for real in the sandbox and its stdout passed through
:func:`memtoc.tasks.codeexec.conditions.tool_return`; then the forced final-answer turn, with the tool withdrawn,
when the rounds ran out on a call or the last turn has no ``FINAL ANSWER:`` line. Only the last turn is graded.
``AgentConfig.first_call = "scripted"`` starts the tool conditions with the problem's scripted call.

The tool is offered natively (the chat template renders ``tools=``) or as text (a ```python fenced block, the
return as a user message); :func:`detect_protocol` picks one per tokenizer. The loop is the toolkit's one agent
loop (:func:`memtoc.tasks.loop.run_loop`); :class:`CodeexecPolicy` is this family's part. An unbound edit is
bound per call to each row's first tool return (:func:`first_return_span`). Decoding is greedy unless
``AgentConfig.temperature`` > 0: then each turn is seeded from the trial key and turn index, so a rerun repeats it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, runtime_checkable

from memtoc.backends.base import Generation
from memtoc.core.runtime import row_seed
from memtoc.tasks.codeexec.conditions import ToolReturn, check_condition, corrupted_numbers, tool_return
from memtoc.tasks.codeexec.grader import ANSWER_MARKER_RE, GradedAnswer, grade
from memtoc.tasks.codeexec.prompts import final_answer_turn, scripted_call, system_prompt, tool_schema, user_prompt
from memtoc.tasks.codeexec.sandbox import ExecutionResult, SandboxLimitError, SandboxLimits, run_python
from memtoc.core.config import ConfigError
from memtoc.core.options import opt, option
from memtoc.bench.toolchat import render, template_supports_tools
from memtoc.tasks.loop import (ANSWER, CALL, FINAL, Conversation, Decoding, Exchange, LoopPolicy, TurnRequest,
                               finish, play_call, run_loop, say)
from memtoc.tasks.toolcalls import FoundCall, call_arguments, first_call
from memtoc.core.vocab import CODEEXEC_FIRST_CALLS as FIRST_CALLS
from memtoc.core.vocab import CODEEXEC_PROTOCOLS

if TYPE_CHECKING:  # pragma: no cover
    from memtoc.tasks.codeexec.problems import Problem

__all__ = ["AgentConfig", "ChatFormatter", "TEXT_PROTOCOL_INSTRUCTION", "TEXT_TOOL_RETURN", "ToolCall",
           "detect_protocol", "parse_tool_call", "TrialSpec", "TrialResult", "run_trials",
           "FIRST_CALLS", "first_return_span", "ScriptedConversation", "scripted_conversation"]

#: Appended (after one space) to the system prompt of the tool conditions in the text protocol.
TEXT_PROTOCOL_INSTRUCTION = ("To call python_executor, write the code in a single ```python fenced block and "
                             "stop; the first such block of your reply is run and its output is sent back to "
                             "you in the next message.")
#: The user message that carries a tool return in the text protocol.
TEXT_TOOL_RETURN = "python_executor output:\n```\n{output}```"


@dataclass(frozen=True)
class AgentConfig:
    """Loop and sandbox settings of an agent run (all of them are part of a run's identity).

    The fields the run protocol fills (``max_tool_rounds``, ``max_new_tokens``, ``first_call``, ``temperature``,
    ``sample_seed``, ``max_total_new_tokens``) are None (not given) only in ``CodeexecRunConfig``, which resolves
    them before a trial runs (:func:`memtoc.tasks.codeexec.run.resolve_run_protocol`).
    """

    max_tool_rounds: int | None = field(default=2, metadata=opt("tool calls the agent may make per trial", low=0))
    max_new_tokens: int | None = field(default=384, metadata=option("max_new_tokens"))
    batch_size: int = field(default=8, metadata=option("batch_size"))
    call_format: str = field(default="auto", metadata=opt(
        "tool-call format: native chat-template tools, or ```python blocks (auto: detect)",
        choices=CODEEXEC_PROTOCOLS))
    timeout_s: float = field(default=5.0, metadata=opt("sandbox wall-clock limit per execution", low=0, above=True))
    cpu_s: int = field(default=5, metadata=opt("sandbox CPU-time limit per execution", low=1))
    memory_mb: int = field(default=512, metadata=opt("sandbox address-space limit per execution", low=1))
    max_output_bytes: int = 64_000
    #: a scripted first call counts as one of the ``max_tool_rounds`` (``data/scripted_calls.json``)
    first_call: str | None = field(default="model", metadata=opt(
        "scripted: the first assistant turn of the tool conditions is the problem's scripted python_executor call "
        "(really run), so every trial sees a tool return", choices=FIRST_CALLS))
    #: > 0: each trial's turns are seeded from ``sample_seed``, the trial key (repetition included) and the turn
    #: index, so repetitions differ and a rerun repeats them
    temperature: float | None = field(default=0.0, metadata=option("temperature"))
    sample_seed: int | None = field(default=0, metadata=option("sample_seed"))
    #: None = per-turn budget only (the overreliance paper counts a trial that spends it unanswered as incorrect)
    max_total_new_tokens: int | None = field(default=None, metadata=opt(
        "output budget of a whole trial, all turns together (the overreliance paper: 16k); a trial that spends it "
        "without a final answer ends unanswered", low=1))

    def __post_init__(self) -> None:
        """Every value checked here, before a model loads or a run directory exists (one line per error)."""
        for name, low in (("max_tool_rounds", 0), ("max_new_tokens", 1), ("batch_size", 1), ("temperature", 0)):
            value = getattr(self, name)
            if value is not None and value < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
        try:                                 # the sandbox limits, with their bounds, are the sandbox's to check
            SandboxLimits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb,
                          max_output_bytes=self.max_output_bytes)
        except SandboxLimitError as exc:
            raise ConfigError(str(exc)) from None
        if self.call_format not in CODEEXEC_PROTOCOLS:
            raise ConfigError(f"--call-format must be one of {', '.join(CODEEXEC_PROTOCOLS)}, not "
                              f"{self.call_format!r}")
        if self.first_call is not None and self.first_call not in FIRST_CALLS:
            raise ConfigError(f"--first-call must be one of {', '.join(FIRST_CALLS)}, not {self.first_call!r}")
        if self.first_call == "scripted" and self.max_tool_rounds is not None and self.max_tool_rounds < 1:
            raise ConfigError("a scripted first call needs max_tool_rounds >= 1 (--max-tool-rounds)")
        if self.max_total_new_tokens is not None and self.max_total_new_tokens < 1:
            raise ConfigError(f"--max-total-new-tokens must be >= 1, got {self.max_total_new_tokens}")

    def to_dict(self) -> dict[str, Any]:
        d = {"max_tool_rounds": self.max_tool_rounds, "max_new_tokens": self.max_new_tokens,
             "protocol": self.call_format, "timeout_s": self.timeout_s, "cpu_s": self.cpu_s,
             "memory_mb": self.memory_mb, "max_output_bytes": self.max_output_bytes}
        if self.first_call != "model":       # absent = "model": identities of earlier runs stay valid
            d["first_call"] = self.first_call
        if self.temperature > 0:             # absent = greedy (same reason)
            d["temperature"] = self.temperature
            d["sample_seed"] = self.sample_seed
        if self.max_total_new_tokens is not None:   # absent = no run budget (same reason)
            d["max_total_new_tokens"] = self.max_total_new_tokens
        return d



# ---------------------------------------------------------------------------------------------------------
# rendering


def detect_protocol(tokenizer: Any) -> str:
    """"native" when the tokenizer's chat template renders the tool schema given through ``tools=``, else "text"
    (:func:`memtoc.bench.toolchat.template_supports_tools`, shared with the MemToC agent tasks)."""
    return "native" if template_supports_tools(tokenizer, tool_schema()) else "text"


@runtime_checkable
class Formatter(Protocol):
    protocol: str

    def format_messages(self, messages: Sequence[dict[str, Any]], *, tools: bool) -> str:
        """The exact string the model is conditioned on for ``messages`` (generation prompt added)."""


class ChatFormatter:
    """Renders a message list for an HF tokenizer in the native or text protocol (module docstring)."""

    def __init__(self, tokenizer: Any, *, chat: bool = True, protocol: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.chat = chat and bool(getattr(tokenizer, "chat_template", None))
        detected = detect_protocol(tokenizer) if self.chat else "text"
        if protocol == "native" and detected != "native":
            raise ValueError("the tokenizer's chat template does not support tools=; use the text protocol")
        self.protocol = detected if protocol == "auto" else protocol

    def format_messages(self, messages: Sequence[dict[str, Any]], *, tools: bool) -> str:
        schemas = [tool_schema()] if tools and self.protocol == "native" else None
        return render(self.tokenizer, messages, chat=self.chat, tools=schemas)


# ---------------------------------------------------------------------------------------------------------
# parsing tool calls (the shared parser registry, memtoc.tasks.toolcalls)

#: The parsers a turn is read with, per tool protocol, in order of preference.
CALL_PARSERS_BY_PROTOCOL: dict[str, tuple[str, ...]] = {"native": ("json", "fence"), "text": ("fence",)}
#: ``ToolCall.source`` of each parser (recorded per call).
_SOURCES = {"json": "native", "fence": "fence"}


@dataclass(frozen=True)
class ToolCall:
    """A tool call found in a model turn: the code, how it was written, and the text before/through it."""

    code: str
    #: "native" (a JSON tool call) or "fence" (a ```python block).
    source: str
    #: The assistant message content to keep in the conversation.
    content: str


def _code(call: FoundCall) -> str | None:
    args = call_arguments(call)
    return args["code"] if isinstance(args, dict) and isinstance(args.get("code"), str) else None


def _tool_call(found: FoundCall | None) -> ToolCall | None:
    if found is None:
        return None
    return ToolCall(code=str(_code(found)), source=_SOURCES.get(found.parser, found.parser), content=found.content)


def parse_tool_call(text: str, protocol: str) -> ToolCall | None:
    """The tool call of a model turn (first one only), or None. See the module docstring for the formats:
    native, the first JSON call whose arguments hold ``code``, else the first fenced block; text, the first
    fenced block."""
    return _tool_call(first_call(text, CALL_PARSERS_BY_PROTOCOL[protocol],
                                 accept=lambda c: _code(c) is not None))


def has_final_answer(text: str) -> bool:
    """True when the text has a ``FINAL ANSWER:`` marker (the grader's marker) followed by something."""
    return any(text[m.end():].strip() for m in ANSWER_MARKER_RE.finditer(text))


# ---------------------------------------------------------------------------------------------------------
# the loop


@dataclass(frozen=True)
class TrialSpec:
    """One trial to run."""

    problem: "Problem"
    condition: str
    policy: str = "Plain"
    repetition: int = 0

    @property
    def key(self) -> str:
        return f"{self.problem.id}|{self.condition}|{self.policy}|{self.repetition}"


@dataclass
class TrialResult:
    """A finished trial: every turn, the final text, the graded answer."""

    spec: TrialSpec
    protocol: str
    messages: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    final_text: str
    tool_calls: int
    corrupted_numbers: list[str]
    graded: GradedAnswer
    forced_final: bool
    first_return_message: int | None = None
    #: The first tool call was the scripted one (``tool_calls`` counts the model's own calls only).
    scripted_call: bool = False

    def to_record(self) -> dict[str, Any]:
        s = self.spec
        return {"key": s.key, "problem_id": s.problem.id, "op": s.problem.op, "condition": s.condition,
                "policy": s.policy, "repetition": s.repetition, "protocol": self.protocol,
                "tool_calls": self.tool_calls, "forced_final": self.forced_final, "final_text": self.final_text,
                "corrupted_numbers": self.corrupted_numbers, "graded": self.graded.to_dict(),
                "correct": self.graded.correct, "adopted": self.graded.adopted,
                "first_return_message": self.first_return_message, "scripted_call": self.scripted_call,
                "messages": self.messages, "turns": self.turns}


@dataclass
class _Trial(Conversation):
    """A trial's conversation: the loop's common state plus the code executor's own."""

    tools: bool = False
    returns: list[ToolReturn] = field(default_factory=list)
    #: The first call was scripted (not counted in ``tool_calls`` of the result: those are the model's own).
    scripted: bool = False
    #: Tokens generated so far over all turns (the run budget ``max_total_new_tokens``).
    new_tokens: int = 0


class CodeexecPolicy(LoopPolicy[_Trial]):
    """The code executor on the shared loop (:mod:`memtoc.tasks.loop`): the sandbox runs the call, its
    (corrupted) stdout is the return, the rounds spent force the final-answer turn at once (the tool withdrawn),
    and the grader reads the last turn."""

    after_last_call = FINAL

    def __init__(self, fmt: "Formatter", cfg: AgentConfig, executor: Callable[..., ExecutionResult]) -> None:
        self.fmt, self.cfg, self.executor = fmt, cfg, executor
        self.protocol = fmt.protocol
        self.max_rounds = cfg.max_tool_rounds
        self.final_prompt = final_answer_turn()

    def start(self, spec: TrialSpec) -> _Trial:
        check_condition(spec.condition)
        tools = spec.condition != "no_tool"
        system = system_prompt(spec.condition, spec.policy)
        if tools and self.protocol == "text":
            system = f"{system} {TEXT_PROTOCOL_INSTRUCTION}"
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": user_prompt(spec.problem.question)}]
        return _Trial(spec=spec, messages=messages, phase=CALL if tools else ANSWER, tools=tools)

    def prologue(self, conv: _Trial) -> None:
        if self.cfg.first_call == "scripted" and conv.tools:
            self.scripted_first_call(conv)

    def scripted_first_call(self, conv: _Trial) -> None:
        """Play the problem's scripted tool call as the first assistant turn (``AgentConfig.first_call``)."""
        p = conv.spec.problem
        code, content = scripted_call(p.op, p.a, p.b)
        call = ToolCall(code=code, source="scripted", content=content if self.protocol == "text" else "")
        conv.turns.append({"index": len(conv.turns), "kind": "scripted_call", "tools_offered": True,
                           "n_prompt_messages": len(conv.messages), "generation": None, "tool_call": None})
        conv.scripted = True
        play_call(self, conv, call, None)

    def offered(self, conv: _Trial) -> bool:
        return conv.phase == CALL

    def request(self, conv: _Trial, step: int) -> TurnRequest:
        seed = row_seed(self.cfg.sample_seed, conv.spec.key, len(conv.turns)) if self.cfg.temperature > 0 else None
        return TurnRequest(self.fmt.format_messages(conv.messages, tools=self.offered(conv)), seed=seed)

    def tool_span(self, conv: _Trial, text: str) -> tuple[int, int] | None:
        return first_return_span(self.fmt, conv.messages, conv.first_return, text, tools=self.offered(conv))

    def turn_record(self, conv: _Trial, gen: Generation, request: TurnRequest) -> dict[str, Any]:
        return {"index": len(conv.turns), "kind": "forced_final" if conv.forced else "model",
                "tools_offered": self.offered(conv), "n_prompt_messages": len(conv.messages),
                "generation": {"text": gen.text, "n_prompt_tokens": gen.n_prompt_tokens,
                               "n_new_tokens": gen.n_new_tokens, "stop_reason": gen.stop_reason}, "tool_call": None}

    def own_turn(self, conv: _Trial, gen: Generation) -> bool:
        """The run's output budget: spent without a final answer, the trial ends unanswered (graded incorrect)."""
        conv.new_tokens += int(gen.n_new_tokens)
        budget, text = self.cfg.max_total_new_tokens, gen.text
        if budget is None or conv.new_tokens < budget or conv.forced \
                or (parse_tool_call(text, self.protocol) is None and has_final_answer(text)):
            return False
        say(conv, text)
        conv.turns[-1]["out_of_budget"] = True
        finish(conv, "")
        return True

    def find_call(self, conv: _Trial, text: str) -> ToolCall | None:
        return parse_tool_call(text, self.protocol)

    def execute(self, conv: _Trial, call: ToolCall, text: str | None) -> Exchange:
        cfg = self.cfg
        ex = self.executor(call.code, timeout_s=cfg.timeout_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb,
                           max_output_bytes=cfg.max_output_bytes)
        tr = tool_return(conv.spec.problem, conv.spec.condition, ex)
        conv.returns.append(tr)
        conv.turns[-1]["tool_call"] = {"code": call.code, "source": call.source, "execution": {
            "ok": ex.ok, "stdout": ex.stdout, "stderr": ex.stderr, "exit_code": ex.exit_code,
            "killed_reason": ex.killed_reason, "detail": ex.detail, "violations": list(ex.violations),
            "exception": ex.exception, "duration_s": ex.duration_s}, "tool_return": {
            "text": tr.text, "corrupted": tr.corrupted, "factor": tr.factor, "execution_ok": tr.execution_ok,
            "replacements": [{"original": r.original, "corrupted": r.corrupted} for r in tr.replacements]}}
        name = tool_schema()["name"]
        return Exchange(native=self.protocol == "native", content=call.content, name=name,
                        arguments={"code": call.code}, tool=name, result=tr.text)

    def text_return(self, result: str) -> str:
        return TEXT_TOOL_RETURN.format(output=result if result.endswith("\n") or not result else result + "\n")

    def is_answer(self, text: str) -> bool:
        return has_final_answer(text)

    def unanswered(self, conv: _Trial) -> None:
        conv.turns[-1]["unanswered"] = True

    def record(self, conv: _Trial) -> TrialResult:
        corrupted = [str(v) for v in corrupted_numbers(conv.returns)]
        graded = grade(conv.final_text, conv.spec.problem, conv.spec.condition, [Decimal(c) for c in corrupted])
        return TrialResult(spec=conv.spec, protocol=self.protocol, messages=conv.messages, turns=conv.turns,
                           final_text=conv.final_text, tool_calls=conv.rounds - int(conv.scripted),
                           corrupted_numbers=corrupted, graded=graded, forced_final=conv.forced,
                           first_return_message=conv.first_return, scripted_call=conv.scripted)


def first_return_span(fmt: "Formatter", messages: Sequence[dict[str, Any]], first_return: int | None,
                      text: str, *, tools: bool) -> tuple[int, int] | None:
    """Character span, in ``text`` (= ``fmt.format_messages(messages, tools=tools)``), of the first tool
    return's content; None when there is none yet.

    Found without searching the whole string for the return's text (which may also occur earlier, e.g. in the
    code that printed it): the conversation up to the return is rendered with the same ``tools`` flag, the two
    renderings agree up to the return message's header, and the content is the first match after that point.
    An empty return (or a template that rewrites the content) falls back to the first differing character.
    """
    if first_return is None:
        return None
    before = fmt.format_messages(messages[:first_return], tools=tools)
    split = len(os.path.commonprefix([before, text]))
    content = str(messages[first_return].get("content") or "")
    for needle in (content, content.strip()):
        if needle:
            at = text.find(needle, split)
            if at >= 0:
                return at, at + len(needle)
    return (split, split + 1) if split < len(text) else None


@dataclass(frozen=True)
class ScriptedConversation:
    """A tool-condition trial right after its scripted first call: what the model's next turn sees."""

    messages: list[dict[str, Any]]
    text: str                                   # rendered, generation prompt included
    return_span: tuple[int, int] | None         # the first tool return's content within ``text``
    tool_return: str                            # the (possibly corrupted) return text


def scripted_conversation(spec: TrialSpec, fmt: "Formatter", config: AgentConfig, *,
                          executor: Callable[..., ExecutionResult] = run_python) -> ScriptedConversation:
    """The conversation a ``first_call="scripted"`` trial shows the model after its first tool return (the
    scripted call is executed for real); the same state ``run_trials`` starts from."""
    if spec.condition == "no_tool":
        raise ValueError("no_tool trials have no tool call")
    policy = CodeexecPolicy(fmt, config, executor)
    conv = policy.start(spec)
    policy.scripted_first_call(conv)
    tools = policy.offered(conv)
    text = fmt.format_messages(conv.messages, tools=tools)
    span = first_return_span(fmt, conv.messages, conv.first_return, text, tools=tools)
    return ScriptedConversation(messages=list(conv.messages), text=text, return_span=span,
                                tool_return=conv.returns[0].text)


def formatter_for(backend: Any, protocol: str = "auto") -> Formatter:
    """The backend itself when it renders message lists (``format_messages``), else a :class:`ChatFormatter`
    over its tokenizer."""
    if isinstance(backend, Formatter):
        return backend
    return ChatFormatter(backend.tokenizer, chat=backend.chat, protocol=protocol)


def run_trials(backend: Any, specs: Sequence[TrialSpec], config: AgentConfig | None = None, *,
               formatter: Formatter | None = None, executor: Callable[..., ExecutionResult] = run_python,
               on_done: Callable[[list[TrialResult]], None] | None = None,
               edit: Any = None) -> list[TrialResult]:
    """Run the trials in lockstep on the shared loop (:func:`memtoc.tasks.loop.run_loop`) and return them in
    ``specs`` order; ``on_done`` gets each batch of trials as they finish (crash-safe appends)."""
    cfg = config or AgentConfig()
    policy = CodeexecPolicy(formatter or formatter_for(backend, cfg.call_format), cfg, executor)
    decoding = Decoding(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, temperature=cfg.temperature)
    return run_loop(policy, backend, specs, decoding, edit=edit, on_done=on_done)
