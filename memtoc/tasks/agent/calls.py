"""Tool calls in a model turn: found, validated against the tool's JSON schema, and classified.

A turn is classified before anything is executed, and nothing is guessed around: a call whose arguments do not
validate is not executed (its validation errors are recorded), a call that does not parse is not repaired.
The mechanism classes (:data:`MECHANISMS`, paper App. G) are tabled in docs/agent.md: ``T1`` argument type
coercion, ``T2`` unparseable arguments, ``T3`` stage-one decision-parse failure, ``T4`` silent abstention,
``schema`` other schema violations, ``wrong_tool`` a call of a tool not offered; ``None``: a valid, executed call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from memtoc.core.errors import BenchmarkDataError
from memtoc.tasks.toolcalls import first_call

__all__ = ["MECHANISMS", "RawCall", "CallCheck", "find_call", "engine_call", "check_call", "validate_arguments",
           "parse_decision", "check_schema"]

MECHANISMS = ("T1", "T2", "T3", "T4", "schema", "wrong_tool")

#: A turn that contains one of these attempts a call even when no JSON parses.
_ATTEMPT_RE = re.compile(r"<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>|\"(?:name|arguments|parameters)\"\s*:")


@dataclass(frozen=True)
class RawCall:
    """A call attempt found in a turn: the tool name and arguments as written (``None`` when unparseable)."""

    name: str | None
    arguments: Any
    raw: str                  # the text of the call (the JSON), or the whole turn for an unparseable attempt
    prefix: str = ""          # the text before the call (kept as the assistant message's content)
    parsed: bool = True


@dataclass
class CallCheck:
    """The validation of one call: valid, or the mechanism class and every error."""

    valid: bool
    mechanism: str | None
    errors: list[dict[str, Any]] = field(default_factory=list)
    arguments: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"valid": self.valid, "mechanism": self.mechanism, "errors": self.errors}


def find_call(text: str, *, required: bool = False) -> RawCall | None:
    """The first call in ``text`` (the shared ``json`` call parser, :mod:`memtoc.tasks.toolcalls`); an unparseable
    attempt as ``RawCall(parsed=False)``; None when the turn does not attempt a call. ``required``: the turn had to
    be the call (guided, two-stage stage two), so any text without a parseable call is an unparseable attempt
    rather than an abstention."""
    found = first_call(text, ("json",))
    if found is not None:
        return RawCall(name=found.name, arguments=found.arguments, raw=found.raw, prefix=found.content)
    return _attempt(text, required)


def engine_call(parsed: tuple[Any, str | None], text: str, *, required: bool = False) -> RawCall | None:
    """The first call of a serving engine's own parse of ``text`` (vLLM's tool-call parser:
    ``([(name, arguments as JSON text)], content)``), classified as :func:`find_call` classifies: arguments that are
    not JSON are an unparseable attempt (T2); no call, an attempt only when the turn had to be the call or shows a
    call tag."""
    calls, content = parsed
    if calls:
        name, arguments = calls[0]
        prefix = content or ""
        raw = text[len(prefix):] if prefix and text.startswith(prefix) else text
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            return RawCall(name=name, arguments=None, raw=raw, prefix=prefix, parsed=False)
        return RawCall(name=name, arguments=args, raw=raw, prefix=prefix)
    return _attempt(text, required)


def _attempt(text: str, required: bool) -> RawCall | None:
    """A turn without a parseable call: an unparseable attempt when it had to be the call or shows a call tag."""
    return RawCall(name=None, arguments=None, raw=text, parsed=False) if required or _ATTEMPT_RE.search(text) else None


def _stringified(value: Any, expected: Any) -> bool:
    """True when ``value`` is a string spelling an instance of the expected JSON type(s)."""
    if not isinstance(value, str):
        return False
    s, types = value.strip(), expected if isinstance(expected, list) else [expected]
    try:                                     # parsed only for the types that read the value; None matches none
        v = json.loads(s) if {"integer", "number", "array", "object"} & set(types) else None
    except ValueError:
        v = None
    for t in types:
        if t == "boolean" and s.lower() in ("true", "false"):
            return True
        if t == "null" and s.lower() in ("null", "none"):
            return True
        if t in ("integer", "number") and isinstance(v, (int, float)) and not isinstance(v, bool) \
                and (t == "number" or float(v).is_integer()):
            return True
        if t in ("array", "object") and isinstance(v, list if t == "array" else dict):
            return True
    return False


def validate_arguments(arguments: Mapping[str, Any], parameters: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every ``jsonschema`` error of ``arguments`` against the parameters schema, as records."""
    out = []
    for err in sorted(Draft202012Validator(parameters).iter_errors(arguments), key=lambda e: list(e.path)):
        rec: dict[str, Any] = {"validator": err.validator, "path": "/".join(str(p) for p in err.path),
                               "message": err.message}
        if err.validator == "type":
            rec["expected"] = err.validator_value
            rec["value"] = err.instance
            rec["stringified"] = _stringified(err.instance, err.validator_value)
        out.append(rec)
    return out


