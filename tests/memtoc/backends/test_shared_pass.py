"""SharedPass: rounds of generate calls from several evaluations answered by one backend call each (no vLLM)."""

from __future__ import annotations

import threading

import pytest
import torch

from memtoc.backends.base import Generation
from memtoc.core.runtime import GenerationConfig
from memtoc.backends.shared_pass import SharedPass
from steering.kinds.direction import DirectionEdit


class RecordingBackend:
    """Answers each row with its prompt and the strength its row carries (None: no edit); records every call."""

    name, chat, tokenizer, capabilities = "fake", False, None, frozenset({"generate", "edits", "row_edits"})

    def __init__(self):
        self.calls = []
        self.thread = None

    def format_prompt(self, p):
        return p

    def provenance(self):
        return {"backend": "fake"}

    def generate(self, prompts, config, *, edit=None):
        self.calls.append((list(prompts), None if edit is None else edit.row_strengths()))
        self.thread = threading.current_thread()
        st = edit.row_strengths() if edit is not None else [None] * len(prompts)
        return [Generation(text=f"{p}|{s}", n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")
                for p, s in zip(prompts, st)]


def _edit():
    u = torch.zeros(8)
    u[0] = 1.0
    return DirectionEdit.build(name="t", layers=[1], vectors={1: u}, scale={1: 1.0}, strength=1.0)


def test_each_round_is_one_backend_call_with_a_strength_per_row():
    backend = RecordingBackend()
    edit = _edit()
    strengths = [0.0, 1.0, 2.0]
    shared = SharedPass(backend, len(strengths))
    got = {}

    def member(s):
        m = shared.member()
        try:
            closed = m.generate(["c1", "c2"], GenerationConfig())                      # no edit: deduplicated
            tool = m.generate(["t1", "t2"], GenerationConfig(), edit=edit.with_strength(s).bind(["t1", "t2"]))
            got[s] = ([g.text for g in closed], [g.text for g in tool])
        finally:
            shared.leave()

    threads = [threading.Thread(target=member, args=(s,)) for s in strengths]
    for t in threads:
        t.start()
    shared.serve()
    for t in threads:
        t.join()
    assert shared.stats.passes == 2 == len(backend.calls) and shared.stats.rounds == [3, 3]
    assert backend.calls[0] == (["c1", "c2"], None)                    # 6 rows asked, 2 sent
    # one row per member and prompt, in the order the members arrived
    assert backend.calls[1][0] == ["t1", "t2"] * 3 and sorted(backend.calls[1][1]) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert backend.thread is threading.main_thread()                   # the passes ran in the serving thread
    for s in strengths:
        assert got[s] == (["c1|None", "c2|None"], [f"t1|{s}", f"t2|{s}"])


def test_a_member_that_fails_does_not_stall_the_others_and_errors_reach_the_caller():
    backend = RecordingBackend()
    shared = SharedPass(backend, 2)
    errors = []

    def good():
        try:
            assert [g.text for g in shared.member().generate(["a"], GenerationConfig())] == ["a|None"]
        finally:
            shared.leave()

    def bad():
        try:
            raise RuntimeError("boom")
        except RuntimeError as exc:
            errors.append(exc)
        finally:
            shared.leave()

    threads = [threading.Thread(target=f) for f in (good, bad)]
    for t in threads:
        t.start()
    shared.serve()
    for t in threads:
        t.join()
    assert len(errors) == 1 and backend.calls == [(["a"], None)]


def test_edits_differing_in_more_than_strength_get_their_own_pass():
    backend = RecordingBackend()
    e = _edit()
    other = e._copy_with(positions="tool_span")
    shared = SharedPass(backend, 2)

    def run(edit, s):
        try:
            shared.member().generate(["x"], GenerationConfig(), edit=edit.with_strength(s).bind(["x"], [None]))
        finally:
            shared.leave()

    threads = [threading.Thread(target=run, args=a) for a in ((e, 1.0), (other, 2.0))]
    for t in threads:
        t.start()
    shared.serve()
    for t in threads:
        t.join()
    assert sorted(c[1][0] for c in backend.calls) == [1.0, 2.0] and shared.stats.passes == 2
    with pytest.raises(ValueError, match="differ in more than their strength"):
        type(e.bind(["x"])).stack([e.bind(["x"]), other.bind(["x"], [None])])
