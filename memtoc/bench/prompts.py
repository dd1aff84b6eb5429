"""Prompt templates as versioned data (``memtoc/data/prompts.json``) and their rendering.

The templates are the MemToC release's prompt_version 2 strings, transcribed exactly; tests compare the
rendered prompts with the release's own episodes byte for byte. Rendering substitutes placeholders in one
pass, so braces inside a question or a tool output are never re-interpreted.

Run identity: a run records ``prompt_templates_sha256``, the hash of the templates it renders
(:meth:`PromptSet.used_templates`), so adding a frame, a mode or an intervention to the file, or editing one the
run does not use, leaves every existing run resumable; editing a used one does not (:func:`prompt_identity`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from memtoc.core.errors import BenchmarkDataError, RunStoreError
from memtoc.core.vocab import CLOSED_BOOK_MODES, FORMULATIONS, FRAMES


_PLACEHOLDER = re.compile(r"\{(question|schema|tool_output)\}")


def _known(value: str, allowed: tuple[str, ...], what: str, field: str) -> None:
    if value not in allowed:
        raise BenchmarkDataError(f"unknown {what} {value!r}; choose from {', '.join(allowed)}", field=field)


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
    #: name -> {"description", "remove": {formulation: {frame: sentence}}}: prompt arms that delete a sentence
    ablations: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def prompt_arms(self) -> tuple[str, ...]:
        """Every ``--prompt-intervention`` value: the inserted sentences, then the ablations."""
        return (*self.interventions, *self.ablations)

    def _frame_template(self, formulation: str, frame: str, intervention: str) -> str:
        """The with-tool template of ``frame``; an ablation arm deletes its sentence from it first (before
        rendering, so the tool-output span is measured on the text the model sees)."""
        template = self._formulation(formulation)["frames"][frame]
        if intervention in self.ablations:
            sentence = self.ablations[intervention]["remove"][formulation][frame]
            if template.count(sentence) != 1:
                raise BenchmarkDataError(f"ablation {intervention!r}: its sentence for {formulation}/{frame} occurs "
                                         f"{template.count(sentence)} times in the template (expected once)",
                                         field="prompt_intervention")
            template = template.replace(sentence, "", 1)
        return template

    def _formulation(self, formulation: str) -> Mapping[str, Any]:
        try:
            return self.formulations[formulation]
        except KeyError:
            raise BenchmarkDataError(f"unknown formulation {formulation!r}; choose from {', '.join(FORMULATIONS)}",
                                     field="formulation") from None

    def prompt_variant(self, formulation: str) -> int:
        return int(self._formulation(formulation)["prompt_variant"])

    def closed_book(self, formulation: str, question: str, mode: str = "forced") -> str:
        _known(mode, CLOSED_BOOK_MODES, "closed-book mode", "closed_book")
        return _render(self._formulation(formulation)[f"closed_book_{mode}"], question=question)[0]

    def with_tool(self, formulation: str, question: str, tool_output: Mapping[str, Any], *,
                  frame: str = "tool", schema: Mapping[str, Any] | None = None,
                  intervention: str = "none") -> RenderedToolPrompt:
        spec = self._formulation(formulation)
        _known(frame, FRAMES, "frame", "frame")
        if frame == "tool" and schema is None:
            raise BenchmarkDataError("the 'tool' frame needs the question's tool schema; use 'tool-no-schema' or "
                                     "load a release episode file that carries schemas", field="frame")
        _known(intervention, self.prompt_arms, "prompt intervention", "prompt_intervention")
        text, spans = _render(self._frame_template(formulation, frame, intervention), question=question,
                              tool_output=dump_json(tool_output), schema=None if schema is None else dump_json(schema))
        span = spans["tool_output"]
        sentence = self.interventions.get(intervention)
        if sentence:
            # Inserted immediately before the FINAL-instruction line, as the release's control arms do.
            at = text.index(spec["final_instruction_anchor"], span[1])
            text = text[:at] + sentence + "\n" + text[at:]
        return RenderedToolPrompt(text=text, tool_output_span=span)

    def used_templates(self, *, frame: str, intervention: str = "none", closed_book: str = "forced"
                       ) -> dict[str, Any]:
        """Exactly the template data a run with these settings can render (what its identity hashes).

        A run directory's plan may grow (more formulations, conditions or questions on a later invocation), so
        every formulation's templates for its frame and closed-book mode count as used, and so does the
        tool-error payload; other frames, modes and interventions do not.
        """
        _known(frame, FRAMES, "frame", "frame")
        _known(intervention, self.prompt_arms, "prompt intervention", "prompt_intervention")
        _known(closed_book, CLOSED_BOOK_MODES, "closed-book mode", "closed_book")
        sentence = self.interventions.get(intervention)
        used: dict[str, Any] = {"prompt_version": self.prompt_version, "formulations": {}}
        for f in FORMULATIONS:
            spec = self._formulation(f)
            used["formulations"][f] = {
                "prompt_variant": spec["prompt_variant"],
                f"closed_book_{closed_book}": spec[f"closed_book_{closed_book}"],
                "frame": {frame: spec["frames"][frame]},
                # the anchor places an intervention sentence; with none it changes nothing rendered
                "final_instruction_anchor": spec["final_instruction_anchor"] if sentence else None}
        # an ablation's identity is the sentences it removes (all formulations, the run's frame)
        used["intervention"] = ({intervention: {f: self.ablations[intervention]["remove"][f][frame]
                                                for f in FORMULATIONS}}
                                if intervention in self.ablations else {intervention: sentence})
        used["tool_error_payload"] = dict(self.tool_error_payload)
        return used

    def templates_sha256(self, **settings: Any) -> str:
        """sha256 of :meth:`used_templates` in canonical JSON (sorted keys)."""
        text = json.dumps(self.used_templates(**settings), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _render(template: str, **values: str | None) -> tuple[str, dict[str, tuple[int, int]]]:
    """Substitute placeholders in one pass and record where each substituted value landed."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    for m in _PLACEHOLDER.finditer(template):
        out.append(template[pos:m.start()])
        value = values.get(m.group(1))
        if value is None:
            raise BenchmarkDataError(f"template placeholder {{{m.group(1)}}} has no value", field=m.group(1))
        start = sum(map(len, out))
        spans[m.group(1)] = (start, start + len(value))
        out.append(value)
        pos = m.end()
    out.append(template[pos:])
    return "".join(out), spans


