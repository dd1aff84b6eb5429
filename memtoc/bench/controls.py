"""Control arms beside the five release conditions: the NoopTool interface control (paper section 3.3) and the
timeout and permission-denied tool-error payloads (section 6), as data in ``memtoc/data/controls.json``.

Each arm is selected like a condition (``--conditions noop_tool,tool_error_timeout,...``), is built by the same
episode builder and scored by the same scorer, and is its own ``condition`` in the records, so its metric
rows never mix with the released conditions. None of them is in ``all``: a default run is unchanged. Every
control return carries no factual value, so the tool counts as wrong (``tool_correct`` False): a memory-right
question sits in ``arb`` and a memory-wrong one in ``both_wrong``, as under the released tool error.
The release does not publish these payloads; the strings are this project's (see the file's ``source``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

CONTROL_ARMS: tuple[str, ...] = ("noop_tool", "tool_error_timeout", "tool_error_permission")


@dataclass(frozen=True)
class ControlArm:
    name: str
    tool_output: Mapping[str, Any]
    reference: str   # the condition it is contrasted with, on the same questions
    measures: str


@dataclass(frozen=True)
class ControlSet:
    arms: Mapping[str, ControlArm]
    sha256: str


@lru_cache(maxsize=None)
def load_controls() -> ControlSet:
    raw = resources.files("memtoc").joinpath("data/controls.json").read_bytes()
    data = json.loads(raw)
    arms = {name: ControlArm(name=name, tool_output=spec["tool_output"], reference=spec["reference"],
                             measures=spec["measures"]) for name, spec in data["arms"].items()}
    if tuple(arms) != CONTROL_ARMS:
        raise ValueError(f"memtoc/data/controls.json defines {tuple(arms)}, expected {CONTROL_ARMS}")
    return ControlSet(arms=arms, sha256=hashlib.sha256(raw).hexdigest())
