"""The one agent loop of the toolkit: conversations advanced in lockstep, calls executed and fed back.

Both tool families run on it: the code executor (:mod:`memtoc.tasks.codeexec.agent`, a real sandbox) and the
MemToC agent tasks (:mod:`memtoc.tasks.agent.loop`, the episode's controlled payload). The loop owns what they
share; a family supplies a :class:`LoopPolicy` (how to render a conversation, what a call is and how to run it,
what counts as an answer, what record to write).

**The conversation** (:class:`Conversation`) carries its messages, turn records, the calls executed (``rounds``),
whether the final-answer turn was asked (``forced``) and a *phase* (:func:`advance`):

- ``call``: the tool is offered and the turn searched for a call; a call, while ``rounds < max_rounds``, is
  executed and fed back (:func:`play_call`); once the rounds are spent the phase is ``after_last_call``: ``final``
  (ask for the final answer at once: the code executor) or ``answer`` (one more turn: the agent tasks). A turn
  without a call is the answer when :meth:`LoopPolicy.is_answer` says so, else the final-answer turn is asked;
- ``answer``: the turn is the answer, or the final-answer turn is asked; ``final``: the turn is the answer;
- ``done``; and any phase of a family's own, handled by :meth:`LoopPolicy.own_turn` (the agent tasks' two-stage
  decision), which also sees every turn first (the code executor's run-wide token budget).

**Batching** (:func:`run_loop`): every conversation waiting for a model turn goes into one backend call per
chunk of ``batch_size`` and request kind; records are handed to ``on_done`` as conversations finish (crash-safe
appends) and returned in spec order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from memtoc.backends.base import Generation, InspectableBackend
from memtoc.core.runtime import GenerationConfig
from memtoc.backends.guided import Sampling

__all__ = ["CALL", "ANSWER", "FINAL", "DONE", "SAMPLERS", "Conversation", "TurnRequest", "Exchange", "Decoding",
           "LoopPolicy", "play_call", "ask_final", "finish", "say", "run_loop"]

CALL, ANSWER, FINAL, DONE = "call", "answer", "final", "done"
#: How sampled turns are decoded: ``rows`` (``generate_formatted``, each row seeded by its request's seed) or
#: ``guided`` (every sampled turn through ``generate_guided``, grouped by seed).
SAMPLERS = ("rows", "guided")


@dataclass
class Conversation:
    """The common part of one conversation's state (a family subclasses it for its own fields)."""

    spec: Any
    messages: list[dict[str, Any]]
    phase: str = CALL
    turns: list[dict[str, Any]] = field(default_factory=list)
    #: tool calls executed and fed back so far (a rejected call that was answered counts)
    rounds: int = 0
    #: the final-answer turn was asked (the next model turn is the last)
    forced: bool = False
    final_text: str = ""
    #: index in ``messages`` of the message carrying the first tool return (None before any return)
    first_return: int | None = None

    @property
    def done(self) -> bool:
        return self.phase == DONE


@dataclass(frozen=True)
class TurnRequest:
    """What one conversation needs generated."""

    text: str                                   # the rendered conversation (generation prompt added)
    schema: Mapping[str, Any] | None = None     # the JSON schema the turn is constrained to (guided decoding)
    stop_at_final_line: bool = False
    seed: int | None = None                     # this row's sampling seed


@dataclass(frozen=True)
class Exchange:
    """A call as it goes back into the conversation."""

    native: bool            # stored as ``tool_calls`` plus a ``tool`` message; else as text plus a user message
    content: str            # the assistant message's content
    name: str | None        # the function name in ``tool_calls``
    arguments: Any          # the arguments in ``tool_calls``
    tool: str               # the ``tool`` message's name
    result: str             # the tool's return


