"""A scripted text backend for the agent-loop tests: replies chosen from the last message of the rendered
conversation (no chat template: the plain ``Role: content`` rendering), every request recorded."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from memtoc.backends.base import Generation
from memtoc.core.backend_kinds import GENERATE, GUIDED


class ScriptedBackend:
    name = "scripted"
    chat = False
    tokenizer = None
    capabilities = frozenset({GENERATE, GUIDED})

    def __init__(self, call: Callable[[str], str], *, decision: str = "CALL", answer: str = "FINAL: Paris",
                 closed_book: str = "FINAL: Paris") -> None:
        self.call, self.decision, self.answer, self.closed_book = call, decision, answer, closed_book
        self.requests: list[dict[str, Any]] = []

    def _reply(self, text: str) -> str:
        last = text.rsplit("\n\n", 2)[-2]
        if "Reply with exactly one word" in last:
            return self.decision
        if last.startswith("User: Tool result:") or "Give your final answer now" in last:
            return self.answer
        return self.call(text)

    def _gen(self, texts, cfg, schemas=None, sampling=None):
        out = []
        for i, t in enumerate(texts):
            self.requests.append({"text": t, "schema": schemas[i] if schemas else None, "stop": cfg.stop_at_final_line})
            r = self._reply(t)
            out.append(Generation(text=r, n_prompt_tokens=len(t), n_new_tokens=len(r), stop_reason="eos"))
        return out

    def generate_formatted(self, texts, cfg, edit=None):
        return self._gen(texts, cfg)

    def generate_guided(self, texts, cfg, *, schemas=None, sampling=None):
        return self._gen(texts, cfg, schemas, sampling)

    def generate(self, prompts, cfg, edit=None):
        return [Generation(text=self.closed_book, n_prompt_tokens=1, n_new_tokens=1, stop_reason="eos")
                for _ in prompts]

    def provenance(self):
        return {"backend": "scripted", "model": "scripted", "weights": {"sha256": "0"}, "dtype": "float32",
                "chat_template_sha256": None}


def call_text(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


@pytest.fixture
def scripted():
    """The :class:`ScriptedBackend` class and :func:`call_text`."""
    return ScriptedBackend, call_text
