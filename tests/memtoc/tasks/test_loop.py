"""The one agent loop on a toy policy: lockstep batching in chunks, grouping by request kind, per-row seeds, edit
binding, feeding calls back (native and text), max rounds, the forced final turn and crash-safe finishing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memtoc.backends.base import Generation
from memtoc.tasks.loop import (ANSWER, CALL, FINAL, Conversation, Decoding, Exchange, LoopPolicy, TurnRequest,
                               run_loop)


@dataclass(frozen=True)
class Call:
    arg: str


class Toy(LoopPolicy[Conversation]):
    """Replies are the spec's script; ``CALL x`` is a call, ``ANSWER`` is an answer."""

    final_prompt = "final now"

    def __init__(self, *, rounds=1, after=ANSWER, native=False, stop=False, schema=None):
        self.max_rounds, self.after_last_call, self.native = rounds, after, native
        self.stop, self.schema = stop, schema
        self.spans: list = []

    def start(self, spec):
        return Conversation(spec=spec, messages=[{"role": "user", "content": spec["q"]}])

    def request(self, conv, step):
        return TurnRequest(f"{conv.spec['q']}#{len(conv.turns)}", schema=self.schema if conv.phase == CALL else None,
                           stop_at_final_line=self.stop and conv.phase != CALL, seed=100 * step + len(conv.turns))

    def turn_record(self, conv, gen, request):
        return {"phase": conv.phase, "text": gen.text, "seed": request.seed}

    def find_call(self, conv, text):
        return Call(text[5:]) if text.startswith("CALL ") else None

    def execute(self, conv, call, text):
        return Exchange(native=self.native, content="" if self.native else text, name="t", arguments={"a": call.arg},
                        tool="t", result=f"ret:{call.arg}")

    def text_return(self, result):
        return f"Tool: {result}"

    def is_answer(self, text):
        return text.startswith("ANSWER")

    def tool_span(self, conv, text):
        return None if conv.first_return is None else (0, 1)

    def record(self, conv):
        return {"q": conv.spec["q"], "final": conv.final_text, "rounds": conv.rounds, "forced": conv.forced,
                "phases": [t["phase"] for t in conv.turns], "messages": conv.messages}


class Backend:
    def __init__(self):
        self.calls: list = []

    def _reply(self, text):
        q, n = text.split("#")
        return Generation(text=SCRIPTS[q][int(n)], n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")

    def generate_formatted(self, texts, cfg, *, edit=None):
        self.calls.append(("formatted", list(texts), cfg, edit))
        return [self._reply(t) for t in texts]

    def generate_guided(self, texts, cfg, *, schemas=None, sampling=None):
        self.calls.append(("guided", list(texts), cfg, sampling))
        return [self._reply(t) for t in texts]


SCRIPTS = {
    "a": ["CALL 1", "ANSWER a"],
    "b": ["ANSWER b"],
    "c": ["CALL 1", "CALL 2", "ANSWER c"],
    "d": ["thinking", "ANSWER d"],
}


def specs(*qs):
    return [{"q": q} for q in qs]


def test_lockstep_chunks_and_records_in_spec_order():
    b = Backend()
    done: list = []
    recs = run_loop(Toy(), b, specs("a", "b", "d"), Decoding(max_new_tokens=4, batch_size=2),
                    on_done=lambda batch: done.append([r["q"] for r in batch]))
    assert [r["q"] for r in recs] == ["a", "b", "d"]
    # round 1: a, b | d; round 2: a, d (b finished)
    assert [len(c[1]) for c in b.calls] == [2, 1, 2]
    assert done == [["b"], ["a", "d"]]
    a, bb, d = recs
    assert a["final"] == "ANSWER a" and a["rounds"] == 1 and a["phases"] == [CALL, ANSWER]
    assert a["messages"][1:] == [{"role": "assistant", "content": "CALL 1"}, {"role": "user", "content": "Tool: ret:1"},
                                 {"role": "assistant", "content": "ANSWER a"}]
    assert bb["final"] == "ANSWER b" and bb["rounds"] == 0
    # a turn that is neither a call nor an answer gets the final-answer turn
    assert d["forced"] and d["phases"] == [CALL, FINAL]
    assert d["messages"][2] == {"role": "user", "content": "final now"}


def test_native_calls_go_back_as_tool_calls_and_a_tool_message():
    (rec,) = run_loop(Toy(native=True), Backend(), specs("a"), Decoding(max_new_tokens=4, batch_size=8))
    assert rec["messages"][1:3] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call1", "type": "function", "function": {"name": "t", "arguments": {"a": "1"}}}]},
        {"role": "tool", "name": "t", "tool_call_id": "call1", "content": "ret:1"}]


