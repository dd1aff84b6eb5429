"""The texts of an agent episode (``data/agent_prompts.json``) and the three tool-choice protocols.

- ``guided`` (a1): the task turn names the tool to call; the call turn must be the call, generated under the
  tool's schema when decoding is constrained (the default for this protocol; vLLM's named ``tool_choice`` is
  guided decoding too);
- ``auto`` (a2): the tool is offered and the model decides freely;
- ``two-stage`` (a4): a decide turn (``CALL`` or ``ANSWER``), then, on ``CALL``, a call turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from memtoc.core.errors import BenchmarkDataError
from memtoc.core.fileio import sha256_json

__all__ = ["PROTOCOLS", "DECODINGS", "AgentPrompts", "load_agent_prompts", "parse_protocols"]

from memtoc.core.vocab import AGENT_PROTOCOLS as PROTOCOLS  # noqa: E402
#: "auto": constrained for guided, free for auto and two-stage.
DECODINGS = ("auto", "free", "constrained")
_FILE = "data/agent_prompts.json"
_KEYS = ("system", "text_protocol", "user", "guided", "decide", "call_now", "text_tool_return", "call_rejected",
         "final")


@dataclass(frozen=True)
class AgentPrompts:
    texts: Mapping[str, str]
    sha256: str

    def __getattr__(self, name: str) -> str:
        try:
            return self.texts[name]
        except KeyError:
            raise AttributeError(name) from None

    def text_protocol_system(self, schema: Mapping[str, Any]) -> str:
        return f"{self.texts['system']} " + self.texts["text_protocol"].format(tool=json.dumps(schema))


def load_agent_prompts() -> AgentPrompts:
    path = Path(str(resources.files("memtoc").joinpath(_FILE)))
    doc = json.loads(path.read_text(encoding="utf-8"))
    if doc.get("schema_version") != "memtoc-agent-prompts-v1":
        raise BenchmarkDataError("unexpected schema_version", path=path, field="schema_version")
    missing = [k for k in _KEYS if not isinstance(doc.get(k), str)]
    if missing:
        raise BenchmarkDataError(f"missing texts {missing}", path=path, field=missing[0])
    texts = {k: doc[k] for k in _KEYS}
    return AgentPrompts(texts=texts, sha256=sha256_json(texts))


def parse_protocols(spec: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A comma list of protocols ("all" = every one), validated, in :data:`PROTOCOLS` order."""
    from memtoc.core.config import ConfigError

    items = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if items == ["all"]:
        return PROTOCOLS
    bad = [s for s in items if s not in PROTOCOLS]
    if bad or not items:
        raise ConfigError(f"--protocol: choose from {', '.join(PROTOCOLS)} (comma list) or all, not {spec!r}")
    return tuple(p for p in PROTOCOLS if p in items)
