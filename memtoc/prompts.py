"""Prompt templates as versioned data (``memtoc/data/prompts.json``) and their rendering.

The templates are the MemToC release's prompt_version 2 strings, transcribed exactly; tests compare the
rendered prompts with the release's own episodes byte for byte. Rendering substitutes placeholders in one
pass, so braces inside a question or a tool output are never re-interpreted.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from memtoc.errors import BenchmarkDataError

FORMULATIONS: tuple[str, ...] = ("reference", "paraphrase_a", "paraphrase_b")
FRAMES: tuple[str, ...] = ("tool", "tool-no-schema", "passage")
INTERVENTIONS: tuple[str, ...] = ("none", "warn", "source-priority", "abstain-and-flag")
CLOSED_BOOK_MODES: tuple[str, ...] = ("forced", "permissive")

_PLACEHOLDER = re.compile(r"\{(question|schema|tool_output)\}")


def dump_json(obj: Any) -> str:
    """Serialise a tool schema or tool output the way the release does (default separators, key order kept)."""
    return json.dumps(obj, ensure_ascii=False)


@dataclass(frozen=True)
class RenderedToolPrompt:
    """A with-tool prompt plus the character span of the serialized tool output inside it.

    The span lets activation capture and steering find the tool-output tokens through the tokenizer's
    offset mapping instead of searching token strings.
    """

    text: str
    tool_output_span: tuple[int, int]


@dataclass(frozen=True)
class PromptSet:
    """All templates of one prompt version."""

    prompt_version: int
    formulations: Mapping[str, Mapping[str, Any]]
    interventions: Mapping[str, str | None]
    tool_error_payload: Mapping[str, Any]
    sha256: str

    def _formulation(self, formulation: str) -> Mapping[str, Any]:
        try:
            return self.formulations[formulation]
        except KeyError:
            raise BenchmarkDataError(f"unknown formulation {formulation!r}; choose from {', '.join(FORMULATIONS)}",
                                     field="formulation") from None

    def prompt_variant(self, formulation: str) -> int:
        return int(self._formulation(formulation)["prompt_variant"])

    def closed_book(self, formulation: str, question: str, mode: str = "forced") -> str:
        if mode not in CLOSED_BOOK_MODES:
            raise BenchmarkDataError(f"unknown closed-book mode {mode!r}; choose from {', '.join(CLOSED_BOOK_MODES)}",
                                     field="closed_book")
        return _render(self._formulation(formulation)[f"closed_book_{mode}"], question=question)[0]

    def with_tool(self, formulation: str, question: str, tool_output: Mapping[str, Any], *,
                  frame: str = "tool", schema: Mapping[str, Any] | None = None,
                  intervention: str = "none") -> RenderedToolPrompt:
        spec = self._formulation(formulation)
        if frame not in FRAMES:
            raise BenchmarkDataError(f"unknown frame {frame!r}; choose from {', '.join(FRAMES)}", field="frame")
        if frame == "tool" and schema is None:
            raise BenchmarkDataError("the 'tool' frame needs the question's tool schema; use 'tool-no-schema' or "
                                     "load a release episode file that carries schemas", field="frame")
        if intervention not in self.interventions:
            raise BenchmarkDataError(f"unknown prompt intervention {intervention!r}; choose from "
                                     f"{', '.join(self.interventions)}", field="prompt_intervention")
        text, spans = _render(spec["frames"][frame], question=question, tool_output=dump_json(tool_output),
                              schema=None if schema is None else dump_json(schema))
        span = spans["tool_output"]
        sentence = self.interventions[intervention]
        if sentence:
            # Inserted immediately before the FINAL-instruction line, as the release's control arms do.
            at = text.index(spec["final_instruction_anchor"], span[1])
            text = text[:at] + sentence + "\n" + text[at:]
        return RenderedToolPrompt(text=text, tool_output_span=span)


def _render(template: str, **values: str | None) -> tuple[str, dict[str, tuple[int, int]]]:
    """Substitute placeholders in one pass and record where each substituted value landed."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    length = 0
    for m in _PLACEHOLDER.finditer(template):
        literal = template[pos:m.start()]
        out.append(literal)
        length += len(literal)
        value = values.get(m.group(1))
        if value is None:
            raise BenchmarkDataError(f"template placeholder {{{m.group(1)}}} has no value", field=m.group(1))
        spans[m.group(1)] = (length, length + len(value))
        out.append(value)
        length += len(value)
        pos = m.end()
    out.append(template[pos:])
    return "".join(out), spans


@lru_cache(maxsize=None)
def load_prompt_set(version: int = 2) -> PromptSet:
    """Load the packaged templates of a prompt version (only version 2 ships)."""
    if version != 2:
        raise BenchmarkDataError(f"prompt version {version} is not packaged (available: 2)", field="prompt_version")
    raw = resources.files("memtoc").joinpath("data/prompts.json").read_bytes()
    data = json.loads(raw)
    return PromptSet(prompt_version=int(data["prompt_version"]), formulations=data["formulations"],
                     interventions=data["interventions"], tool_error_payload=data["tool_error_payload"],
                     sha256=hashlib.sha256(raw).hexdigest())