def test_max_rounds_and_the_forced_final_turn():
    # two rounds, then the final turn at once
    (c,) = run_loop(Toy(rounds=2, after=FINAL), Backend(), specs("c"), Decoding(max_new_tokens=4, batch_size=1))
    assert c["rounds"] == 2 and c["forced"] and c["phases"] == [CALL, CALL, FINAL] and c["final"] == "ANSWER c"
    # one round, then an answer turn: its call is not executed and it is not an answer, so the final turn follows
    (c,) = run_loop(Toy(rounds=1), Backend(), specs("c"), Decoding(max_new_tokens=4, batch_size=1))
    assert c["rounds"] == 1 and c["phases"] == [CALL, ANSWER, FINAL]
    # no rounds: a call is not executed; the final turn is asked
    (c,) = run_loop(Toy(rounds=0), Backend(), specs("c"), Decoding(max_new_tokens=4, batch_size=1))
    assert c["rounds"] == 0 and c["phases"] == [CALL, FINAL]


def test_rows_are_grouped_by_request_kind():
    b = Backend()
    run_loop(Toy(stop=True, schema={"type": "object"}), b, specs("a", "b"), Decoding(max_new_tokens=4, batch_size=8))
    kinds = [(c[0], c[2].stop_at_final_line, len(c[1])) for c in b.calls]
    assert kinds == [("guided", False, 2), ("formatted", True, 1)]     # a's answer turn is free, with the stop


def test_per_row_seeds_when_sampling():
    b = Backend()
    run_loop(Toy(), b, specs("a", "b"), Decoding(max_new_tokens=4, batch_size=8, temperature=0.5))
    assert b.calls[0][2].row_seeds == (0, 0) and b.calls[1][2].row_seeds == (101,)
    # the guided sampler groups sampled rows by their seed
    b = Backend()
    run_loop(Toy(), b, specs("a", "b"), Decoding(max_new_tokens=4, batch_size=8, temperature=0.5, sampler="guided"))
    assert [(c[0], c[3].seed) for c in b.calls] == [("guided", 0), ("guided", 101)]


def test_seeds_do_not_depend_on_the_batch_size():
    """A request's step is the lockstep step, not the backend call: chunking the rows changes no seed."""
    seeds = []
    for batch_size in (1, 2, 8):
        b = Backend()
        run_loop(Toy(), b, specs("a", "b", "c"), Decoding(max_new_tokens=4, batch_size=batch_size, temperature=0.5))
        seeds.append({t: seed for _, texts, cfg, _ in b.calls for t, seed in zip(texts, cfg.row_seeds)})
    assert seeds[0] == seeds[1] == seeds[2]
    assert seeds[0] == {"a#0": 0, "b#0": 0, "c#0": 0, "a#1": 101, "c#1": 101, "c#2": 202}


def test_an_unbound_edit_is_bound_per_call_to_the_rows_tool_spans(monkeypatch):
    import memtoc.tasks.loop as loop

    class Inspectable(Backend):
        def preformatted(self):
            return self

    monkeypatch.setattr(loop, "InspectableBackend", Inspectable)

    class Edit:
        bound: list = []

        def bind(self, texts, spans):
            self.bound.append((texts, spans))
            return "bound"

    b, e = Inspectable(), Edit()
    run_loop(Toy(), b, specs("a", "b"), Decoding(max_new_tokens=4, batch_size=8), edit=e)
    assert e.bound == [(["a#0", "b#0"], [None, None]), (["a#1"], [(0, 1)])]
    assert [c[3] for c in b.calls] == ["bound", "bound"]
    with pytest.raises(ValueError, match="hf backend"):
        run_loop(Toy(), Backend(), specs("a"), Decoding(max_new_tokens=4, batch_size=8), edit=e)


def test_a_short_backend_reply_is_refused():
    class Short(Backend):
        def generate_formatted(self, texts, cfg, *, edit=None):
            return []

    with pytest.raises(RuntimeError, match="0 generations for 1 prompts"):
        run_loop(Toy(), Short(), specs("a"), Decoding(max_new_tokens=4, batch_size=8))


def test_decoding_is_checked():
    with pytest.raises(ValueError, match="sampler"):
        Decoding(max_new_tokens=4, batch_size=1, sampler="beam")
