"""The texts of an agent run: system prompt per condition, the policy sentence, the task turn, the forced turn.

All wording lives in ``data/prompts.json`` and ``data/policies.json``. A policy (Plain / Compare / Verify /
Disclose) is a one-sentence prompt intervention appended to the system prompt after one space; Plain appends
nothing, so Plain's system prompt is exactly the base prompt. The no-tool condition gets a system prompt that
mentions no tool, and no policy sentence (every sentence speaks of the tool's output, which it does not have);
every other condition gets the one that describes ``python_executor``. Both require three-decimal half-up
rounding and a ``FINAL ANSWER:`` line, which :mod:`memtoc.tasks.codeexec.grader` parses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memtoc.tasks.codeexec.resources import load_data
from memtoc.core.errors import BenchmarkDataError
from memtoc.core.vocab import CODEEXEC_POLICIES as POLICIES

__all__ = ["POLICIES", "PromptSet", "load_prompts", "load_policies", "system_prompt", "user_prompt",
           "final_answer_turn", "tool_schema"]

_PROMPTS = "prompts.json"
_POLICIES = "policies.json"


@dataclass(frozen=True)
class PromptSet:
    """The prompt texts of ``data/prompts.json``."""

    system_tool: str
    system_no_tool: str
    user: str
    final_answer_turn: str
    tool: dict[str, Any]


def load_prompts() -> PromptSet:
    obj = load_data(_PROMPTS, schema_version="memtoc-codeexec-prompts-v1",
                    required=("system_tool", "system_no_tool", "user", "final_answer_turn", "tool"))
    if "{question}" not in obj["user"]:
        raise BenchmarkDataError("must contain the {question} placeholder", path=_PROMPTS, field="user")
    return PromptSet(system_tool=obj["system_tool"], system_no_tool=obj["system_no_tool"], user=obj["user"],
                     final_answer_turn=obj["final_answer_turn"], tool=obj["tool"])


def load_policies() -> dict[str, str]:
    """Policy name -> its sentence ("" for Plain), in :data:`POLICIES` order."""
    obj = load_data(_POLICIES, schema_version="memtoc-codeexec-policies-v1", required=("policies",))
    table = obj["policies"]
    if set(table) != set(POLICIES):
        raise BenchmarkDataError(f"expected exactly {list(POLICIES)}, found {sorted(table)}", path=_POLICIES,
                                 field="policies")
    if table["Plain"] != "":
        raise BenchmarkDataError("Plain must be the empty intervention", path=_POLICIES, field="policies.Plain")
    return {name: table[name] for name in POLICIES}


def system_prompt(condition: str, policy: str = "Plain") -> str:
    """System prompt of one condition under one policy (see the module docstring for the assembly)."""
    from memtoc.tasks.codeexec.conditions import check_condition

    check_condition(condition)
    policies = load_policies()
    if policy not in policies:
        raise ValueError(f"unknown policy {policy!r}; expected one of {list(POLICIES)}")
    prompts = load_prompts()
    base = prompts.system_no_tool if condition == "no_tool" else prompts.system_tool
    sentence = "" if condition == "no_tool" else policies[policy]
    return f"{base} {sentence}" if sentence else base


def user_prompt(question: str) -> str:
    """The task turn for a problem's question text."""
    return load_prompts().user.format(question=question)


def final_answer_turn() -> str:
    """The user turn that forces an answer ("Please give your final answer now.")."""
    return load_prompts().final_answer_turn


def tool_schema() -> dict[str, Any]:
    """The ``python_executor`` tool schema offered in the tool conditions."""
    return load_prompts().tool


_SCRIPTED = "scripted_calls.json"


def scripted_call(op: str, a: str, b: str) -> tuple[str, str]:
    """``(code, text-protocol content)`` of the scripted first tool call for a problem (``--first-call scripted``)."""
    from memtoc.tasks.codeexec.problems import OPS

    obj = load_data(_SCRIPTED, schema_version="memtoc-codeexec-scripted-calls-v1", required=("content", "code"))
    table = obj["code"]
    if set(table) != set(OPS):
        raise BenchmarkDataError(f"expected code for exactly {list(OPS)}, found {sorted(table)}", path=_SCRIPTED,
                                 field="code")
    code = table[op].format(a=a, b=b)
    return code, obj["content"].format(code=code)
