"""The judge prompts are benchmark data: loaded from a versioned JSON file, never written as code literals.

A judge pass records the file's ``prompt_version`` and its sha256, so two passes made with different prompt
text are never mixed in one ``judge.jsonl``.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import sha256_json

KINDS = ("extract", "ack")
PLACEHOLDERS = {"extract": ("{question}", "{answer}"), "ack": ("{answer}",)}
ALLOWED_FIELDS = ("question", "answer")


@dataclass(frozen=True)
class JudgePrompts:
    """The judge templates plus the generation and parse settings that travel with them."""

    prompt_version: str
    templates: dict[str, str]
    max_new_tokens: int
    max_words: int
    abstain_token: str
    strip_chars: str
    sha256: str
    path: str

    def render(self, kind: str, *, answer: str, question: str = "") -> str:
        # str.format only reads braces in the template; braces inside answers are copied as they are
        return self.templates[kind].format(question=question, answer=answer)


def load_judge_prompts(path: str | Path | None = None) -> JudgePrompts:
    """Read and validate a judge prompt file (default: the packaged release prompts)."""
    if path is None:
        src = resources.files("memtoc").joinpath("data/judge_prompts.json")
        text, where = src.read_text(encoding="utf-8"), "memtoc/data/judge_prompts.json"
    else:
        p = Path(path)
        if not p.exists():
            raise BenchmarkDataError("judge prompt file not found", path=p)
        try:
            text, where = p.read_text(encoding="utf-8-sig"), str(p)
        except (UnicodeDecodeError, IsADirectoryError) as exc:
            raise BenchmarkDataError(f"not a UTF-8 JSON file ({type(exc).__name__})", path=p) from None
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"invalid JSON ({exc.msg})", path=where) from None
    if not isinstance(data, dict):
        raise BenchmarkDataError("expected a JSON object", path=where)
    prompts = data.get("prompts")
    if not isinstance(prompts, dict):
        raise BenchmarkDataError("missing object", path=where, field="prompts")
    for kind in KINDS:
        tpl = prompts.get(kind)
        if not isinstance(tpl, str) or not tpl.strip():
            raise BenchmarkDataError("missing judge template", path=where, field=f"prompts.{kind}")
        _check_fields(tpl, where, f"prompts.{kind}")
        for ph in PLACEHOLDERS[kind]:
            if ph not in tpl:
                raise BenchmarkDataError(f"template lacks the placeholder {ph}", path=where, field=f"prompts.{kind}")
    version = data.get("prompt_version")
    if not isinstance(version, str) or not version:
        raise BenchmarkDataError("missing prompt version", path=where, field="prompt_version")
    gen, parse = data.get("generation", {}), data.get("parse", {})
    for name, block in (("generation", gen), ("parse", parse)):
        if not isinstance(block, dict):
            raise BenchmarkDataError("expected an object", path=where, field=name)
    abstain, strip = parse.get("abstain_token", "ABSTAIN"), parse.get("strip_chars", "\"'*`")
    if not isinstance(abstain, str) or not abstain.strip():
        raise BenchmarkDataError(f"{abstain!r} is not a non-empty string", path=where, field="parse.abstain_token")
    if not isinstance(strip, str):
        raise BenchmarkDataError(f"{strip!r} is not a string", path=where, field="parse.strip_chars")
    return JudgePrompts(prompt_version=version, templates={k: prompts[k] for k in KINDS},
                        max_new_tokens=_count(gen, "max_new_tokens", 32, where, "generation"),
                        max_words=_count(parse, "max_words", 12, where, "parse"),
                        abstain_token=abstain, strip_chars=strip,
                        sha256=sha256_json({"prompts": prompts, "generation": gen, "parse": parse,
                                            "prompt_version": version}),
                        path=where)


def _check_fields(tpl: str, where: str, field: str) -> None:
    """Only ``{question}`` and ``{answer}`` may be fields: ``{foo}`` or ``{0}`` would fail at the first render
    (after the model loaded), an unbalanced ``{`` too; literal braces are written ``{{`` ``}}``."""
    try:
        parts = list(string.Formatter().parse(tpl))
    except ValueError as exc:
        raise BenchmarkDataError(f"template is not a valid format string ({exc}); write a literal brace as {{{{ or "
                                 "}}", path=where, field=field) from None
    for _text, name, spec, conv in parts:
        if name is None:
            continue
        if name not in ALLOWED_FIELDS or spec or conv:
            raise BenchmarkDataError(f"unknown placeholder {{{name}{'!' + conv if conv else ''}"
                                     f"{':' + spec if spec else ''}}}; the templates take {{question}} and {{answer}} "
                                     "only (a literal brace is {{ or }})", path=where, field=field)


def _count(block: dict[str, Any], key: str, default: int, where: str, section: str) -> int:
    """A whole number >= 1: ``"lots"``, ``-1`` or ``0`` would discard every extraction silently."""
    value = block.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BenchmarkDataError(f"{value!r} is not a whole number >= 1", path=where, field=f"{section}.{key}")
    return value