def check_call(call: RawCall, schema: Mapping[str, Any]) -> CallCheck:
    """Validate ``call`` against the tool ``schema`` (``name``, ``parameters``) and classify it."""
    if not call.parsed:
        return CallCheck(False, "T2", [{"validator": "json", "path": "", "message": "no JSON tool call parses"}])
    args = call.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as exc:
            return CallCheck(False, "T2", [{"validator": "json", "path": "arguments",
                                           "message": f"arguments string is not JSON: {exc}"}])
    if call.name != schema["name"]:
        return CallCheck(False, "wrong_tool", [{"validator": "name", "path": "name",
                                               "message": f"{call.name!r} is not the offered tool {schema['name']!r}"}])
    if not isinstance(args, dict):
        return CallCheck(False, "schema", [{"validator": "type", "path": "arguments",
                                           "message": "arguments are not a JSON object", "expected": "object",
                                           "value": args, "stringified": False}])
    errors = validate_arguments(args, schema.get("parameters") or {"type": "object"})
    if not errors:
        return CallCheck(True, None, [], args)
    mechanism = "T1" if any(e["validator"] == "type" for e in errors) else "schema"
    return CallCheck(False, mechanism, errors, args)


_DECISION_RE = re.compile(r"\b(CALL|ANSWER)\b", re.IGNORECASE)


def parse_decision(text: str) -> str | None:
    """The stage-one decision of the two-stage protocol: "call", "answer", or None (T3) when the reply names
    neither or both."""
    found = {m.group(1).lower() for m in _DECISION_RE.finditer(text)}
    return found.pop() if len(found) == 1 else None


def check_schema(schema: Any, *, path: str, row: str) -> None:
    """Refuse a tool schema that is not ToolHop-shaped or whose parameters are not a valid JSON Schema."""
    if not isinstance(schema, dict):
        raise BenchmarkDataError("tool schema must be an object", path=path, row=row, field="schema")
    for key, kind in (("name", str), ("description", str), ("parameters", dict)):
        if not isinstance(schema.get(key), kind):
            raise BenchmarkDataError(f"needs {key!r} ({kind.__name__})", path=path, row=row, field=key)
    params = schema["parameters"]
    if params.get("type") != "object" or not isinstance(params.get("properties"), dict):
        raise BenchmarkDataError("parameters must be an object schema with properties", path=path, row=row,
                                 field="parameters")
    missing = [r for r in params.get("required", []) if r not in params["properties"]]
    if missing:
        raise BenchmarkDataError(f"required names unknown properties {missing}", path=path, row=row,
                                 field="parameters.required")
    try:
        Draft202012Validator.check_schema(params)
    except SchemaError as exc:
        raise BenchmarkDataError(f"not a valid JSON Schema: {exc.message}", path=path, row=row,
                                 field="parameters") from None