@lru_cache(maxsize=None)
def load_prompt_set() -> PromptSet:
    """Load the packaged templates (prompt version 2, the only one that ships)."""
    return parse_prompt_set(resources.files("memtoc").joinpath("data/prompts.json").read_bytes())


def parse_prompt_set(raw: bytes) -> PromptSet:
    """A :class:`PromptSet` from the bytes of a ``prompts.json`` (``sha256`` is the hash of those bytes)."""
    data = json.loads(raw)
    return PromptSet(prompt_version=int(data["prompt_version"]), formulations=data["formulations"],
                     interventions=data["interventions"], tool_error_payload=data["tool_error_payload"],
                     sha256=hashlib.sha256(raw).hexdigest(), ablations=data.get("ablations") or {})


def prompt_identity(prompts: PromptSet, templates_sha256: str, existing: Mapping[str, Any] | None, *,
                    where: str) -> dict[str, str]:
    """The prompt fields of a run identity, given the identity ``existing`` recorded at ``where`` (or None).

    New runs get ``prompt_templates_sha256``. A run made before per-template hashing recorded
    ``prompts_sha256`` (the whole file): while the file is unchanged that key is kept, so the run resumes with
    the identity it was made with; once the file differs the run is refused, naming the field — its templates
    cannot be compared any more, and resuming could mix two sets of prompts.
    """
    if existing and "prompts_sha256" in existing and "prompt_templates_sha256" not in existing:
        if existing["prompts_sha256"] == prompts.sha256:
            return {"prompts_sha256": prompts.sha256}
        raise RunStoreError(
            f"{where} was made with another prompts.json (field prompts_sha256: {str(existing['prompts_sha256'])[:12]}"
            f" there, {prompts.sha256[:12]} now) before runs recorded the templates they use; its prompts cannot be "
            "matched, so it cannot be resumed: use another output path, or delete it to start over")
    return {"prompt_templates_sha256": templates_sha256}
