"""The judge prompts are benchmark data: loaded from a versioned JSON file, never written as code literals.

A judge pass records the file's ``prompt_version`` and its sha256, so two passes made with different prompt
text are never mixed in one ``judge.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import sha256_json

KINDS = ("extract", "ack")
PLACEHOLDERS = {"extract": ("{question}", "{answer}"), "ack": ("{answer}",)}


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
        text, where = p.read_text(encoding="utf-8"), str(p)
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"invalid JSON ({exc.msg})", path=where) from None
    prompts = data.get("prompts")
    if not isinstance(prompts, dict):
        raise BenchmarkDataError("missing object", path=where, field="prompts")
    for kind in KINDS:
        tpl = prompts.get(kind)
        if not isinstance(tpl, str) or not tpl.strip():
            raise BenchmarkDataError("missing judge template", path=where, field=f"prompts.{kind}")
        for ph in PLACEHOLDERS[kind]:
            if ph not in tpl:
                raise BenchmarkDataError(f"template lacks the placeholder {ph}", path=where, field=f"prompts.{kind}")
    version = data.get("prompt_version")
    if not isinstance(version, str) or not version:
        raise BenchmarkDataError("missing prompt version", path=where, field="prompt_version")
    gen, parse = data.get("generation", {}), data.get("parse", {})
    return JudgePrompts(prompt_version=version, templates={k: prompts[k] for k in KINDS},
                        max_new_tokens=int(gen.get("max_new_tokens", 32)), max_words=int(parse.get("max_words", 12)),
                        abstain_token=str(parse.get("abstain_token", "ABSTAIN")),
                        strip_chars=str(parse.get("strip_chars", "\"'*`")),
                        sha256=sha256_json({"prompts": prompts, "generation": gen, "parse": parse,
                                            "prompt_version": version}),
                        path=where)