@dataclass(frozen=True)
class Decoding:
    """How the loop calls the backend: the per-turn budget, the chunk size, the temperature and sampler."""

    max_new_tokens: int
    batch_size: int
    temperature: float = 0.0
    sampler: str = "rows"

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, not {self.sampler!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


C = TypeVar("C", bound=Conversation)


class LoopPolicy(Generic[C]):
    """What a family supplies to the loop (module docstring). Methods with a body are optional."""

    #: tool calls executed per conversation
    max_rounds: int = 1
    #: the phase once the rounds are spent: FINAL (ask for the final answer now) or ANSWER (one more turn)
    after_last_call: str = ANSWER
    #: the user message that asks for the final answer
    final_prompt: str = ""

    def start(self, spec: Any) -> C:
        """The conversation of ``spec`` before its first model turn."""
        raise NotImplementedError

    def prologue(self, conv: C) -> None:
        """Run once per conversation after every conversation started (e.g. a scripted first call)."""

    def request(self, conv: C, step: int) -> TurnRequest:
        """The next turn's request; ``step``: the lockstep step (every waiting conversation takes one turn per
        step, whatever the batch size), so a seed drawn from it does not depend on how rows were chunked."""
        raise NotImplementedError

    def turn_record(self, conv: C, gen: Generation, request: TurnRequest) -> dict[str, Any]:
        """The record of a model turn (appended to ``conv.turns`` before the turn is applied)."""
        raise NotImplementedError

    def own_turn(self, conv: C, gen: Generation) -> bool:
        """Apply a turn the policy handles itself (its own phases, its own stops); True when it did."""
        return False

    def find_call(self, conv: C, text: str) -> Any | None:
        """The call of a ``call`` turn, or None (no call)."""
        raise NotImplementedError

    def execute(self, conv: C, call: Any, text: str | None) -> Exchange:
        """Run the call (record it as the family records calls) and say how it goes back."""
        raise NotImplementedError

    def text_return(self, result: str) -> str:
        """The user message carrying a tool return in the text protocol."""
        raise NotImplementedError

    def is_answer(self, text: str) -> bool:
        """True when a turn without a call is a final answer."""
        raise NotImplementedError

    def no_call(self, conv: C) -> None:
        """A ``call`` turn had no call."""

    def unanswered(self, conv: C) -> None:
        """The final-answer turn is asked because the last turn gave no answer."""

    def tool_span(self, conv: C, text: str) -> tuple[int, int] | None:
        """Where, in the rendered ``text``, an edit's tool span is (edit binding); None: nowhere."""
        return None

    def record(self, conv: C) -> Any:
        """The record of a finished conversation."""
        raise NotImplementedError


def say(conv: Conversation, text: str) -> None:
    """Append the model's turn as an assistant message."""
    conv.messages.append({"role": "assistant", "content": text})


def finish(conv: Conversation, text: str) -> None:
    """``text`` is the conversation's final answer."""
    conv.final_text, conv.phase = text, DONE


def ask_final(policy: LoopPolicy, conv: Conversation) -> None:
    """Append the final-answer turn: the next model turn is the last."""
    conv.messages.append({"role": "user", "content": policy.final_prompt})
    conv.phase, conv.forced = FINAL, True


def play_call(policy: LoopPolicy, conv: Conversation, call: Any, text: str | None) -> None:
    """Execute ``call`` and feed it back; once the rounds are spent, move to ``policy.after_last_call``."""
    ex = policy.execute(conv, call, text)
    conv.rounds += 1
    if ex.native:
        call_id = f"call{conv.rounds}"
        conv.messages.append({"role": "assistant", "content": ex.content, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": ex.name, "arguments": ex.arguments}}]})
        conv.messages.append({"role": "tool", "name": ex.tool, "tool_call_id": call_id, "content": ex.result})
    else:
        conv.messages.append({"role": "assistant", "content": ex.content})
        conv.messages.append({"role": "user", "content": policy.text_return(ex.result)})
    if conv.first_return is None:
        conv.first_return = len(conv.messages) - 1
    if conv.rounds >= policy.max_rounds:
        if policy.after_last_call == FINAL:
            ask_final(policy, conv)
        else:
            conv.phase = policy.after_last_call


def advance(policy: LoopPolicy, conv: Conversation, gen: Generation, request: TurnRequest) -> None:
    """Apply one model turn to a conversation (module docstring)."""
    conv.turns.append(policy.turn_record(conv, gen, request))
    if policy.own_turn(conv, gen):
        return
    text = gen.text
    if conv.phase == FINAL:
        say(conv, text)
        finish(conv, text)
        return
    call = None
    if conv.phase == CALL:
        call = policy.find_call(conv, text)
        if call is None:
            policy.no_call(conv)
        elif conv.rounds < policy.max_rounds:
            play_call(policy, conv, call, text)
            return
    say(conv, text)
    if call is None and policy.is_answer(text):
        finish(conv, text)
        return
    policy.unanswered(conv)
    ask_final(policy, conv)


def _generate(backend: Any, decoding: Decoding, requests: Sequence[TurnRequest],
              spans: Callable[[list[int]], list[Any]], edit: Any) -> list[Generation]:
    """One chunk: rows grouped by request kind, one backend call per group, generations in row order."""
    sampling = decoding.temperature > 0
    out: list[Generation | None] = [None] * len(requests)
    groups: dict[tuple[bool, bool, int], list[int]] = {}
    for j, r in enumerate(requests):
        guided = r.schema is not None or (sampling and decoding.sampler == "guided")
        seed = (r.seed or 0) if guided and sampling else 0
        groups.setdefault((guided, r.stop_at_final_line, seed), []).append(j)
    for (guided, stop, seed), js in groups.items():
        texts = [requests[j].text for j in js]
        if guided:
            if edit is not None:
                raise ValueError("edits are not applied under guided decoding")
            cfg = GenerationConfig(max_new_tokens=decoding.max_new_tokens, stop_at_final_line=stop)
            gens = backend.generate_guided(texts, cfg, schemas=[requests[j].schema for j in js],
                                           sampling=Sampling(decoding.temperature, seed))
        else:
            cfg = GenerationConfig(max_new_tokens=decoding.max_new_tokens, stop_at_final_line=stop,
                                   temperature=decoding.temperature)
            if cfg.sampling:     # one seed per row: a row's sample does not depend on its batch
                cfg = replace(cfg, row_seeds=tuple(int(requests[j].seed or 0) for j in js))
            call_edit = None if edit is None else edit.bind(texts, spans(js))
            gens = backend.generate_formatted(texts, cfg, edit=call_edit)
        if len(gens) != len(js):
            raise RuntimeError(f"backend returned {len(gens)} generations for {len(js)} prompts")
        for j, g in zip(js, gens):
            out[j] = g
    return [g for g in out if g is not None]


def run_loop(policy: LoopPolicy, backend: Any, specs: Sequence[Any], decoding: Decoding, *, edit: Any = None,
             on_done: Callable[[list[Any]], None] | None = None) -> list[Any]:
    """Run one conversation per spec in lockstep (module docstring); one record per spec, in order.

    ``edit``: an unbound edit (``bind(texts, spans)``), bound per backend call to the rows' tool spans
    (:meth:`LoopPolicy.tool_span`) on the backend's ``preformatted()`` view; hf backends only.
    """
    convs = [policy.start(s) for s in specs]
    for conv in convs:
        policy.prologue(conv)
    target = backend
    if edit is not None:
        if not isinstance(backend, InspectableBackend):
            raise ValueError(f"edits need the hf backend; {getattr(backend, 'name', type(backend).__name__)!r} "
                             "has no hooks into the decoder blocks")
        target = backend.preformatted()      # the texts are already rendered conversations
    records: dict[int, Any] = {}
    step = 0
    while True:
        active = [i for i, c in enumerate(convs) if not c.done]
        if not active:
            break
        for lo in range(0, len(active), decoding.batch_size):
            chunk = active[lo:lo + decoding.batch_size]
            requests = [policy.request(convs[i], step) for i in chunk]

            def spans(js: list[int], chunk: list[int] = chunk, requests: list[TurnRequest] = requests) -> list[Any]:
                return [policy.tool_span(convs[chunk[j]], requests[j].text) for j in js]

            gens = _generate(target, decoding, requests, spans, edit)
            for i, g, r in zip(chunk, gens, requests):
                advance(policy, convs[i], g, r)
            newly = [i for i in chunk if convs[i].done and i not in records]
            for i in newly:
                records[i] = policy.record(convs[i])
            if newly and on_done is not None:
                on_done([records[i] for i in newly])
        step += 1
    return [records[i] for i in range(len(convs))]
